"""AIS version 2 properties (hypothesis; spec section 3).

No mismatch gives w = 1, d = 0, alpha_raw = 0 and omega = k = 1; alpha_raw in [0, 1]; scaling every
d_i leaves alpha_raw unchanged; alpha_raw is non-decreasing in |b| at fixed s2 and n_eff; equal
non-zero d_i give alpha_raw = 1; a rejected token keeps omega = 0 for every alpha; a constant
weight shift inside a GRPO group (zero-sum advantages) gives b = 0.
"""

import math

import numpy as np
import pytest
import torch
from ais_batches import (  # a helper module beside the tests
    METHODS,
    SETTINGS,
    ratios_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from system.config.correction import (
    AISConfig,
    GeoRS,
    IcePop,
    SeqMIS,
    SeqTIS,
    TokenTIS,
)
from system.correction import (
    AdaptiveIS,
    compute_log_ratios,
    compute_weights_and_keep,
    estimate_alpha,
    mix_weights,
    oracle_alpha,
    sequence_deltas,
)
from system.losses.advantages import group_advantages


@st.composite
def batches(draw, max_b=6, max_t=7):
    """(ratios, advantages): log-probs in [-30, 0], differences up to +-8, some masked tokens."""
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mu = -rng.exponential(draw(st.sampled_from([0.1, 1.0, 10.0])), size=(B, T))
    spread = draw(st.sampled_from([0.0, 1e-3, 0.3, 2.0, 8.0]))
    old = np.minimum(mu + rng.normal(0, spread, size=(B, T)), 0.0)
    mask = rng.random((B, T)) < draw(st.sampled_from([0.5, 0.9, 1.0]))
    advantages = rng.normal(0, draw(st.sampled_from([1e-3, 1.0, 30.0])), size=B)
    return compute_log_ratios(mu, old, mask), torch.tensor(advantages)


def all_variants():
    for method in METHODS.values():
        yield method
        yield method.model_copy(update={"self_normalize": True, "veto": 1e-2})


@SETTINGS
@given(batches())
def test_no_mismatch_gives_w_one_d_zero_alpha_raw_zero_omega_equal_k_equal_one(batch):
    r, advantages = batch
    r = compute_log_ratios(r.behaviour_BT, r.behaviour_BT.clone(), r.valid_BT)
    for method in all_variants():
        w, k = compute_weights_and_keep(r, method)
        assert torch.equal(w, r.valid_BT.to(w.dtype)), method  # exactly 1 where valid
        assert torch.equal(k, r.valid_BT), method
        assert (sequence_deltas(r, w, k, advantages) == 0).all()
        ais = AdaptiveIS(AISConfig())
        for _ in range(3):
            out = ais.update(r, w, k, advantages)
            assert out.metrics["alpha_raw"] == 0.0 and out.metrics["alpha"] == 0.0
            assert out.metrics["bias"] in (0.0, None) and out.metrics["noise"] in (0.0, None)
        for alpha in (0.0, 0.7, 1.0):
            assert torch.equal(mix_weights(w, k, alpha), k.to(w.dtype))


@SETTINGS
@given(batches(), st.sampled_from(sorted(METHODS)))
def test_alpha_raw_lies_in_zero_one(batch, name):
    r, advantages = batch
    for method in (METHODS[name], METHODS[name].model_copy(update={"veto": 0.1})):
        w, k = compute_weights_and_keep(r, method)
        got = estimate_alpha(r, w, k, advantages)
        assert 0.0 <= got["alpha_raw"] <= 1.0
        assert got["noise"] is None or (math.isfinite(got["noise"]) and got["noise"] >= 0.0)


@SETTINGS
@given(batches(), st.sampled_from(sorted(METHODS)), st.floats(1e-3, 1e3), st.booleans())
def test_scaling_every_d_i_leaves_alpha_raw_unchanged(batch, name, scale, negative):
    # d_i is linear in A_i: scaling the advantages scales every d_i by the same constant
    r, advantages = batch
    scale = -scale if negative else scale
    w, k = compute_weights_and_keep(r, METHODS[name])
    want = estimate_alpha(r, w, k, advantages)["alpha_raw"]
    assert estimate_alpha(r, w, k, advantages * scale)["alpha_raw"] == pytest.approx(want, abs=1e-9)
    assert estimate_alpha(r, w, k, advantages * 1024.0)["alpha_raw"] == want  # exact in binary


finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(finite, finite, st.floats(0.0, 1e6), st.floats(0.0, 1e4))
def test_alpha_raw_is_non_decreasing_in_abs_bias(b1, b2, s2, n_eff):
    lo, hi = sorted((abs(b1), abs(b2)))
    assert oracle_alpha(lo, s2, n_eff)[1] <= oracle_alpha(hi, s2, n_eff)[1]
    assert oracle_alpha(-hi, s2, n_eff) == oracle_alpha(hi, s2, n_eff)
    noise2, alpha_raw = oracle_alpha(b1, s2, n_eff)
    assert noise2 == s2 / max(n_eff, 1.0) and 0.0 <= alpha_raw <= 1.0


@SETTINGS
@given(
    st.integers(1, 12),
    st.floats(0.01, 5.0),
    st.booleans(),
    st.floats(0.05, 10.0),
    st.booleans(),
    st.sampled_from(["token-tis", "icepop", "seq-tis", "seq-mis"]),
)
def test_equal_nonzero_d_i_give_alpha_raw_one(n, log_ratio, down, advantage, negative, name):
    # every response: the same two tokens, so the same w, k and T; the same advantage
    d = -log_ratio if down else log_ratio
    r = ratios_of([[d, 0.0]] * n)
    w, k = compute_weights_and_keep(r, METHODS[name])
    a = torch.full((n,), -advantage if negative else advantage)
    deltas = sequence_deltas(r, w, k, a)
    got = estimate_alpha(r, w, k, a)
    if (deltas != 0).all():
        assert (deltas == deltas[0]).all()
        assert got["alpha_raw"] == 1.0 and got["noise"] == pytest.approx(0.0, abs=1e-12)
    else:  # the method rejected the shifted tokens (every d_i = 0): nothing to correct
        assert (deltas == 0).all() and got["alpha_raw"] == 0.0


@SETTINGS
@given(batches(), st.floats(0.0, 1.0))
def test_a_rejected_token_keeps_omega_zero_for_every_alpha(batch, alpha):
    r, _ = batch
    rejecting = [
        SeqMIS(hi=1.5),
        SeqMIS(lo=0.8, hi=1.2),
        IcePop(lo=0.8, hi=1.2),
        GeoRS(lo=0.99, hi=1.01),
        TokenTIS(veto=0.5),
        SeqTIS(veto=0.5, self_normalize=True),
    ]
    for method in rejecting:
        w, k = compute_weights_and_keep(r, method)
        assert not (k & ~r.valid_BT).any()
        for a in (alpha, 0.0, 1.0):
            omega = mix_weights(w, k, a)
            assert (omega[~k] == 0).all(), method
            assert (omega[k] > 0).all(), method  # kept tokens of these methods have w > 0
    w, k = compute_weights_and_keep(r, TokenTIS())
    assert torch.equal(k, r.valid_BT)  # TIS rejects nothing


@SETTINGS
@given(st.integers(1, 5), st.integers(2, 6), st.data())
def test_constant_weight_shift_inside_a_grpo_group_gives_zero_bias(num_groups, size, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    n, t = num_groups * size, 5
    group_B = np.repeat(np.arange(num_groups), size)
    rewards = rng.integers(0, 2, size=n).astype(np.float32) + rng.random(n).astype(np.float32)
    advantages = group_advantages(torch.from_numpy(rewards), torch.from_numpy(group_B), True)
    lengths = rng.integers(1, t + 1, size=n)
    mask = np.arange(t)[None, :] < lengths[:, None]
    r = compute_log_ratios(np.zeros((n, t)), np.zeros((n, t)), mask)
    shift_G = rng.uniform(-0.9, 3.0, size=num_groups)
    w = torch.tensor(np.where(mask, 1.0 + shift_G[group_B][:, None], 0.0))
    got = estimate_alpha(r, w, r.valid_BT, advantages)
    assert got["bias"] == pytest.approx(0.0, abs=1e-6)
    assert got["alpha_raw"] == pytest.approx(0.0, abs=1e-6)
