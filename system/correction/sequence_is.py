"""Sequence-level importance weights: seq-tis, seq-mis and geo-rs (spec section 2).

With L_i = sum_t dc (the unclamped sum) and rho_seq_i = exp(clamp(L_i, -20, 20)):

    seq-tis:  w_i = min(rho_seq_i, C)                                        [C = 2]
    seq-mis:  w_i = rho_seq_i if L_i <= log hi (and L_i >= log lo) else 0    [hi = 3, lo unset]
    geo-rs:   w_i = 1 if log lo <= L_i / T_i <= log hi else 0                [lo = 0.999, hi = 1.001]

Thresholds are compared in log space against L_i itself, never against the clamped
rho_seq_i, so the ±20 clamp never changes a decision; the thresholds are at the inputs'
precision (``log_threshold``). Each function returns one float64 weight per response ([B]);
empty responses get 0. Every token of response i carries w_i.

Shapes: the README's suffix legend (B responses).
"""

import torch

from system.config.correction import GeoRS, SeqMIS, SeqTIS
from system.correction.ratios import LogRatios, log_threshold


def seq_tis_weights_B(ratios: LogRatios, method: SeqTIS) -> torch.Tensor:
    """Truncated sequence ratio ``min(rho_seq, C)``."""
    return torch.where(ratios.seq_valid_B, ratios.rho_seq_B.clamp(max=method.c), 0.0)


def seq_mis_keep_B(ratios: LogRatios, method: SeqMIS) -> torch.Tensor:
    """seq-mis's decision: the response is a sequence and ``log lo <= L <= log hi`` (one-sided when lo is unset)."""
    log_ratio_B = ratios.seq_logratio_B
    keep_B = ratios.seq_valid_B & (log_ratio_B <= log_threshold(method.hi, ratios.weight_dtype))
    if method.lo is not None:
        keep_B &= log_ratio_B >= log_threshold(method.lo, ratios.weight_dtype)
    return keep_B


def seq_mis_weights_B(ratios: LogRatios, method: SeqMIS) -> torch.Tensor:
    """Sequence ratio if ``log lo <= L <= log hi``, else 0 (one-sided when lo is unset)."""
    return torch.where(seq_mis_keep_B(ratios, method), ratios.rho_seq_B, 0.0)


def geo_rs_keep_B(ratios: LogRatios, method: GeoRS) -> torch.Tensor:
    """geo-rs's decision: the response is a sequence and ``log lo <= L / T <= log hi``."""
    mean_log_ratio_B = ratios.seq_logratio_B / ratios.num_valid_B.clamp(min=1)
    return (
        ratios.seq_valid_B
        & (mean_log_ratio_B >= log_threshold(method.lo, ratios.weight_dtype))
        & (mean_log_ratio_B <= log_threshold(method.hi, ratios.weight_dtype))
    )


def geo_rs_weights_B(ratios: LogRatios, method: GeoRS) -> torch.Tensor:
    """1 if the geometric-mean log-ratio ``L / T`` lies in ``[log lo, log hi]``, else 0."""
    return geo_rs_keep_B(ratios, method).to(torch.float64)
