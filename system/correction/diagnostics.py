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
Pearson merges per-response centred moments (``pearson``), so a constant input gives
exactly zero variance. The median selects two order statistics without sorting
(``median_kernel`` on CPU, ``reductions.kth_smallest`` elsewhere). An empty batch gives
counts 0 and ``None`` for every float statistic, never NaN.

Accuracy, measured against a long-double evaluation of the spec's formulas on float32
batches of 256 x 1024 tokens (``tests/test_correction_kernels.py`` checks the same bounds
more loosely): at most 1.2e-15 relative for every key, on realistic batches (kl_k2 5e-4 and
8e-3) and on the compressed regime (kl_k1 4.4), except ``prob_abs_diff_mean`` there: 3.6e-11,
from the tokens beyond the +-20 clamp (``row_sums``). The previous implementation (float64
tensors, no fused pass) measured 3e-14 at worst.

Shapes: B = responses in the batch, T = padded response length.
"""

import numpy as np
import torch

from system.correction.median_kernel import abs_d_order_statistics
from system.correction.pearson import pearson_from_rows
from system.correction.ratios import (
    LOG_RATIO_CLAMP,
    LogRatios,
    compute_log_ratios,
    select_sequences,
)
from system.correction.reductions import median_of_nonnegative
from system.correction.row_sums import COL, SUMMED_COLUMNS

DIAGNOSTIC_KEYS: tuple[str, ...] = (
    "n_sequences", "n_tokens", "nonfinite_tokens",
    "kl_k1", "kl_k2", "kl_k3", "chi2_token", "chi2_seq", "logp_pearson",
    "abs_diff_mean", "abs_diff_median", "abs_diff_max", "prob_abs_diff_mean",
    "frac_outside_2x", "frac_outside_5x", "ess_token", "ess_seq",
)  # fmt: skip
"""The keys of ``compute_diagnostics``, in the order of spec section 1."""

_MEANS = {  # key: (column, scale), the mean is scale * (column total) / n
    "kl_k1": ("sum_d", -1.0),
    "kl_k2": ("sum_dc_sq", 0.5),
    "kl_k3": ("sum_k3", 1.0),
    "chi2_token": ("sum_chi2", 1.0),
    "abs_diff_mean": ("sum_abs_d", 1.0),
    "prob_abs_diff_mean": ("sum_prob_gap", 1.0),
    "frac_outside_2x": ("num_out_2x", 1.0),
    "frac_outside_5x": ("num_out_5x", 1.0),
}


def _token_statistics(rows_NK: np.ndarray, n: int) -> dict[str, float]:
    """Every token mean, ess_token and the max |d|, from the column totals."""
    totals = dict(
        zip(SUMMED_COLUMNS, rows_NK[:, : len(SUMMED_COLUMNS)].sum(0).tolist(), strict=True)
    )
    out = {key: 0.0 + scale * totals[col] / n for key, (col, scale) in _MEANS.items()}  # no -0.0
    sum_rho, sum_rho_sq = totals["sum_rho"], totals["sum_rho_sq"]
    out["ess_token"] = min(sum_rho**2 / (n * sum_rho_sq), 1.0)  # <= 1 up to rounding
    out["abs_diff_max"] = float(rows_NK[:, COL["max_abs_d"]].max())
    return out


def _sequence_statistics(rows_NK: np.ndarray) -> dict[str, float]:
    """chi2 and ESS of rho_seq = exp(clamp(L, -20, 20)) over the non-empty responses."""
    log_rho_seq_N = np.clip(rows_NK[:, COL["sum_dc"]], -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho_seq_N = np.exp(log_rho_seq_N)
    n_seq = rows_NK.shape[0]
    ess = float(rho_seq_N.sum() ** 2 / (n_seq * np.square(rho_seq_N).sum()))
    return {
        "chi2_seq": float(np.expm1(2.0 * log_rho_seq_N).sum() / n_seq),
        "ess_seq": min(ess, 1.0),  # <= 1 up to rounding; rho_seq > 0, so never 0 / 0
    }


def _abs_diff_median(ratios: LogRatios, n: int) -> float:
    """numpy's median of |d| over the valid tokens."""
    if ratios.cpu_arrays is None:
        return median_of_nonnegative(ratios.d_BT.abs(), n)
    ranks = [(n + 1) // 2] if n % 2 == 1 else [n // 2, n // 2 + 1]
    values = abs_d_order_statistics(*ratios.cpu_arrays, ranks)
    return sum(values) / len(values)


def compute_diagnostics(ratios: LogRatios) -> dict[str, float | int | None]:
    """The spec section 1 diagnostics of one batch as JSON-ready python numbers."""
    rows_BK = ratios.sums_BK.cpu().numpy()  # no copy on CPU; [B, K] only, from a device
    rows_NK = rows_BK[rows_BK[:, COL["num_valid"]] >= 1]
    n = int(rows_NK[:, COL["num_valid"]].sum())
    out: dict[str, float | int | None] = dict.fromkeys(DIAGNOSTIC_KEYS)
    out.update(n_sequences=rows_NK.shape[0], n_tokens=n, nonfinite_tokens=ratios.nonfinite_tokens)
    if n == 0:
        return out
    out.update(_token_statistics(rows_NK, n))
    out["abs_diff_median"] = _abs_diff_median(ratios, n)
    out["logp_pearson"] = pearson_from_rows(rows_NK)
    out.update(_sequence_statistics(rows_NK))
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
