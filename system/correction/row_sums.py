"""Per-response sums of every per-token term of the diagnostics, in float64 (spec sections 0-1).

One row of ``sums_BK`` per response i, over its valid tokens (d = old - mu, dc = clamp(d, -20, 20),
e = expm1(dc), rho = exp(dc); y_mu = mu - ref_mu and y_old = old - ref_old):

    num_valid = T_i          num_nonfinite: masked-in tokens with a non-finite mu or old
    sum_dc = L_i             sum_d, sum_dc_sq (dc**2), sum_abs_d, sum_rho, sum_rho_sq
    sum_k3 = sum(e - dc)     sum_chi2 = sum(e * (e + 2)) = sum(rho**2 - 1)
    num_out_2x, num_out_5x   tokens with |d| > log 2, > log 5
    sum_prob_gap = sum |exp(old) - exp(mu)| = sum exp(mu) |e|   (exp(old) (1 - e^-20) if d > 20)
    sum_mu, sum_mu_sq, sum_old, sum_old_sq, sum_mu_old   of y_mu and y_old
    num_mu_moves, num_old_moves                          tokens with y_mu != 0, y_old != 0
    max_abs_d, min_d         (0 and +inf for a response without a valid token)
    ref_mu, ref_old          the response's first valid (mu, old); 0 without one

``e - dc`` and ``e * (e + 2)`` avoid rounding ``exp(dc)`` near 1 when d is tiny. The gap is
exact algebra while |d| <= 20 (exp(old) - exp(mu) = exp(mu) expm1(d)); beyond the clamp,
1 - exp(-|d|) is replaced by 1 - exp(-20), a relative error below 2.1e-9 on that token only.
The Pearson sums are shifted by a value of their own response, so a constant input gives
exact zeros; ``diagnostics`` merges them across responses.

A subset of responses sums its rows, so per-lag diagnostics need no recompute. This module
is the reference implementation, in torch on any device; ``row_sums_kernel`` computes the
same columns in one fused pass on CPU.

Shapes: B = responses, T = padded length, K = ``len(COLUMNS)``.
"""

import math

import numpy as np
import torch

LOG_RATIO_CLAMP = 20.0
"""Per-token (and per-sequence, for ``rho_seq``) clamp of the log-ratio before ``exp``."""
LOG_2 = math.log(2.0)
LOG_5 = math.log(5.0)

SUMMED_COLUMNS: tuple[str, ...] = (
    "num_valid", "num_nonfinite", "sum_dc", "sum_d", "sum_dc_sq", "sum_k3", "sum_chi2",
    "sum_rho", "sum_rho_sq", "sum_abs_d", "num_out_2x", "num_out_5x", "sum_prob_gap",
    "sum_mu", "sum_mu_sq", "sum_old", "sum_old_sq", "sum_mu_old", "num_mu_moves",
    "num_old_moves",
)  # fmt: skip
"""The columns that are sums over tokens (a subset of responses adds them up)."""
COLUMNS: tuple[str, ...] = (*SUMMED_COLUMNS, "max_abs_d", "min_d", "ref_mu", "ref_old")
"""The columns of ``sums_BK``, in order."""
COL = {name: k for k, name in enumerate(COLUMNS)}
"""Column index by name."""


def valid_masks_BT(mu_BT: torch.Tensor, old_BT: torch.Tensor, in_mask_BT: torch.Tensor):
    """(valid, non-finite masked-in) tokens. In float64 the difference of two finite float32
    log-probs is finite, and it is not whenever either operand is not: one test finds both."""
    finite_BT = (old_BT.double() - mu_BT.double()).abs() < math.inf  # False for NaN and +-inf
    return in_mask_BT & finite_BT, in_mask_BT & ~finite_BT


def _token_columns(mu_BT, old_BT, valid_BT, nonfinite_BT) -> list[torch.Tensor]:
    d_BT = old_BT - mu_BT
    dc_BT = d_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    e_BT = torch.expm1(dc_BT)
    rho_BT = torch.where(valid_BT, dc_BT.exp(), 0.0)
    abs_d_BT = d_BT.abs()
    beyond_BT = d_BT > LOG_RATIO_CLAMP
    gap_BT = torch.where(beyond_BT, old_BT, mu_BT).exp() * torch.where(
        beyond_BT, -math.expm1(-LOG_RATIO_CLAMP), e_BT.abs()
    )
    return [
        valid_BT.sum(1), nonfinite_BT.sum(1), dc_BT.sum(1), d_BT.sum(1), dc_BT.square().sum(1),
        (e_BT - dc_BT).sum(1), (e_BT * (e_BT + 2.0)).sum(1), rho_BT.sum(1),
        rho_BT.square().sum(1), abs_d_BT.sum(1), (abs_d_BT > LOG_2).sum(1),
        (abs_d_BT > LOG_5).sum(1), gap_BT.sum(1),
    ]  # fmt: skip


