"""Adaptive importance sampling, version 2: one alpha mixing the uncorrected and corrected gradient (spec section 3).

THE ALPHA RULE IS OUR RECONSTRUCTION from the abstract of Zhou et al. (arXiv 2605.13907); the
paper's own estimator is not public. It lives in ``oracle_alpha`` (the surrogate-MSE
estimate) and ``AdaptiveIS`` (the EMA) alone, so it can be replaced. Version 1 (a gate on
severity relative to a warm-up mean) is gone.

Stateless diagnostics of a batch (C = ``config.c`` = 2):

    S (severity)               = mean |dc| over valid tokens
    R (reliability)            = ESS fraction of min(rho_seq_i, C) over sequences
    V (variance_amplification) = population std / mean of min(rho, C) over valid tokens

The oracle alpha. With the method's weight w, its keep mask k (1 where it did not reject; 1
at every valid token for TIS and none; from ``compute_weights_and_keep``) and the advantage
A_i each response carries into the loss, over the n sequences (T_i >= 1):

    d_i       = A_i * (1 / T_i) * sum_t k[i,t] * (w[i,t] - 1)   (corrected minus uncorrected)
    b         = mean_i d_i            s2 = mean_i (d_i - b)**2   (population variance)
    n_eff     = n * R
    noise2    = s2 / max(n_eff, 1)
    b2_plus   = max(b**2 - noise2, 0)                           (debiased squared bias)
    alpha_raw = b2_plus / (b2_plus + noise2)                    (0 when both are 0)
    alpha     = beta * alpha_prev + (1 - beta) * alpha_raw      (beta = 0.5, alpha_0 = 0)

and the applied weight is

    omega[i,t] = k[i,t] * (1 + alpha * (w[i,t] - 1))            (= k * ((1 - alpha) + alpha * w))

so mixing never re-admits a token the method rejected. Logged: ``bias`` = b, ``noise`` =
sqrt(noise2), ``alpha_raw``, ``alpha``. A batch with no sequence gives alpha_raw = 0 and
bias = noise = None; the EMA still takes its step (alpha <- beta * alpha), as the formula
says. With ``per_lag`` the same rule runs within each lag bucket (the sequences of one
``lag``), each bucket with its own EMA (alpha_0 = 0 for a lag not seen before), and each
sequence is mixed with its bucket's alpha; a lag absent from a batch leaves its EMA as it
is. The batch-wide EMA is advanced and logged either way.

Shapes: the README's suffix legend (B responses, T response positions).
"""

import math
from collections.abc import Mapping
from typing import NamedTuple

import torch

from system.config.correction import AISConfig, MethodConfig
from system.correction.methods import compute_weights_and_keep
from system.correction.ratios import LogRatios
from system.correction.reductions import as_float, ess_fraction

STATE_VERSION = 2
"""Version of the AIS rule a state dict belongs to (1 was the S_ref warm-up gate)."""


def reliability(ratios: LogRatios, c: float = 2.0, rows_B: torch.Tensor | None = None) -> float | None:
    """R: ESS fraction of ``min(rho_seq_i, C)`` over the sequences (of ``rows_B`` when given); None if none."""
    seq_B = ratios.seq_valid_B if rows_B is None else ratios.seq_valid_B & rows_B
    seq_weights_B = torch.where(seq_B, ratios.rho_seq_B.clamp(max=c), 0.0)
    return ess_fraction(seq_weights_B, int(seq_B.sum().item()))


def ais_diagnostics(ratios: LogRatios, c: float = 2.0) -> dict[str, float | None]:
    """Severity S, reliability R and variance amplification V of one batch (None if it is empty)."""
    n = ratios.num_tokens
    if n == 0:
        return {"severity": None, "reliability": None, "variance_amplification": None}
    token_weights_BT = ratios.rho_BT.clamp(max=c)  # 0 where not valid
    mean = token_weights_BT.sum() / n
    centred_BT = torch.where(ratios.valid_BT, token_weights_BT - mean, 0.0)
    std = (centred_BT.square().sum() / n).sqrt()
    return {
        "severity": as_float(ratios.dc_BT.abs().sum() / n),
        "reliability": reliability(ratios, c),
        "variance_amplification": as_float(std / mean),
    }


def sequence_deltas(
    ratios: LogRatios, w_BT: torch.Tensor, keep_BT: torch.Tensor, advantages_B
) -> torch.Tensor:
    """d_i = A_i / T_i * sum_t k (w - 1) in float64 [B]; 0 for a response without a valid token.

    Raises ``ValueError`` on a shape mismatch or a non-finite advantage of a sequence.
    """
    device = ratios.valid_BT.device
    w_BT = torch.as_tensor(w_BT, device=device).detach()
    keep_BT = torch.as_tensor(keep_BT, device=device)
    advantages_B = torch.as_tensor(advantages_B, device=device).detach().to(torch.float64)
    shape = tuple(ratios.valid_BT.shape)
    for name, t in (("weights", w_BT), ("keep mask", keep_BT)):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} have shape {tuple(t.shape)} but the batch is {shape}")
    if tuple(advantages_B.shape) != shape[:1]:
        raise ValueError(
            f"advantages must be [B] = [{shape[0]}], got shape {tuple(advantages_B.shape)}"
        )
    seq_B = ratios.seq_valid_B
    if not torch.isfinite(advantages_B[seq_B]).all():
        raise ValueError("advantages must be finite for every response with a valid token")
    kept_BT = keep_BT.to(torch.bool) & ratios.valid_BT
    excess_BT = torch.where(kept_BT, w_BT.to(torch.float64) - 1.0, 0.0)
    mean_excess_B = excess_BT.sum(dim=1) / ratios.num_valid_B.clamp(min=1)
    return torch.where(seq_B, advantages_B.nan_to_num(0.0, 0.0, 0.0) * mean_excess_B, 0.0)


