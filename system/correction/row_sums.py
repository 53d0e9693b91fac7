"""Per-response sums of every per-token term the diagnostics need, in float64 (spec sections 0-1).

One row of ``sums_BK`` per response i, over its valid tokens t (d = old - mu, dc = clamp(d, -20, 20),
e = expm1(dc), rho = exp(dc)):

    num_valid = T_i          num_nonfinite = masked-in tokens with a non-finite mu or old
    sum_dc = L_i             sum_d, sum_dc_sq (dc**2), sum_abs_d, sum_rho, sum_rho_sq
    sum_k3 = sum(e - dc)     sum_chi2 = sum(e * (e + 2)) = sum(rho**2 - 1)
    max_abs_d, min_d         (0 and +inf for a response without a valid token)
    num_out_2x, num_out_5x   tokens with |d| > log 2, > log 5
    sum_prob_gap = sum |exp(old) - exp(mu)|, as exp(max(mu, old)) * |e| / max(1, rho)
    ref_mu, ref_old          the response's first valid (mu, old); 0 without one
    sum_mu, sum_mu_sq, sum_old, sum_old_sq, sum_mu_old   of y_mu = mu - ref_mu, y_old = old - ref_old
    num_mu_moves, num_old_moves                          tokens with y_mu != 0, y_old != 0

``e - dc`` and ``e * (e + 2)`` avoid the rounding of ``exp(dc)`` near 1 for tiny d. The
probability gap is exact algebra for |d| <= 20: exp(max) (1 - exp(-|d|)) and
1 - exp(-|d|) = |e| / max(1, rho); beyond the clamp it is off by a relative exp(-20) = 2e-9
at most, on that token only. The Pearson sums are shifted by a value of the response so
that a constant input gives exact zeros; ``combine_moments`` merges them across responses.

Sums over a subset of responses are sums over their rows, so per-lag diagnostics need no
recompute. This module is the reference implementation, in torch on any device;
``row_sums_kernel`` computes the same columns in one fused pass on CPU.

Shapes: B = responses, T = padded length, K = ``len(COLUMNS)``.
"""

import math

import torch

LOG_RATIO_CLAMP = 20.0
"""Per-token (and per-sequence, for ``rho_seq``) clamp of the log-ratio before ``exp``."""
COLUMNS: tuple[str, ...] = (
    "num_valid", "num_nonfinite", "sum_dc", "sum_d", "sum_dc_sq", "sum_k3", "sum_chi2",
    "sum_rho", "sum_rho_sq", "sum_abs_d", "max_abs_d", "min_d", "num_out_2x", "num_out_5x",
    "sum_prob_gap", "ref_mu", "ref_old", "sum_mu", "sum_mu_sq", "sum_old", "sum_old_sq",
    "sum_mu_old", "num_mu_moves", "num_old_moves",
)  # fmt: skip
"""The columns of ``sums_BK``, in order."""
COL = {name: k for k, name in enumerate(COLUMNS)}
"""Column index by name."""

LOG_2 = math.log(2.0)
LOG_5 = math.log(5.0)


def valid_mask_BT(mu_BT: torch.Tensor, old_BT: torch.Tensor, in_mask_BT: torch.Tensor):
    """(valid, non-finite masked-in) tokens. In float64 the difference of two finite float32
    log-probs is finite and it is not whenever either operand is not: one test finds both."""
    finite_BT = (old_BT.double() - mu_BT.double()).abs() < math.inf  # False for NaN and +-inf
    return in_mask_BT & finite_BT, in_mask_BT & ~finite_BT


def _pearson_columns(mu_BT, old_BT, valid_BT) -> list[torch.Tensor]:
    first_B1 = valid_BT.to(torch.uint8).argmax(dim=1, keepdim=True)  # 0 for an empty row: ref 0
    ref_mu_B1 = mu_BT.gather(1, first_B1)
    ref_old_B1 = old_BT.gather(1, first_B1)
    y_mu_BT = torch.where(valid_BT, mu_BT - ref_mu_B1, 0.0)
    y_old_BT = torch.where(valid_BT, old_BT - ref_old_B1, 0.0)
    return [
        ref_mu_B1[:, 0], ref_old_B1[:, 0],
        y_mu_BT.sum(1), y_mu_BT.square().sum(1), y_old_BT.sum(1), y_old_BT.square().sum(1),
        (y_mu_BT * y_old_BT).sum(1), (y_mu_BT != 0).sum(1), (y_old_BT != 0).sum(1),
    ]  # fmt: skip


def row_sums_torch(mu_BT: torch.Tensor, old_BT: torch.Tensor, valid_BT, nonfinite_BT):
    """``sums_BK`` (float64, [B, K]) from the float64 log-probs zeroed where not valid."""
    if mu_BT.shape[1] == 0:  # one padding column, so that max and min are defined
        mu_BT, old_BT = mu_BT.new_zeros(mu_BT.shape[0], 1), old_BT.new_zeros(old_BT.shape[0], 1)
        valid_BT, nonfinite_BT = valid_BT.new_zeros(valid_BT.shape[0], 1), nonfinite_BT.new_zeros(valid_BT.shape[0], 1)
    d_BT = old_BT - mu_BT
    dc_BT = d_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    e_BT = torch.expm1(dc_BT)
    rho_BT = torch.where(valid_BT, dc_BT.exp(), 0.0)
    abs_d_BT = d_BT.abs()
    gap_BT = torch.maximum(mu_BT, old_BT).exp() * e_BT.abs() / dc_BT.exp().clamp(min=1.0)
    columns = [
        valid_BT.sum(1), nonfinite_BT.sum(1), dc_BT.sum(1), d_BT.sum(1), dc_BT.square().sum(1),
        (e_BT - dc_BT).sum(1), (e_BT * (e_BT + 2.0)).sum(1), rho_BT.sum(1),
        rho_BT.square().sum(1), abs_d_BT.sum(1), abs_d_BT.amax(1),
        torch.where(valid_BT, d_BT, math.inf).amin(1),
        (abs_d_BT > LOG_2).sum(1), (abs_d_BT > LOG_5).sum(1), gap_BT.sum(1),
    ]  # fmt: skip
    columns += _pearson_columns(mu_BT, old_BT, valid_BT)
    return torch.stack([c.to(torch.float64) for c in columns], dim=1)
