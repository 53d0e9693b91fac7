"""Log-ratios between the learner and the behaviour policy, derived once per batch (spec section 0).

    valid = mask != 0 and mu, old finite        d = old - mu (0 where not valid)
    dc = clamp(d, -20, 20)                      rho = exp(dc) (0 where not valid)
    T_i = sum_t valid                           L_i = sum_t dc        rho_seq_i = exp(clamp(L_i, -20, 20))

Non-finite log-probs are replaced by 0 *before* any arithmetic, so no NaN can leak into a
statistic, a weight or a gradient. (A float64 difference that overflows, possible only for
float64 inputs beyond +-1e308, counts as non-finite too.) Everything here is detached and float64 (the statistics
dtype); weights built from it are handed back in ``weight_dtype``. A threshold ``log x`` (a method's
band, the veto, the diagnostics' 2x / 5x) is compared at the inputs' precision (``log_threshold``).

Shapes: the README's suffix legend (B responses, T response positions).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

LOG_RATIO_CLAMP = 20.0
"""Per-token (and per-sequence, for ``rho_seq``) clamp of the log-ratio before ``exp``."""


def log_threshold(x: float, dtype: torch.dtype) -> float:
    """``log x`` as the inputs hold it: rounded to ``dtype`` (a ``LogRatios.weight_dtype``, float32 or
    float64) and back. The log-ratios are float64 differences of the inputs, so a float32 difference
    that equals float32's ``log x`` (a value at the threshold as float32 holds it, e.g. ``mu = 0``,
    ``old = log 3``) meets the threshold as it would in float32 arithmetic, instead of lying beyond
    it by the rounding of ``log x``. The threshold moves by at most half a float32 ulp (3e-8 relative);
    float64 inputs compare against ``math.log(x)`` itself."""
    return float(torch.tensor(math.log(x), dtype=torch.float64).to(dtype))


@dataclass(frozen=True)
class LogRatios:
    """Everything the diagnostics and the weights derive from ``(mu, old, mask)``; all detached."""

    valid_BT: torch.Tensor
    """bool: mask != 0 and both log-probs finite."""
    d_BT: torch.Tensor
    """float64: old - mu, 0 where not valid."""
    dc_BT: torch.Tensor
    """float64: clamp(d, -20, 20), 0 where not valid."""
    rho_BT: torch.Tensor
    """float64: exp(dc) where valid, 0 elsewhere."""
    num_valid_B: torch.Tensor
    """int64: T_i, valid tokens of each response."""
    seq_valid_B: torch.Tensor
    """bool: T_i >= 1 (the response counts as a sequence)."""
    seq_logratio_B: torch.Tensor
    """float64: L_i = sum of dc over valid tokens, 0 for an empty response; not clamped."""
    rho_seq_B: torch.Tensor
    """float64: exp(clamp(L_i, -20, 20)); 1 for an empty response (no token carries it)."""
    nonfinite_tokens: int
    """Masked-in tokens excluded because mu or old was NaN or +-inf."""
    behaviour_BT: torch.Tensor
    """float64: mu where valid, 0 elsewhere."""
    proximal_BT: torch.Tensor
    """float64: old where valid, 0 elsewhere."""
    nonfinite_B: torch.Tensor
    """int64: the non-finite masked-in tokens of each response."""
    weight_dtype: torch.dtype
    """Floating dtype of the inputs promoted to at least float32: the dtype weights are returned in."""

    @property
    def num_tokens(self) -> int:
        """Valid tokens in the batch."""
        return int(self.num_valid_B.sum().item())

    @property
    def num_sequences(self) -> int:
        """Responses with at least one valid token."""
        return int(self.seq_valid_B.sum().item())


def check_inputs(behaviour_BT, proximal_BT, mask_BT) -> torch.dtype:
    """Refuse shape or dtype mismatches (naming the input); the weight dtype: the log-probs' floating
    dtype promoted to at least float32."""
    if behaviour_BT.dim() != 2:
        raise ValueError(f"behaviour_logp must be [B, T], got shape {tuple(behaviour_BT.shape)}")
    for name, t in (("proximal_logp", proximal_BT), ("mask", mask_BT)):
        if t.shape != behaviour_BT.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but behaviour_logp has {tuple(behaviour_BT.shape)}"
            )
    for name, t in (("behaviour_logp", behaviour_BT), ("proximal_logp", proximal_BT)):
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")
    return torch.promote_types(torch.promote_types(behaviour_BT.dtype, proximal_BT.dtype), torch.float32)


def valid_tokens(mask_BT, *logps_BT):
    """Spec section 0's valid tokens: ``m = 1`` and every given log-prob finite (torch or numpy,
    the type of ``mask_BT``). The one definition; ``compute_log_ratios`` computes the same set in
    one pass over ``old - mu`` (non-finite exactly when either operand is)."""
    if isinstance(mask_BT, torch.Tensor):
        valid_BT = mask_BT.bool()
        for logp_BT in logps_BT:
            valid_BT = valid_BT & torch.isfinite(torch.as_tensor(logp_BT, device=valid_BT.device))
        return valid_BT
    valid_BT = np.asarray(mask_BT).astype(bool)
    for logp_BT in logps_BT:
        valid_BT = valid_BT & np.isfinite(np.asarray(logp_BT))
    return valid_BT


def compute_log_ratios(behaviour_logp_BT, proximal_logp_BT, mask_BT) -> LogRatios:
    """Derive every per-token and per-sequence ratio of spec section 0 from ``(mu, old, mask)``.

    Inputs may be torch tensors or numpy arrays; ``mask`` may be bool, integer or float
    (non-zero = response token). Raises ``ValueError`` on shape or dtype mismatch.
    """
    behaviour_BT = torch.as_tensor(behaviour_logp_BT).detach()
    proximal_BT = torch.as_tensor(proximal_logp_BT).detach()
    mask_BT = torch.as_tensor(mask_BT, device=behaviour_BT.device).detach()
    weight_dtype = check_inputs(behaviour_BT, proximal_BT, mask_BT)
    # Fresh float64 copies, zeroed in place where not valid: non-finite values are replaced
    # first, so none survives the product with the mask.
    behaviour64_BT = behaviour_BT.to(torch.float64, copy=True)
    proximal64_BT = proximal_BT.to(torch.float64, copy=True)
    in_mask_BT = mask_BT if mask_BT.dtype == torch.bool else mask_BT != 0
    # In float64 the difference of two finite float32 log-probs is finite, and it is non-finite
    # whenever either operand is: one pass over it finds every excluded token. (The rule is
    # ``valid_tokens``'s, found without its two isfinite passes; a test holds the two token for token.)
    d_BT = proximal64_BT - behaviour64_BT
    finite_BT = d_BT.abs() < float("inf")  # False for NaN and +-inf
    valid_BT = in_mask_BT & finite_BT
    nonfinite_B = (in_mask_BT & ~finite_BT).sum(dim=1)
    valid_f_BT = valid_BT.to(torch.float64)
    for x_BT in (d_BT, behaviour64_BT, proximal64_BT):
        x_BT.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).mul_(valid_f_BT)
    dc_BT = d_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho_BT = dc_BT.exp().mul_(valid_f_BT)
    num_valid_B = valid_BT.sum(dim=1)
    seq_logratio_B = dc_BT.sum(dim=1)
    return LogRatios(
        valid_BT=valid_BT,
        d_BT=d_BT,
        dc_BT=dc_BT,
        rho_BT=rho_BT,
        num_valid_B=num_valid_B,
        seq_valid_B=num_valid_B >= 1,
        seq_logratio_B=seq_logratio_B,
        rho_seq_B=seq_logratio_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp(),
        nonfinite_tokens=int(nonfinite_B.sum().item()),
        behaviour_BT=behaviour64_BT,
        proximal_BT=proximal64_BT,
        nonfinite_B=nonfinite_B,
        weight_dtype=weight_dtype,
    )


def select_sequences(ratios: LogRatios, rows_B: torch.Tensor) -> LogRatios:
    """The ratios of a subset of responses (a bool mask or an index tensor over B), no recompute."""
    rows_B = torch.as_tensor(rows_B, device=ratios.valid_BT.device)
    if rows_B.dtype == torch.bool and rows_B.shape != ratios.num_valid_B.shape:
        raise ValueError(
            f"row mask has shape {tuple(rows_B.shape)} but the batch has {ratios.num_valid_B.numel()} responses"
        )
    nonfinite_B = ratios.nonfinite_B[rows_B]
    return LogRatios(
        valid_BT=ratios.valid_BT[rows_B],
        d_BT=ratios.d_BT[rows_B],
        dc_BT=ratios.dc_BT[rows_B],
        rho_BT=ratios.rho_BT[rows_B],
        num_valid_B=ratios.num_valid_B[rows_B],
        seq_valid_B=ratios.seq_valid_B[rows_B],
        seq_logratio_B=ratios.seq_logratio_B[rows_B],
        rho_seq_B=ratios.rho_seq_B[rows_B],
        nonfinite_tokens=int(nonfinite_B.sum().item()),
        behaviour_BT=ratios.behaviour_BT[rows_B],
        proximal_BT=ratios.proximal_BT[rows_B],
        nonfinite_B=nonfinite_B,
        weight_dtype=ratios.weight_dtype,
    )