def oracle_alpha(b: float, s2: float, n_eff: float) -> tuple[float, float]:
    """``(noise2, alpha_raw)`` from the mean b and population variance s2 of the d_i and n_eff.

    noise2 = s2 / max(n_eff, 1); b2_plus = max(b**2 - noise2, 0);
    alpha_raw = b2_plus / (b2_plus + noise2), 0 when both are 0.
    """
    noise2 = s2 / max(n_eff, 1.0)
    b2_plus = max(b * b - noise2, 0.0)
    total = b2_plus + noise2
    alpha_raw = b2_plus / total if total > 0.0 else 0.0
    return noise2, min(max(alpha_raw, 0.0), 1.0)


def estimate_alpha(
    ratios: LogRatios,
    w_BT: torch.Tensor,
    keep_BT: torch.Tensor,
    advantages_B,
    c: float = 2.0,
    rows_B: torch.Tensor | None = None,
) -> dict[str, float | None]:
    """``bias`` (b), ``noise`` (sqrt(noise2)) and ``alpha_raw`` of the sequences (of ``rows_B`` when given).

    Stateless. No sequence: bias and noise None, alpha_raw 0.
    """
    return alpha_of_deltas(ratios, sequence_deltas(ratios, w_BT, keep_BT, advantages_B), c, rows_B)


def alpha_of_deltas(
    ratios: LogRatios, d_B: torch.Tensor, c: float = 2.0, rows_B: torch.Tensor | None = None
) -> dict[str, float | None]:
    """``estimate_alpha`` from the batch's ``d_i`` (``sequence_deltas``), computed once for every bucket."""
    seq_B = ratios.seq_valid_B
    if rows_B is not None:
        seq_B = seq_B & torch.as_tensor(rows_B, device=seq_B.device)
    n = int(seq_B.sum().item())
    if n == 0:
        return {"bias": None, "noise": None, "alpha_raw": 0.0}
    d_N = d_B[seq_B]
    b = d_N.mean()
    # alpha_raw does not change when every d_i is scaled, so it is computed from d / max |d_i|: b**2 and
    # s2 of the raw d_i underflow (d ~ 1e-160) or overflow (d ~ 1e160) long before the d_i do
    scale = d_N.abs().max()
    if not (torch.isfinite(scale) and scale > 0):
        scale = torch.ones((), dtype=d_N.dtype, device=d_N.device)
    d_N = d_N / scale
    b_n = d_N.mean()
    noise2_n, alpha_raw = oracle_alpha(as_float(b_n), as_float((d_N - b_n).square().mean()),
                                       n * reliability(ratios, c, seq_B))
    return {"bias": as_float(b), "noise": as_float(scale) * math.sqrt(noise2_n), "alpha_raw": alpha_raw}


def ais_estimate(
    ratios: LogRatios, method: MethodConfig, advantages_B=None, c: float = 2.0
) -> dict[str, float | None]:
    """``estimate_alpha`` for ``method``'s weights and keep mask (the report's ``ais`` keys).

    Without advantages, or with a non-finite advantage at a sequence, every value is None.
    """
    unknown = {"bias": None, "noise": None, "alpha_raw": None}
    if advantages_B is None:
        return unknown
    advantages_B = torch.as_tensor(advantages_B, device=ratios.valid_BT.device)
    if tuple(advantages_B.shape) == tuple(ratios.seq_valid_B.shape) and not torch.isfinite(
        advantages_B[ratios.seq_valid_B]
    ).all():
        return unknown
    w_BT, keep_BT = compute_weights_and_keep(ratios, method, torch.float64)  # w - 1 exact near w = 1
    return estimate_alpha(ratios, w_BT, keep_BT, advantages_B, c)


