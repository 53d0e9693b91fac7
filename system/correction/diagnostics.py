"""Train-inference mismatch diagnostics of one batch, overall and per lag (spec section 1).

Means over the n valid tokens (d = old - mu raw, dc clamped, rho = exp(dc)):

    kl_k1 = mean(-d)            kl_k2 = mean(dc**2 / 2)          kl_k3 = mean(rho - 1 - dc)
    chi2_token = mean(rho**2) - 1                chi2_seq = mean_i(rho_seq_i**2) - 1
    logp_pearson = corr(mu, old), population moments, None if either is constant
    abs_diff_{mean,median,max} of |d|            prob_abs_diff_mean = mean |exp(old) - exp(mu)|
    frac_outside_{2x,5x} = mean(|d| > log {2,5})
    ess_token = (sum rho)**2 / (n sum rho**2)    ess_seq = the same on rho_seq over sequences

Numerics: every shared quantity is computed once, in float64, on the [B, T] tensors of
``LogRatios`` (already 0 where not valid, so plain sums are masked sums), with no loop over
sequences and few temporaries. ``rho - 1`` is evaluated as ``expm1(dc)`` (no rounding of
``exp`` near 1 when d is tiny); the median selects two order statistics without sorting
(``reductions.kth_smallest``). An empty batch gives counts 0 and ``None`` for every float
statistic, never NaN.

Shapes: the README's suffix legend (B responses, T response positions).
"""

import math

import torch

from system.correction.ratios import (
    LOG_RATIO_CLAMP,
    LogRatios,
    compute_log_ratios,
    log_threshold,
    select_sequences,
)
from system.correction.reductions import as_float, ess_fraction, median_of_nonnegative

DIAGNOSTIC_KEYS: tuple[str, ...] = (
    "n_sequences", "n_tokens", "nonfinite_tokens",
    "kl_k1", "kl_k2", "kl_k3", "chi2_token", "chi2_seq", "logp_pearson",
    "abs_diff_mean", "abs_diff_median", "abs_diff_max", "prob_abs_diff_mean",
    "frac_outside_2x", "frac_outside_5x", "ess_token", "ess_seq",
)  # fmt: skip
"""The keys of ``compute_diagnostics``, in the order of spec section 1."""


