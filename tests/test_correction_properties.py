"""Properties of the correction core over generated batches (spec sections 0-3).

- no mismatch (mu == old): every method's weight is exactly 1 and keeps every valid token,
  AIS alpha_raw is 0 (the AIS v2 properties are in test_correction_ais.py);
- padding (masked columns / rows full of garbage, NaN included) and the order of the
  responses change no statistic;
- log-probs down to -1e4, differences far beyond the clamp and NaN / +-inf inputs keep
  every output finite (or None), and non-finite inputs are counted;
- omega lies between min(1, w) and max(1, w) where kept, and is 0 elsewhere.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from system.config.correction import AISConfig
from system.correction import (
    AdaptiveIS,
    ais_diagnostics,
    compute_diagnostics,
    compute_log_ratios,
    compute_weights,
    compute_weights_and_keep,
    default_method_configs,
    method_statistics,
    mix_weights,
)

SETTINGS = settings(max_examples=60, deadline=None)
METHODS = default_method_configs()
SPECIALS = [float("nan"), float("inf"), -float("inf")]


@st.composite
def batches(draw, max_b=5, max_t=7, specials=False):
    """(mu, old, mask) float32 numpy arrays: log-probs in [-1e4, 0], differences up to +-60."""
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([0.01, 1.0, 30.0, 1e4]))
    mu = -np.minimum(rng.exponential(scale, size=(B, T)), 1e4)
    spread = draw(st.sampled_from([0.0, 1e-3, 0.5, 5.0, 60.0]))
    old = np.clip(mu + rng.normal(0, spread, size=(B, T)), -1e4, 0.0)
    mask = rng.random((B, T)) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    if specials:
        holes = rng.random((B, T)) < 0.2
        mu[holes] = rng.choice(SPECIALS, size=holes.sum())
        holes = rng.random((B, T)) < 0.1
        old[holes] = rng.choice(SPECIALS, size=holes.sum())
    return mu.astype(np.float32), old.astype(np.float32), mask


def all_outputs(mu, old, mask):
    """Every statistic the core reports for a batch (diagnostics, AIS, per-method)."""
    r = compute_log_ratios(mu, old, mask)
    out = {"diag": compute_diagnostics(r), "ais": ais_diagnostics(r)}
    for name, method in METHODS.items():
        out[name] = method_statistics(r, compute_weights(r, method))
    return out


def flatten(stats, prefix=""):
    for key, value in stats.items():
        if isinstance(value, dict):
            yield from flatten(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def assert_same(a, b):
    fa, fb = dict(flatten(a)), dict(flatten(b))
    assert fa.keys() == fb.keys()
    for key in fa:
        if fa[key] is None or fb[key] is None:
            assert fa[key] is fb[key], key
        else:
            assert fa[key] == pytest.approx(fb[key], rel=1e-9, abs=1e-12), key


@SETTINGS
@given(batches())
def test_no_mismatch_gives_weight_one_for_every_method_and_zero_alpha_raw(batch):
    mu, _, mask = batch
    r = compute_log_ratios(mu, mu.copy(), mask)
    for name, method in METHODS.items():
        for variant in (method, method.model_copy(update={"self_normalize": True, "veto": 1e-4})):
            w, k = compute_weights_and_keep(r, variant)
            assert torch.equal(w, r.valid_BT.to(w.dtype)), name  # exactly 1 where valid, 0 elsewhere
            assert torch.equal(k, r.valid_BT), name
            ais = AdaptiveIS(AISConfig())
            advantages = torch.linspace(-1.0, 1.0, mu.shape[0])
            for _ in range(4):
                assert ais.update(r, w, k, advantages).metrics["alpha_raw"] == 0.0
            assert ais.alpha == 0.0


@SETTINGS
@given(batches(specials=True), st.integers(0, 3), st.integers(0, 3), st.data())
def test_padding_and_row_order_change_no_statistic(batch, extra_cols, extra_rows, data):
    mu, old, mask = batch
    B, T = mu.shape
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    garbage = [np.nan, np.inf, -np.inf, 1e30, -3.0, 0.0]
    pad_mu = rng.choice(garbage, size=(B + extra_rows, T + extra_cols)).astype(np.float32)
    pad_old = rng.choice(garbage, size=(B + extra_rows, T + extra_cols)).astype(np.float32)
    pad_mask = np.zeros((B + extra_rows, T + extra_cols), dtype=bool)
    pad_mu[:B, :T], pad_old[:B, :T], pad_mask[:B, :T] = mu, old, mask
    order = rng.permutation(B + extra_rows)
    want = all_outputs(mu, old, mask)
    assert_same(all_outputs(pad_mu, pad_old, pad_mask), want)
    assert_same(all_outputs(pad_mu[order], pad_old[order], pad_mask[order]), want)


@SETTINGS
@given(batches(max_b=6, max_t=9, specials=True))
def test_extreme_and_non_finite_inputs_keep_every_output_finite(batch):
    mu, old, mask = batch
    r = compute_log_ratios(mu, old, mask)
    nonfinite = mask & ~(np.isfinite(mu) & np.isfinite(old))
    assert r.nonfinite_tokens == int(nonfinite.sum())
    assert r.num_tokens == int((mask & ~nonfinite).sum())
    for key, value in flatten(all_outputs(mu, old, mask)):
        assert value is None or math.isfinite(value), key
    for tensor in (
        r.d_BT,
        r.dc_BT,
        r.rho_BT,
        r.seq_logratio_B,
        r.rho_seq_B,
        r.behaviour_BT,
        r.proximal_BT,
    ):
        assert torch.isfinite(tensor).all()
    for method in METHODS.values():
        w = compute_weights(r, method.model_copy(update={"self_normalize": True}))
        assert torch.isfinite(w).all() and (w >= 0).all() and (w[~r.valid_BT] == 0).all()


@SETTINGS
@given(batches(specials=True), st.floats(0.0, 1.0))
def test_omega_lies_between_one_and_w_where_kept(batch, alpha):
    mu, old, mask = batch
    r = compute_log_ratios(mu, old, mask)
    for method in METHODS.values():
        w, k = compute_weights_and_keep(r, method)
        omega = mix_weights(w, k, alpha)
        assert (omega[~k] == 0).all() and not (k & ~r.valid_BT).any()
        assert (omega <= w.clamp(min=1.0)).all() and (omega[k] >= w[k].clamp(max=1.0)).all()
        # the value itself, from numpy (the bounds above hold by the clamp; a review found a swapped
        # alpha would pass them): omega = (1 - alpha) + alpha * w, to the rounding of w's dtype
        w64 = w[k].double().numpy()
        want = (1.0 - alpha) + alpha * w64
        np.testing.assert_allclose(omega[k].double().numpy(), want, rtol=4 * torch.finfo(w.dtype).eps, atol=0)