def mix_weights(w_BT: torch.Tensor, keep_BT: torch.Tensor, alpha) -> torch.Tensor:
    """omega = k * (1 + alpha * (w - 1)), computed as ``(1 - alpha) + alpha * w`` where k is 1, else 0.

    ``alpha`` is a float or a float [B] (one per response). Detached, in ``w_BT``'s dtype;
    at a kept token omega lies between ``min(1, w)`` and ``max(1, w)`` (the clamp guards
    against rounding), with omega = 1 at alpha = 0 and omega = w at alpha = 1 exactly.
    """
    w_BT = torch.as_tensor(w_BT).detach()
    keep_BT = torch.as_tensor(keep_BT, device=w_BT.device)
    if w_BT.shape != keep_BT.shape or w_BT.dim() != 2:
        raise ValueError(
            f"weights {tuple(w_BT.shape)} and keep mask {tuple(keep_BT.shape)} must be the same [B, T]"
        )
    alpha_B = torch.as_tensor(alpha, dtype=torch.float64, device=w_BT.device)
    if alpha_B.dim() == 0:
        alpha_B = alpha_B.expand(w_BT.shape[0])
    if tuple(alpha_B.shape) != tuple(w_BT.shape[:1]):
        raise ValueError(f"alpha must be a float or [B] = [{w_BT.shape[0]}], got {tuple(alpha_B.shape)}")
    if not ((alpha_B >= 0.0) & (alpha_B <= 1.0)).all():
        raise ValueError(f"alpha must lie in [0, 1], got {alpha_B.tolist()}")
    w64_BT = w_BT.to(torch.float64)
    alpha_B1 = alpha_B[:, None]
    omega_BT = (1.0 - alpha_B1) + alpha_B1 * w64_BT
    omega_BT = torch.minimum(torch.maximum(omega_BT, w64_BT.clamp(max=1.0)), w64_BT.clamp(min=1.0))
    return torch.where(keep_BT.to(torch.bool), omega_BT, 0.0).to(w_BT.dtype)


class AISUpdate(NamedTuple):
    """What ``AdaptiveIS.update`` returns: the alpha of every response and the step's metrics."""

    alpha_B: torch.Tensor
    """float64 [B]: the alpha each response is mixed with (its lag bucket's with ``per_lag``)."""
    metrics: dict
    """S, R, V, bias, noise, alpha_raw, alpha; with ``per_lag`` also ``by_lag[lag]`` = bias, noise, alpha_raw, alpha."""


class AdaptiveIS:
    """The AIS state (the alpha EMA, and one per lag with ``per_lag``), advanced once per batch.

    The rule is OUR RECONSTRUCTION of the paper's (see the module docstring).
    ``config.enabled`` is the caller's switch: the state advances either way, so alpha is
    logged before it is applied.
    """

    def __init__(self, config: AISConfig) -> None:
        self.config = config
        self.alpha = 0.0  # the EMA of the batch-wide alpha_raw, alpha_0 = 0
        self.alpha_by_lag: dict[int, float] = {}  # per_lag: the EMA of each lag bucket

    def _ema(self, alpha_prev: float, alpha_raw: float) -> float:
        beta = self.config.beta
        return min(max(beta * alpha_prev + (1.0 - beta) * alpha_raw, 0.0), 1.0)

    def update(
        self,
        ratios: LogRatios,
        w_BT: torch.Tensor,
        keep_BT: torch.Tensor,
        advantages_B,
        lag_B=None,
    ) -> AISUpdate:
        """Advance the state with one batch (the method's w and k, the advantages, the lags)."""
        c = self.config.c
        d_B = sequence_deltas(ratios, w_BT, keep_BT, advantages_B)
        estimate = alpha_of_deltas(ratios, d_B, c)
        self.alpha = self._ema(self.alpha, estimate["alpha_raw"])
        metrics = {**ais_diagnostics(ratios, c), **estimate, "alpha": self.alpha}
        device = ratios.valid_BT.device
        alpha_B = torch.full(ratios.seq_valid_B.shape, self.alpha, dtype=torch.float64, device=device)
        if self.config.per_lag:
            if lag_B is None:
                lag_B = torch.zeros(ratios.seq_valid_B.shape, dtype=torch.int64, device=device)
            lag_B = torch.as_tensor(lag_B, device=device).to(torch.int64)
            if lag_B.shape != ratios.seq_valid_B.shape:
                raise ValueError(
                    f"lag has shape {tuple(lag_B.shape)} but the batch has {ratios.seq_valid_B.numel()} responses"
                )
            by_lag = {}
            for lag in sorted(torch.unique(lag_B[ratios.seq_valid_B]).tolist()):
                rows_B = lag_B == lag
                bucket = alpha_of_deltas(ratios, d_B, c, rows_B)
                alpha = self._ema(self.alpha_by_lag.get(lag, 0.0), bucket["alpha_raw"])
                self.alpha_by_lag[lag] = alpha
                alpha_B[rows_B] = alpha
                by_lag[str(lag)] = {**bucket, "alpha": alpha}
            metrics["by_lag"] = by_lag
        return AISUpdate(alpha_B, metrics)

    def state_dict(self) -> dict:
        """The state as plain, JSON-able python values (lags as string keys)."""
        return {
            "version": STATE_VERSION,
            "alpha": self.alpha,
            "alpha_by_lag": {str(lag): alpha for lag, alpha in sorted(self.alpha_by_lag.items())},
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a state written by ``state_dict``; refuses a state of another AIS rule."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"AIS state of version {state.get('version', 1)} cannot be restored by AIS version "
                f"{STATE_VERSION} (the alpha rule changed; resume with a checkpoint of this version)"
            )
        self.alpha = float(state["alpha"])
        self.alpha_by_lag = {int(lag): float(a) for lag, a in state["alpha_by_lag"].items()}
