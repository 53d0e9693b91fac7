"""Train-inference mismatch diagnostics of one batch, overall and per lag (spec section 1).

Means over the n valid tokens (d = old - mu raw, dc clamped, rho = exp(dc)):

    kl_k1 = mean(-d)            kl_k2 = mean(dc**2 / 2)          kl_k3 = mean(rho - 1 - dc)
    chi2_token = mean(rho**2) - 1                chi2_seq = mean_i(rho_seq_i**2) - 1
    logp_pearson = corr(mu, old), population moments, None if either is constant
    abs_diff_{mean,median,max} of |d|            prob_abs_diff_mean = mean |exp(old) - exp(mu)|
    frac_outside_{2x,5x} = mean(|d| > log {2,5})
    ess_token = (sum rho)**2 / (n sum rho**2)    ess_seq = the same on rho_seq over sequences

Numerics: every quantity is computed once, in float64, on the [B, T] tensors of
``LogRatios`` (already 0 where not valid, so plain sums are masked sums), with no loop over
sequences. ``rho - 1 - dc`` is evaluated as ``expm1(dc) - dc`` and ``rho**2 - 1`` as
``expm1(2 dc)``: the same numbers without the cancellation near d = 0. An empty batch gives
counts 0 and ``None`` for every float statistic, never NaN.

Shapes: B = responses in the batch, T = padded response length.
"""

import math

import torch

from system.correction.ratios import (
    LOG_RATIO_CLAMP,
    LogRatios,
    compute_log_ratios,
    select_sequences,
)
from system.correction.reductions import as_float, ess_fraction, median_of_valid

DIAGNOSTIC_KEYS: tuple[str, ...] = (
    "n_sequences", "n_tokens", "nonfinite_tokens",
    "kl_k1", "kl_k2", "kl_k3", "chi2_token", "chi2_seq", "logp_pearson",
    "abs_diff_mean", "abs_diff_median", "abs_diff_max", "prob_abs_diff_mean",
    "frac_outside_2x", "frac_outside_5x", "ess_token", "ess_seq",
)  # fmt: skip
"""The keys of ``compute_diagnostics``, in the order of spec section 1."""

_LOG_2 = math.log(2.0)
_LOG_5 = math.log(5.0)


def _centred(values_BT: torch.Tensor, valid_BT: torch.Tensor, ref: torch.Tensor, n: int):
    """Valid values minus their mean, 0 elsewhere; shifted by a sample value first so a
    constant input gives exactly 0 (and a zero variance) rather than rounding noise."""
    shifted_BT = torch.where(valid_BT, values_BT - ref, 0.0)
    return torch.where(valid_BT, shifted_BT - shifted_BT.sum() / n, 0.0)


def _pearson(ratios: LogRatios, n: int) -> float | None:
    """Pearson correlation of mu and old over valid tokens; None if either has zero variance."""
    row = int(ratios.seq_valid_B.nonzero()[0, 0].item())
    col = int(ratios.valid_BT[row].nonzero()[0, 0].item())
    mu_BT = _centred(ratios.behaviour_BT, ratios.valid_BT, ratios.behaviour_BT[row, col], n)
    old_BT = _centred(ratios.proximal_BT, ratios.valid_BT, ratios.proximal_BT[row, col], n)
    var_mu = mu_BT.square().sum()
    var_old = old_BT.square().sum()
    if var_mu.item() == 0.0 or var_old.item() == 0.0:
        return None
    cov = (mu_BT * old_BT).sum()
    return as_float((cov / (var_mu.sqrt() * var_old.sqrt())).clamp(-1.0, 1.0))


def _token_statistics(ratios: LogRatios, n: int) -> dict[str, float | None]:
    """Every per-token statistic of the table, as means over the n >= 1 valid tokens."""
    d_BT, dc_BT = ratios.d_BT, ratios.dc_BT
    abs_d_BT = d_BT.abs()
    prob_diff_BT = (ratios.proximal_BT.exp() - ratios.behaviour_BT.exp()).abs()  # 0 where not valid
    sums = torch.stack(
        [
            -d_BT.sum(),
            0.5 * dc_BT.square().sum(),
            (torch.expm1(dc_BT) - dc_BT).sum(),
            torch.expm1(2.0 * dc_BT).sum(),
            abs_d_BT.sum(),
            prob_diff_BT.sum(),
            (abs_d_BT > _LOG_2).sum(),
            (abs_d_BT > _LOG_5).sum(),
        ]
    ) / n
    kl_k1, kl_k2, kl_k3, chi2, abs_mean, prob_mean, out_2x, out_5x = sums.tolist()
    return {
        "kl_k1": kl_k1,
        "kl_k2": kl_k2,
        "kl_k3": kl_k3,
        "chi2_token": chi2,
        "logp_pearson": _pearson(ratios, n),
        "abs_diff_mean": abs_mean,
        "abs_diff_median": median_of_valid(abs_d_BT, ratios.valid_BT, n),
        "abs_diff_max": as_float(abs_d_BT.max()),
        "prob_abs_diff_mean": prob_mean,
        "frac_outside_2x": out_2x,
        "frac_outside_5x": out_5x,
        "ess_token": ess_fraction(ratios.rho_BT, n),
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
    out.update(_token_statistics(ratios, n))
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