def _dot(x_BT: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor:
    """sum(x * y) without materialising the product."""
    return torch.dot(x_BT.reshape(-1), y_BT.reshape(-1))


def _centred(values_BT: torch.Tensor, valid_f_BT: torch.Tensor, ref: torch.Tensor, n: int):
    """Valid values minus their mean, 0 elsewhere; shifted by a sample value first so that a
    constant input gives exactly 0 (a zero variance) rather than rounding noise."""
    shifted_BT = (values_BT - ref).mul_(valid_f_BT)
    return shifted_BT.sub_(shifted_BT.sum() / n).mul_(valid_f_BT)


def _pearson(ratios: LogRatios, n: int) -> float | None:
    """Pearson correlation of mu and old over valid tokens; None if either has zero variance."""
    row = int(ratios.seq_valid_B.nonzero()[0, 0].item())
    col = int(ratios.valid_BT[row].nonzero()[0, 0].item())
    valid_f_BT = ratios.valid_BT.to(torch.float64)
    behaviour_c_BT = _centred(ratios.behaviour_BT, valid_f_BT, ratios.behaviour_BT[row, col], n)
    proximal_c_BT = _centred(ratios.proximal_BT, valid_f_BT, ratios.proximal_BT[row, col], n)
    var_behaviour, var_proximal, cov = torch.stack(
        [_dot(behaviour_c_BT, behaviour_c_BT), _dot(proximal_c_BT, proximal_c_BT), _dot(behaviour_c_BT, proximal_c_BT)]
    ).tolist()
    if var_behaviour == 0.0 or var_proximal == 0.0:
        return None
    return max(-1.0, min(1.0, cov / (math.sqrt(var_behaviour) * math.sqrt(var_proximal))))


def _log_ratio_means(ratios: LogRatios, n: int) -> dict[str, float]:
    """kl_k1, kl_k2, kl_k3, chi2_token and ess_token.

    With e = expm1(dc) (0 where not valid): rho - 1 - dc = e - dc and rho**2 - 1 = e**2 + 2 e,
    which avoid rounding ``exp(dc)`` near 1 when d is tiny. The ESS uses rho itself, so a
    rho near 0 (d near -20) keeps its relative precision.
    """
    d_BT, dc_BT, rho_BT = ratios.d_BT, ratios.dc_BT, ratios.rho_BT
    e_BT = torch.expm1(dc_BT)
    sums = [
        d_BT.sum(),
        _dot(dc_BT, dc_BT),
        e_BT.sum(),
        _dot(e_BT, e_BT),
        rho_BT.sum(),
        _dot(rho_BT, rho_BT),
    ]
    sums.append(e_BT.sub_(dc_BT).sum())  # in place, after every other use of e
    sum_d, sum_dc_sq, sum_e, sum_e_sq, sum_rho, sum_rho_sq, sum_k3 = torch.stack(sums).tolist()
    return {
        "kl_k1": (0.0 - sum_d) / n,  # 0.0 - x: no -0.0 in the report
        "kl_k2": 0.5 * sum_dc_sq / n,
        "kl_k3": sum_k3 / n,
        "chi2_token": (sum_e_sq + 2.0 * sum_e) / n,
        "ess_token": min(sum_rho**2 / (n * sum_rho_sq), 1.0),  # <= 1 up to rounding
    }


def _abs_diff_statistics(ratios: LogRatios, n: int) -> dict[str, float | None]:
    """Mean, median, max and tail fractions of |d|, and the mean absolute probability gap."""
    abs_d_BT = ratios.d_BT.abs()
    prob_gap_BT = ratios.proximal_BT.exp().sub_(ratios.behaviour_BT.exp()).abs_()  # 0 if not valid
    sum_abs, max_abs, sum_gap, out_2x, out_5x = torch.stack(
        [
            abs_d_BT.sum(),
            abs_d_BT.max(),
            prob_gap_BT.sum(),
            (abs_d_BT > log_threshold(2.0, ratios.weight_dtype)).sum(),
            (abs_d_BT > log_threshold(5.0, ratios.weight_dtype)).sum(),
        ]
    ).tolist()
    return {
        "abs_diff_mean": sum_abs / n,
        "abs_diff_median": median_of_nonnegative(abs_d_BT, n),
        "abs_diff_max": max_abs,
        "prob_abs_diff_mean": sum_gap / n,
        "frac_outside_2x": out_2x / n,
        "frac_outside_5x": out_5x / n,
    }


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
    out.update(_log_ratio_means(ratios, n))
    out["logp_pearson"] = _pearson(ratios, n)
    out.update(_abs_diff_statistics(ratios, n))
    out.update(_sequence_statistics(ratios, n_seq))
    return out


def diagnostics_by_lag(
    behaviour_logp_BT, proximal_logp_BT, mask_BT, lag_B
) -> dict[str, dict[str, float | int | None]]:
    """``compute_diagnostics`` restricted to the responses of each lag, keyed ``str(lag)``, sorted by lag."""
    ratios = compute_log_ratios(behaviour_logp_BT, proximal_logp_BT, mask_BT)
    return diagnostics_by_lag_of(ratios, lag_B)


def checked_lags(lag_B, num_responses: int) -> tuple[torch.Tensor, list[int]]:
    """``lag_B`` as an integer tensor of one lag per response, and its distinct lags, sorted; a
    ValueError naming ``lag`` otherwise."""
    lag_B = torch.as_tensor(lag_B)
    if lag_B.shape != (num_responses,):
        raise ValueError(f"lag has shape {tuple(lag_B.shape)} but the batch has {num_responses} responses")
    if lag_B.is_floating_point() or lag_B.is_complex() or lag_B.dtype == torch.bool:
        raise ValueError(f"lag must be an integer tensor, got {lag_B.dtype}")
    return lag_B, sorted(torch.unique(lag_B).tolist())


def diagnostics_by_lag_of(ratios: LogRatios, lag_B) -> dict[str, dict[str, float | int | None]]:
    """``diagnostics_by_lag`` on ratios already computed (no recompute of the log-ratios)."""
    lag_B, lags = checked_lags(lag_B, ratios.num_valid_B.numel())
    lag_B = lag_B.to(ratios.valid_BT.device)
    return {str(lag): compute_diagnostics(select_sequences(ratios, lag_B == lag)) for lag in lags}
