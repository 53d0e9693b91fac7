"""The CPU kernels of the correction core against their torch reference and numpy (spec sections 0-2).

- ``vector_exp``: exp and expm1 within 2 ulp of numpy, from tiny arguments to under/overflow;
- ``row_sums_kernel`` gives the columns of ``row_sums.row_sums_torch`` (NaN, inf, garbage
  padding, empty rows, float32 and float64), and the valid mask;
- the median selection is exact, also on layouts that defeat its sample;
- every statistic and weight is the same on the CPU-kernel path and on the torch path
  (the one a GPU takes), and the same for float32 inputs and their float64 copies;
- tiny log-ratios keep kl_k3 and chi2 to float64 accuracy (no ``exp(d) - 1`` cancellation).
"""

import math

import numpy as np
import pytest
import torch
from numba import njit

from system.correction import (
    ais_diagnostics,
    compute_diagnostics,
    compute_log_ratios,
    compute_weights,
    default_method_configs,
    diagnostics_by_lag,
    method_statistics,
)
from system.correction import ratios as ratios_module
from system.correction.median_kernel import abs_d_order_statistics
from system.correction.row_sums import COLUMNS, row_sums_torch, valid_masks_BT
from system.correction.row_sums_kernel import row_sums_kernel
from system.correction.vector_exp import exp_and_expm1, exp_any

ULP = 2.0**-52
METHODS = default_method_configs()


def make_batch(regime: str, seed: int, B: int, T: int):
    """float32 (mu, old, mask, lag) of a regime: ragged, one empty row, garbage padding, holes."""
    rng = np.random.default_rng(seed)
    mu = -rng.exponential(1.5, size=(B, T))
    if regime == "bf16":  # kl ~ 5e-5
        old = mu + rng.normal(0, 0.01, size=(B, T))
    elif regime == "fp8":  # kl ~ 5e-2
        old = mu + rng.normal(0, 0.3, size=(B, T))
    elif regime == "compressed":  # kl_k1 ~ 4
        old = 0.45 * mu - rng.exponential(4.9, size=(B, T))
    else:  # extreme: log-probs down to -1e4, differences far beyond the clamp
        mu = -rng.uniform(0, 1e4, size=(B, T)) * (rng.random((B, T)) < 0.3)
        old = np.minimum(mu + rng.normal(0, 40, size=(B, T)), 0.0)
    lengths = rng.integers(0, T + 1, size=B)
    lengths[0], lengths[1] = T, 0
    mask = np.arange(T)[None, :] < lengths[:, None]
    mu[~mask] = rng.choice([np.nan, np.inf, -np.inf, 1e30], size=(~mask).sum())
    old[~mask] = rng.choice([np.nan, -np.inf, 7.0], size=(~mask).sum())
    holes = mask & (rng.random((B, T)) < 0.03)
    mu[holes & (rng.random((B, T)) < 0.5)] = -np.inf
    old[holes] = np.nan
    return mu.astype(np.float32), old.astype(np.float32), mask, rng.integers(0, 3, size=B)


@njit
def _exp_both(x_N, exp_N, expm1_N, any_N):
    for j in range(x_N.shape[0]):
        exp_N[j], expm1_N[j] = exp_and_expm1(x_N[j])
        any_N[j] = exp_any(x_N[j])


def _exps(x_N):
    outs = [np.empty_like(x_N) for _ in range(3)]
    _exp_both(x_N, *outs)
    return outs


def _max_rel_err(got, want):
    nonzero = want != 0
    assert (got[~nonzero] == 0).all()
    return float(np.max(np.abs(got[nonzero] - want[nonzero]) / np.abs(want[nonzero])))


def test_vector_exp_is_within_two_ulp_on_the_clamped_range_and_near_zero():
    rng = np.random.default_rng(0)
    x_N = np.concatenate(
        [np.linspace(-20, 20, 200_001), rng.normal(0, 1e-3, 10_000), rng.normal(0, 1e-9, 1000)]
    )
    exp_N, expm1_N, any_N = _exps(x_N)
    assert _max_rel_err(exp_N, np.exp(x_N)) <= 2 * ULP
    assert _max_rel_err(expm1_N, np.expm1(x_N)) <= 2 * ULP
    assert _max_rel_err(any_N, np.exp(x_N)) <= 2 * ULP


def test_exp_any_underflows_and_overflows_like_libm():
    x_N = np.concatenate([np.linspace(-760, 720, 100_001), [-np.inf, np.inf, 709.78, -745.2]])
    with np.errstate(over="ignore"):
        want_N = np.exp(x_N)
    got_N = _exps(x_N)[2]
    normal = (want_N > 2.3e-308) & np.isfinite(want_N)
    assert _max_rel_err(got_N[normal], want_N[normal]) <= 2 * ULP
    assert (
        np.max(np.abs(got_N[~normal & np.isfinite(want_N)] - want_N[~normal & np.isfinite(want_N)]))
        <= 5e-324
    )
    assert np.array_equal(np.isinf(got_N), np.isinf(want_N))


