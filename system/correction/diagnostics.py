"""Train-inference mismatch diagnostics of one batch, overall and per lag (spec section 1).

Means over the n valid tokens (d = old - mu raw, dc clamped, rho = exp(dc)):

    kl_k1 = mean(-d)            kl_k2 = mean(dc**2 / 2)          kl_k3 = mean(rho - 1 - dc)
    chi2_token = mean(rho**2) - 1                chi2_seq = mean_i(rho_seq_i**2) - 1
    logp_pearson = corr(mu, old), population moments, None if either is constant
    abs_diff_{mean,median,max} of |d|            prob_abs_diff_mean = mean |exp(old) - exp(mu)|
    frac_outside_{2x,5x} = mean(|d| > log {2,5})
    ess_token = (sum rho)**2 / (n sum rho**2)    ess_seq = the same on rho_seq over sequences

Numerics: every per-token term is summed once per response in float64 (``row_sums``: a
fused numba pass on CPU, torch elsewhere; ``rho - 1`` is ``expm1(dc)``, no rounding of
``exp`` near 1 when d is tiny); a batch, or a subset of its responses, adds up its rows.
Pearson merges per-response centred moments (Chan et al.'s pairwise update), so a constant
input gives exactly zero variance. The median selects two order statistics without sorting
(``median_kernel`` on CPU, ``reductions.kth_smallest`` elsewhere). An empty batch gives
counts 0 and ``None`` for every float statistic, never NaN.

Shapes: B = responses in the batch, T = padded response length.
"""

import math

import torch

from system.correction.median_kernel import abs_d_order_statistics
from system.correction.ratios import (
    LOG_RATIO_CLAMP,
    LogRatios,
    compute_log_ratios,
    select_sequences,
)
from system.correction.reductions import as_float, ess_fraction, median_of_nonnegative
from system.correction.row_sums import COL, SUMMED_COLUMNS

DIAGNOSTIC_KEYS: tuple[str, ...] = (
    "n_sequences", "n_tokens", "nonfinite_tokens",
    "kl_k1", "kl_k2", "kl_k3", "chi2_token", "chi2_seq", "logp_pearson",
    "abs_diff_mean", "abs_diff_median", "abs_diff_max", "prob_abs_diff_mean",
    "frac_outside_2x", "frac_outside_5x", "ess_token", "ess_seq",
)  # fmt: skip
"""The keys of ``compute_diagnostics``, in the order of spec section 1."""

_MEANS = {  # key: (column, scale) -> scale * column total / n
    "kl_k1": ("sum_d", -1.0),
    "kl_k2": ("sum_dc_sq", 0.5),
    "kl_k3": ("sum_k3", 1.0),
    "chi2_token": ("sum_chi2", 1.0),
    "abs_diff_mean": ("sum_abs_d", 1.0),
    "prob_abs_diff_mean": ("sum_prob_gap", 1.0),
    "frac_outside_2x": ("num_out_2x", 1.0),
    "frac_outside_5x": ("num_out_5x", 1.0),
}


def _token_statistics(ratios: LogRatios, n: int) -> dict[str, float]:
    """Every token mean, ess_token and the max |d| from the column totals (one transfer)."""
    sums_BK = ratios.sums_BK
    totals = sums_BK[:, : len(SUMMED_COLUMNS)].sum(0)
    max_abs_d = sums_BK[:, COL["max_abs_d"]].max()
    *values, max_abs_d = torch.cat([totals, max_abs_d[None]]).tolist()
    totals = dict(zip(SUMMED_COLUMNS, values, strict=True))
    out = {key: 0.0 + scale * totals[col] / n for key, (col, scale) in _MEANS.items()}  # no -0.0
    sum_rho, sum_rho_sq = totals["sum_rho"], totals["sum_rho_sq"]
    out["ess_token"] = min(sum_rho**2 / (n * sum_rho_sq), 1.0)  # <= 1 up to rounding
    out["abs_diff_max"] = max_abs_d
    return out