def _pearson_columns(mu_BT, old_BT, valid_BT) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    first_B1 = valid_BT.to(torch.uint8).argmax(dim=1, keepdim=True)  # 0 for an empty row
    ref_mu_B = torch.where(valid_BT.any(1), mu_BT.gather(1, first_B1)[:, 0], 0.0)
    ref_old_B = torch.where(valid_BT.any(1), old_BT.gather(1, first_B1)[:, 0], 0.0)
    y_mu_BT = torch.where(valid_BT, mu_BT - ref_mu_B[:, None], 0.0)
    y_old_BT = torch.where(valid_BT, old_BT - ref_old_B[:, None], 0.0)
    sums = [
        y_mu_BT.sum(1), y_mu_BT.square().sum(1), y_old_BT.sum(1), y_old_BT.square().sum(1),
        (y_mu_BT * y_old_BT).sum(1), (y_mu_BT != 0).sum(1), (y_old_BT != 0).sum(1),
    ]  # fmt: skip
    return sums, [ref_mu_B, ref_old_B]


def row_sums_torch(mu_BT, old_BT, valid_BT, nonfinite_BT) -> torch.Tensor:
    """``sums_BK`` (float64 [B, K]) from float64 log-probs that are 0 where not valid."""
    if mu_BT.shape[1] == 0:  # one column, not valid, so that every row reduction is defined
        mu_BT, old_BT, valid_BT, nonfinite_BT = (
            x.new_zeros(x.shape[0], 1) for x in (mu_BT, old_BT, valid_BT, nonfinite_BT)
        )
    sums = _token_columns(mu_BT, old_BT, valid_BT, nonfinite_BT)
    pearson_sums, refs = _pearson_columns(mu_BT, old_BT, valid_BT)
    d_BT = old_BT - mu_BT
    max_abs_d_B = d_BT.abs().amax(1)  # 0 where not valid
    min_d_B = torch.where(valid_BT, d_BT, math.inf).amin(1)
    columns = [*sums, *pearson_sums, max_abs_d_B, min_d_B, *refs]
    return torch.stack([c.to(torch.float64) for c in columns], dim=1)


def row_fields(sums_BK: torch.Tensor) -> dict:
    """T_i, L_i, rho_seq_i and the non-finite counts (``LogRatios``' per-response fields) from
    the row sums; numpy on CPU, where it takes fewer microseconds than torch on [B] arrays."""
    if sums_BK.device.type != "cpu":
        num_valid_B = sums_BK[:, COL["num_valid"]].to(torch.int64)
        nonfinite_B = sums_BK[:, COL["num_nonfinite"]].to(torch.int64)
        seq_logratio_B = sums_BK[:, COL["sum_dc"]].contiguous()
        rho_seq_B = seq_logratio_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        nonfinite_tokens = int(nonfinite_B.sum().item())
    else:
        sums_np = sums_BK.numpy()
        num_valid_B = torch.from_numpy(sums_np[:, COL["num_valid"]].astype(np.int64))
        nonfinite_np = sums_np[:, COL["num_nonfinite"]].astype(np.int64)
        nonfinite_B = torch.from_numpy(nonfinite_np)
        seq_logratio_np = np.ascontiguousarray(sums_np[:, COL["sum_dc"]])
        seq_logratio_B = torch.from_numpy(seq_logratio_np)
        rho_seq_B = torch.from_numpy(
            np.exp(np.clip(seq_logratio_np, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        )
        nonfinite_tokens = int(nonfinite_np.sum())
    return {
        "num_valid_B": num_valid_B, "seq_valid_B": num_valid_B >= 1,
        "seq_logratio_B": seq_logratio_B, "rho_seq_B": rho_seq_B,
        "nonfinite_tokens": nonfinite_tokens, "nonfinite_B": nonfinite_B,
    }  # fmt: skip