def _garbage_batch(rng, B, T, dtype):
    mu = -rng.exponential(2.0, size=(B, T))
    old = mu + rng.normal(0, rng.choice([1e-6, 0.05, 3.0, 40.0]), size=(B, T))
    mask = rng.random((B, T)) < 0.8
    if B > 1:
        mask[1] = False  # an empty response
    holes = rng.random((B, T)) < 0.1
    mu[holes] = rng.choice([np.nan, np.inf, -np.inf], size=holes.sum())
    old[rng.random((B, T)) < 0.05] = np.nan
    return mu.astype(dtype), old.astype(dtype), mask


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(6, 37), (3, 1), (4, 0), (0, 5), (1, 300)])
def test_row_sums_kernel_matches_the_torch_reference(dtype, shape):
    rng = np.random.default_rng(sum(shape))
    mu, old, mask = _garbage_batch(rng, *shape, dtype)
    valid_np = np.empty(shape, dtype=np.bool_)
    sums_np = np.empty((shape[0], len(COLUMNS)))
    row_sums_kernel(mu, old, mask, valid_np, sums_np)

    mu_t, old_t, mask_t = map(torch.from_numpy, (mu, old, mask))
    valid_t, nonfinite_t = valid_masks_BT(mu_t, old_t, mask_t)
    want = row_sums_torch(
        torch.where(valid_t, mu_t.double(), 0.0), torch.where(valid_t, old_t.double(), 0.0),
        valid_t, nonfinite_t,
    ).numpy()  # fmt: skip
    assert np.array_equal(valid_np, valid_t.numpy())
    for k, name in enumerate(COLUMNS):
        np.testing.assert_allclose(sums_np[:, k], want[:, k], rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize(
    "layout", ["random", "sorted", "reversed", "ties", "one_row", "tiny_band", "strided_trap"]
)
def test_median_selection_is_exact_on_every_layout(layout):
    rng = np.random.default_rng(7)
    B, T = 64, 512
    abs_d = rng.exponential(1.0, size=B * T)
    if layout == "sorted":
        abs_d.sort()
    elif layout == "reversed":
        abs_d = np.sort(abs_d)[::-1].copy()
    elif layout == "ties":
        abs_d = np.round(abs_d, 1)
    elif layout == "tiny_band":
        abs_d[:] = 0.5
        abs_d[::97] = 2.0
    elif layout == "strided_trap":  # the strided sample sees only the large values
        abs_d = rng.exponential(1e-3, size=B * T)
        abs_d[::8] = 100.0 + rng.random(abs_d[::8].shape)
    mu = -rng.exponential(1.0, size=B * T).reshape(B, T)
    old = mu + abs_d.reshape(B, T) * rng.choice([-1.0, 1.0], size=(B, T))
    valid = np.ones((B, T), dtype=bool) if layout != "one_row" else np.zeros((B, T), dtype=bool)
    if layout == "one_row":
        valid[3] = True
    valid[5, 7:] = False if layout != "one_row" else valid[5, 7:]
    want = np.abs(old - mu)[valid]
    n = want.size
    for ranks in ([(n + 1) // 2], [n // 2, n // 2 + 1], [1], [n]):
        got = abs_d_order_statistics(mu, old, valid, ranks)
        assert got == [float(np.partition(want, r - 1)[r - 1]) for r in ranks], (layout, ranks)


def _all_outputs(mu, old, mask, lag):
    r = compute_log_ratios(mu, old, mask)
    out = {"diag": compute_diagnostics(r), "ais": ais_diagnostics(r)}
    out["by_lag"] = diagnostics_by_lag(mu, old, mask, lag)
    for name, method in METHODS.items():
        for variant in (method, method.model_copy(update={"veto": 1e-3, "self_normalize": True})):
            w = compute_weights(r, variant)
            out[f"{name}/{variant.veto}/w"] = w.numpy()
            out[f"{name}/{variant.veto}/stats"] = method_statistics(r, w)
    return out


def _assert_close(a, b, rel, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_close(a[key], b[key], rel, f"{path}/{key}")
    elif isinstance(a, np.ndarray):
        np.testing.assert_allclose(a, b, rtol=rel, atol=0, err_msg=path)
    elif a is None or b is None:
        assert a is b, path
    else:
        assert a == pytest.approx(b, rel=rel, abs=1e-300), path


@pytest.mark.parametrize("regime", ["bf16", "fp8", "compressed", "extreme"])
def test_cpu_kernels_and_the_torch_path_agree(regime, monkeypatch):
    mu, old, mask, lag = make_batch(regime, seed=4, B=24, T=300)
    kernels = _all_outputs(mu, old, mask, lag)
    monkeypatch.setattr(ratios_module, "uses_cpu_kernels", lambda tensor: False)
    assert compute_log_ratios(mu, old, mask).cpu_arrays is None  # the torch path runs
    _assert_close(kernels, _all_outputs(mu, old, mask, lag), rel=1e-9)


@pytest.mark.parametrize("regime", ["bf16", "extreme"])
def test_float32_inputs_and_their_float64_copies_give_the_same_statistics(regime):
    mu, old, mask, lag = make_batch(regime, seed=6, B=16, T=200)
    as32 = _all_outputs(mu, old, mask, lag)
    as64 = _all_outputs(mu.astype(np.float64), old.astype(np.float64), mask, lag)
    for key in as32:  # weights come back in the input dtype: float32 rounding, then stats of it
        _assert_close(as32[key], as64[key], rel=1e-12 if key in ("diag", "ais", "by_lag") else 1e-7)


def test_tiny_log_ratios_keep_k3_and_chi2_to_float64_accuracy():
    rng = np.random.default_rng(3)
    mu = -rng.exponential(1.0, size=(8, 256))
    for scale in (1e-3, 1e-6):
        d = rng.normal(0, scale, size=mu.shape)
        diag = compute_diagnostics(compute_log_ratios(mu, mu + d, np.ones(mu.shape, dtype=bool)))
        d = (mu + d) - mu  # the log-ratio the inputs actually carry
        # Series, exact to float64 for |d| < 1e-2: rho - 1 - d and rho**2 - 1.
        k3 = np.mean(d**2 / 2 + d**3 / 6 + d**4 / 24 + d**5 / 120)
        chi2 = np.mean(2 * d + 2 * d**2 + 4 * d**3 / 3 + 2 * d**4 / 3 + 4 * d**5 / 15)
        assert diag["kl_k3"] == pytest.approx(k3, rel=1e-12)
        assert diag["chi2_token"] == pytest.approx(chi2, rel=1e-9, abs=1e-15)
        assert math.isfinite(diag["logp_pearson"])


def _long_double_reference(mu, old, mask):
    """The spec's formulas in long double (80-bit on x86), over the valid tokens."""
    valid = mask & np.isfinite(mu) & np.isfinite(old)
    m, o = mu[valid].astype(np.longdouble), old[valid].astype(np.longdouble)
    d = o - m
    dc = np.clip(d, -20, 20)
    rho = np.exp(dc)
    wide_mu, wide_old = mu.astype(np.longdouble), old.astype(np.longdouble)
    seq = [np.clip(wide_old[i][valid[i]] - wide_mu[i][valid[i]], -20, 20) for i in range(len(mu))]
    log_rho_seq = np.array([np.clip(s.sum(), -20, 20) for s in seq if s.size])
    mc, oc = m - m.mean(), o - o.mean()
    return {
        "kl_k1": -d.mean(), "kl_k2": (dc**2).mean() / 2, "kl_k3": (np.expm1(dc) - dc).mean(),
        "chi2_token": np.expm1(2 * dc).mean(), "chi2_seq": np.expm1(2 * log_rho_seq).mean(),
        "logp_pearson": (mc * oc).sum() / np.sqrt((mc**2).sum() * (oc**2).sum()),
        "abs_diff_mean": np.abs(d).mean(), "abs_diff_median": np.median(np.abs(d)),
        "abs_diff_max": np.abs(d).max(), "prob_abs_diff_mean": np.abs(np.exp(o) - np.exp(m)).mean(),
        "ess_token": rho.sum() ** 2 / (d.size * (rho**2).sum()),
        "ess_seq": np.exp(log_rho_seq).sum() ** 2 / (log_rho_seq.size * np.exp(2 * log_rho_seq).sum()),
    }  # fmt: skip


@pytest.mark.parametrize("regime", ["bf16", "fp8", "compressed"])
def test_diagnostics_are_float64_accurate_against_long_double(regime):
    mu, old, mask, _ = make_batch(regime, seed=8, B=32, T=512)
    got = compute_diagnostics(compute_log_ratios(mu, old, mask))
    for key, want in _long_double_reference(mu, old, mask).items():
        # The gap beyond the +-20 clamp is off by up to exp(-20) on those tokens (row_sums).
        rel = 1e-9 if key == "prob_abs_diff_mean" else 1e-13
        assert abs(got[key] - want) <= rel * abs(want), key