def _abs_diff_median(ratios: LogRatios, n: int) -> float:
    """numpy's median of |d| over the valid tokens."""
    if ratios.cpu_arrays is None:
        return median_of_nonnegative(ratios.d_BT.abs(), n)
    ranks = [(n + 1) // 2] if n % 2 == 1 else [n // 2, n // 2 + 1]
    values = abs_d_order_statistics(*ratios.cpu_arrays, n, ranks)
    return sum(values) / len(values)


def _pearson(ratios: LogRatios) -> float | None:
    """Pearson correlation of mu and old over valid tokens; None if either is constant.

    Per response i (n_i tokens, sums of y = x - ref_i): mean_i = ref_i + S_i / n_i and centred
    moments M_i = S(y y') - S(y) S(y') / n_i; merged: M = sum_i M_i + sum_i n_i (mean_i - mean)(mean'_i - mean').
    """
    rows_BK = ratios.sums_BK[ratios.seq_valid_B]
    n_B = rows_BK[:, COL["num_valid"]]
    col = {name: rows_BK[:, COL[name]] for name in ("sum_mu", "sum_old", "ref_mu", "ref_old")}
    mean_mu_B = col["ref_mu"] + col["sum_mu"] / n_B
    mean_old_B = col["ref_old"] + col["sum_old"] / n_B
    dev_mu_B = mean_mu_B - (n_B * mean_mu_B).sum() / n_B.sum()
    dev_old_B = mean_old_B - (n_B * mean_old_B).sum() / n_B.sum()
    moments = torch.stack([
        (rows_BK[:, COL["sum_mu_sq"]] - col["sum_mu"] ** 2 / n_B + n_B * dev_mu_B**2).sum(),
        (rows_BK[:, COL["sum_old_sq"]] - col["sum_old"] ** 2 / n_B + n_B * dev_old_B**2).sum(),
        (rows_BK[:, COL["sum_mu_old"]] - col["sum_mu"] * col["sum_old"] / n_B + n_B * dev_mu_B * dev_old_B).sum(),
        rows_BK[:, COL["num_mu_moves"]].sum() + (col["ref_mu"] != col["ref_mu"][0]).sum(),
        rows_BK[:, COL["num_old_moves"]].sum() + (col["ref_old"] != col["ref_old"][0]).sum(),
    ])  # fmt: skip
    var_mu, var_old, cov, moves_mu, moves_old = moments.tolist()
    if moves_mu == 0 or moves_old == 0 or var_mu <= 0.0 or var_old <= 0.0:
        return None
    return max(-1.0, min(1.0, cov / (math.sqrt(var_mu) * math.sqrt(var_old))))


def _sequence_statistics(ratios: LogRatios, n_seq: int) -> dict[str, float | None]:
    """chi2 and ESS of the sequence ratios over the n_seq >= 1 non-empty responses."""
    log_rho_seq_B = ratios.seq_logratio_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    chi2_B = torch.where(ratios.seq_valid_B, torch.expm1(2.0 * log_rho_seq_B), 0.0)
    rho_seq_B = torch.where(ratios.seq_valid_B, ratios.rho_seq_B, 0.0)
    return {
        "chi2_seq": as_float(chi2_B.sum() / n_seq),
        "ess_seq": ess_fraction(rho_seq_B, n_seq),
    }


def compute_diagnostics(ratios: LogRatios) -> dict[str, float | int | None]:
    """The spec section 1 diagnostics of one batch as JSON-ready python numbers."""
    n = ratios.num_tokens
    n_seq = ratios.num_sequences
    out: dict[str, float | int | None] = dict.fromkeys(DIAGNOSTIC_KEYS)
    out.update(n_sequences=n_seq, n_tokens=n, nonfinite_tokens=ratios.nonfinite_tokens)
    if n == 0:
        return out
    out.update(_token_statistics(ratios, n))
    out["abs_diff_median"] = _abs_diff_median(ratios, n)
    out["logp_pearson"] = _pearson(ratios)
    out.update(_sequence_statistics(ratios, n_seq))
    return out


def diagnostics_by_lag(
    behaviour_logp_BT, proximal_logp_BT, mask_BT, lag_B
) -> dict[str, dict[str, float | int | None]]:
    """``compute_diagnostics`` restricted to the responses of each lag, keyed ``str(lag)``, sorted by lag."""
    ratios = compute_log_ratios(behaviour_logp_BT, proximal_logp_BT, mask_BT)
    return diagnostics_by_lag_of(ratios, lag_B)


def diagnostics_by_lag_of(ratios: LogRatios, lag_B) -> dict[str, dict[str, float | int | None]]:
    """``diagnostics_by_lag`` on ratios already computed (no recompute of the log-ratios)."""
    lag_B = torch.as_tensor(lag_B, device=ratios.valid_BT.device)
    if lag_B.shape != ratios.num_valid_B.shape:
        raise ValueError(
            f"lag has shape {tuple(lag_B.shape)} but the batch has {ratios.num_valid_B.numel()} responses"
        )
    if lag_B.is_floating_point() or lag_B.is_complex() or lag_B.dtype == torch.bool:
        raise ValueError(f"lag must be an integer tensor, got {lag_B.dtype}")
    return {
        str(lag): compute_diagnostics(select_sequences(ratios, lag_B == lag))
        for lag in sorted(torch.unique(lag_B).tolist())
    }
