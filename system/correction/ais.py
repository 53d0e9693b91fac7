"""Adaptive importance sampling: one per-batch alpha mixing the uncorrected and corrected gradient (spec section 3).

Stateless diagnostics of a batch (C = 2):

    S (severity)               = mean |dc| over valid tokens
    R (reliability)            = ESS fraction of min(rho_seq_i, C) over sequences
    V (variance_amplification) = population std / mean of min(rho, C) over valid tokens

Combination -- OUR RECONSTRUCTION (only the abstract of Zhou et al., arXiv 2605.13907, is
public); it lives in ``AdaptiveIS.update`` alone so it can be replaced:

    S_ref = mean of S over the first K batches; alpha = 0 during them
    gate  = clip((S - S_ref) / ((k_S - 1) * max(S_ref, 1e-8)), 0, 1)
    alpha_raw = gate * R / (1 + V**2)
    alpha = clip(beta * alpha_prev + (1 - beta) * alpha_raw, 0, 1),   alpha_0 = 0

and the per-token weight is ``omega = 1 + alpha * (w - 1)`` at valid tokens, 0 elsewhere.
A batch without a valid token leaves the state untouched.

Shapes: B = responses in the batch, T = padded response length.
"""

from collections.abc import Mapping

import torch

from system.config.correction import AISConfig
from system.correction.ratios import LogRatios
from system.correction.reductions import as_float, ess_fraction


def ais_diagnostics(ratios: LogRatios, c: float = 2.0) -> dict[str, float | None]:
    """Severity S, reliability R and variance amplification V of one batch (None if it is empty)."""
    n = ratios.num_tokens
    if n == 0:
        return {"severity": None, "reliability": None, "variance_amplification": None}
    seq_weights_B = torch.where(ratios.seq_valid_B, ratios.rho_seq_B.clamp(max=c), 0.0)
    token_weights_BT = ratios.rho_BT.clamp(max=c)  # 0 where not valid
    mean = token_weights_BT.sum() / n
    centred_BT = torch.where(ratios.valid_BT, token_weights_BT - mean, 0.0)
    std = (centred_BT.square().sum() / n).sqrt()
    return {
        "severity": as_float(ratios.dc_BT.abs().sum() / n),
        "reliability": ess_fraction(seq_weights_B, ratios.num_sequences),
        "variance_amplification": as_float(std / mean),
    }


class AdaptiveIS:
    """The AIS state (S_ref and the alpha EMA), advanced once per batch by ``update``.

    The combination rule in ``update`` is OUR RECONSTRUCTION of the paper's (see the module
    docstring). ``config.enabled`` is the caller's switch: the state advances either way,
    so alpha can be logged before it is applied.
    """

    def __init__(self, config: AISConfig) -> None:
        self.config = config
        self.num_batches = 0  # batches with at least one valid token seen so far
        self.severity_sum = 0.0  # sum of S over the warm-up batches
        self.s_ref: float | None = None  # set once the K warm-up batches are done
        self.alpha = 0.0  # the EMA of alpha_raw, alpha_0 = 0

    def diagnostics(self, ratios: LogRatios) -> dict[str, float | None]:
        """``ais_diagnostics`` with this config's truncation cap C."""
        return ais_diagnostics(ratios, c=self.config.c)

    def _alpha_raw(
        self, severity: float, reliability: float, variance: float
    ) -> tuple[float, float]:
        """(gate, alpha_raw) of a batch after the warm-up."""
        scale = (self.config.k_s - 1.0) * max(self.s_ref, 1e-8)
        gate = min(max((severity - self.s_ref) / scale, 0.0), 1.0)
        return gate, gate * reliability / (1.0 + variance**2)

    def update(self, diag: Mapping[str, float | None]) -> dict[str, float | None]:
        """Advance the state with one batch's ``ais_diagnostics`` and return alpha and its parts."""
        severity = diag["severity"]
        reliability = diag["reliability"]
        variance = diag["variance_amplification"]
        gate = alpha_raw = 0.0
        if severity is not None:
            self.num_batches += 1
            if self.s_ref is None:
                self.severity_sum += severity
                if self.num_batches == self.config.warmup_batches:
                    self.s_ref = self.severity_sum / self.num_batches
            else:
                gate, alpha_raw = self._alpha_raw(severity, reliability, variance)
                ema = self.config.beta * self.alpha + (1.0 - self.config.beta) * alpha_raw
                self.alpha = min(max(ema, 0.0), 1.0)
        return {
            "alpha": self.alpha,
            "alpha_raw": alpha_raw,
            "gate": gate,
            "severity": severity,
            "reliability": reliability,
            "variance_amplification": variance,
            "s_ref": self.s_ref,
        }

    @staticmethod
    def omega(w_BT: torch.Tensor, valid_BT: torch.Tensor, alpha: float) -> torch.Tensor:
        """``1 + alpha * (w - 1)`` at valid tokens, 0 elsewhere; never above ``max(1, w)``."""
        if w_BT.shape != valid_BT.shape:
            raise ValueError(
                f"weights {tuple(w_BT.shape)} and valid mask {tuple(valid_BT.shape)} differ"
            )
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        w_BT = w_BT.detach()
        omega_BT = 1.0 + alpha * (w_BT - 1.0)
        omega_BT = torch.minimum(omega_BT, w_BT.clamp(min=1.0))  # guards against rounding up
        return torch.where(valid_BT, omega_BT, 0.0)

    def state_dict(self) -> dict:
        """The state as plain, JSON-able python values."""
        return {
            "num_batches": self.num_batches,
            "severity_sum": self.severity_sum,
            "s_ref": self.s_ref,
            "alpha": self.alpha,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a state written by ``state_dict``."""
        self.num_batches = int(state["num_batches"])
        self.severity_sum = float(state["severity_sum"])
        self.s_ref = None if state["s_ref"] is None else float(state["s_ref"])
        self.alpha = float(state["alpha"])
