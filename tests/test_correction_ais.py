"""AIS version 2 (spec section 3; the alpha rule is our reconstruction from the paper's abstract).

By hand: the stateless diagnostics S, R, V; bias, noise, alpha_raw and the EMA over two
steps; a per-lag example; omega. Properties (hypothesis): no mismatch gives w = 1, d = 0,
alpha_raw = 0 and omega = k = 1; alpha_raw in [0, 1]; scaling every d_i leaves alpha_raw
unchanged; alpha_raw is non-decreasing in |b| at fixed s2 and n_eff; equal non-zero d_i give
alpha_raw = 1; a rejected token keeps omega = 0 for every alpha; a constant weight shift
inside a GRPO group (zero-sum advantages) gives b = 0. Then the state (EMA, per-lag EMAs,
JSON round trip) and the correction service's metrics.
"""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from system.config.correction import (
    AISConfig,
    CorrectionConfig,
    GeoRS,
    IcePop,
    SeqMIS,
    SeqTIS,
    TokenTIS,
)
from system.correction import (
    AdaptiveIS,
    ais_diagnostics,
    ais_estimate,
    compute_log_ratios,
    compute_weights_and_keep,
    default_method_configs,
    estimate_alpha,
    method_statistics,
    mix_weights,
    oracle_alpha,
    sequence_deltas,
)
from system.correction.service import CorrectionCore
from system.losses.advantages import group_advantages

NAN = float("nan")
LN2, LN4, LN_HALF = math.log(2.0), math.log(4.0), math.log(0.5)
SETTINGS = settings(max_examples=60, deadline=None)
METHODS = default_method_configs()


def batch_of(d_rows, dtype=torch.float64):
    """(mu, old, mask) with mu = -3 and old = mu + d; rows shorter than the longest are padded."""
    t = max(len(r) for r in d_rows)
    d = torch.tensor([list(r) + [0.0] * (t - len(r)) for r in d_rows], dtype=dtype)
    mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in d_rows])
    mu = torch.full(d.shape, -3.0, dtype=dtype)
    return mu, mu + d, mask


def ratios_of(d_rows):
    return compute_log_ratios(*batch_of(d_rows))


# ---- the hand batch ---------------------------------------------------------------------------
#
# seq-mis (hi = 3) on four responses, rho_seq = [2, 4, 0.5, 1]:
#   response 0: one token,  d = ln 2            -> kept,     w = 2,   T = 1
#   response 1: one token,  d = ln 4 > ln 3     -> REJECTED, w = 0,   k = 0
#   response 2: two tokens, d = ln 0.5, 0       -> kept,     w = 0.5, T = 2
#   response 3: two tokens, d = 0, 0            -> kept,     w = 1,   T = 2
# advantages A = [1, -1, -1, 1] (two groups of two, each summing to 0).
#   d_i = A_i / T_i * sum_t k (w - 1) = [1 * 1, 0, -1 * (2 * -0.5) / 2, 0] = [1, 0, 0.5, 0]
#   b = 1.5 / 4 = 3/8;  mean d^2 = 1.25 / 4 = 5/16;  s2 = 5/16 - 9/64 = 11/64
#   R: min(rho_seq, 2) = [2, 2, 0.5, 1], sum 5.5, sum of squares 9.25 -> R = 30.25 / 37
#   n_eff = 4 R = 121/37;  noise2 = (11/64) / (121/37) = 37/704;  b^2 = 9/64 = 99/704
#   b2_plus = 62/704;  alpha_raw = 62/99;  alpha_1 = 0.5 * 0 + 0.5 * 62/99 = 31/99
# step 2: two one-token responses with d = ln 2 (w = 2) and A = [0.5, 0.5]:
#   d_i = [0.5, 0.5]: b = 0.5, s2 = 0 -> noise 0, alpha_raw = 1
#   alpha_2 = 0.5 * 31/99 + 0.5 * 1 = 65/99
# omega at step 1 (alpha = 31/99): [1 + 31/99, 0, 1 - 0.5 * 31/99 (both tokens), 1, 1]
HAND_D = [[LN2], [LN4], [LN_HALF, 0.0], [0.0, 0.0]]
HAND_A = torch.tensor([1.0, -1.0, -1.0, 1.0])
STEP2_D = [[LN2], [LN2]]
STEP2_A = torch.tensor([0.5, 0.5])


def test_ais_diagnostics_by_hand():
    # hand batch: valid d = [-0.5, 1, 0 | 0], L = [0.5, 0]
    mu = torch.tensor([[-1.0, -2.0, -0.5], [-0.5, NAN, -3.0]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -1.0, -0.5], [-0.5, -1.0, 7.0]], dtype=torch.float64)
    r = compute_log_ratios(mu, old, torch.tensor([[1, 1, 1], [1, 1, 0]]))
    got = ais_diagnostics(r)
    w = np.array([math.exp(-0.5), 2.0, 1.0, 1.0])  # min(rho, 2)
    seq = np.array([math.exp(0.5), 1.0])  # min(rho_seq, 2)
    assert got["severity"] == pytest.approx((0.5 + 1.0) / 4, rel=1e-12)
    assert got["reliability"] == pytest.approx(seq.sum() ** 2 / (2 * (seq**2).sum()), rel=1e-12)
    assert got["variance_amplification"] == pytest.approx(
        math.sqrt(((w - w.mean()) ** 2).mean()) / w.mean(), rel=1e-12
    )
    # a cap of 1.5 truncates e^.5 = 1.65 too: both sequence weights 1.5 -> 1 and 1 -> ESS
    assert ais_diagnostics(r, c=1.5)["reliability"] == pytest.approx((2.5**2) / (2 * (1.5**2 + 1)))
    empty = compute_log_ratios(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    assert ais_diagnostics(empty) == {
        "severity": None,
        "reliability": None,
        "variance_amplification": None,
    }


def test_hand_batch_keep_mask_deltas_bias_noise_alpha_raw():
    r = ratios_of(HAND_D)
    w, k = compute_weights_and_keep(r, SeqMIS())
    assert k.tolist() == [[True, False], [False, False], [True, True], [True, True]]
    np.testing.assert_allclose(w.tolist(), [[2, 0], [0, 0], [0.5, 0.5], [1, 1]], rtol=1e-12)
    np.testing.assert_allclose(sequence_deltas(r, w, k, HAND_A).tolist(), [1, 0, 0.5, 0], atol=1e-12)
    got = estimate_alpha(r, w, k, HAND_A)
    assert got["bias"] == pytest.approx(3 / 8, rel=1e-12)
    assert got["noise"] == pytest.approx(math.sqrt(37 / 704), rel=1e-12)
    assert got["alpha_raw"] == pytest.approx(62 / 99, rel=1e-12)
    assert ais_estimate(r, SeqMIS(), HAND_A) == got  # the report's entry point: same numbers
    assert ais_estimate(r, SeqMIS(), None) == {"bias": None, "noise": None, "alpha_raw": None}
    assert ais_estimate(r, SeqMIS(), torch.tensor([1.0, NAN, 0, 0]))["alpha_raw"] is None
    assert oracle_alpha(3 / 8, 11 / 64, 121 / 37) == pytest.approx((37 / 704, 62 / 99), rel=1e-12)


def test_ema_over_two_steps_by_hand_and_omega():
    ais = AdaptiveIS(AISConfig(enabled=True))
    assert ais.config.beta == 0.5 and ais.alpha == 0.0  # the spec's beta and alpha_0
    r = ratios_of(HAND_D)
    w, k = compute_weights_and_keep(r, SeqMIS())
    out = ais.update(r, w, k, HAND_A)
    assert out.metrics["alpha"] == pytest.approx(31 / 99, rel=1e-12)
    assert out.alpha_B.tolist() == pytest.approx([31 / 99] * 4, rel=1e-12)
    assert set(out.metrics) == {
        "severity",
        "reliability",
        "variance_amplification",
        "bias",
        "noise",
        "alpha_raw",
        "alpha",
    }
    omega = mix_weights(w, k, out.alpha_B)
    a = 31 / 99
    np.testing.assert_allclose(
        omega.tolist(), [[1 + a, 0], [0, 0], [1 - a / 2, 1 - a / 2], [1, 1]], rtol=1e-12
    )
    r2 = ratios_of(STEP2_D)
    w2, k2 = compute_weights_and_keep(r2, SeqMIS())
    out = ais.update(r2, w2, k2, STEP2_A)
    assert out.metrics["bias"] == pytest.approx(0.5) and out.metrics["noise"] == 0.0
    assert out.metrics["alpha_raw"] == 1.0
    assert out.metrics["alpha"] == pytest.approx(65 / 99, rel=1e-12)


def test_per_lag_example_by_hand():
    # The hand batch with lags [0, 0, 1, 1]:
    # lag 0 (responses 0, 1): d = [1, 0], b = 1/2, s2 = 1/4, R = ESS of [2, 2] = 1, n_eff = 2,
    #   noise2 = 1/8, b2_plus = 1/8 -> alpha_raw = 1/2, alpha = 1/4
    # lag 1 (responses 2, 3): d = [0.5, 0], b = 1/4, s2 = 1/16, R = ESS of [0.5, 1] = 2.25/2.5
    #   = 9/10, n_eff = 9/5, noise2 = 5/144, b^2 = 9/144 -> alpha_raw = 4/9, alpha = 2/9
    # omega = [1 + 1/4, 0 | 1 - (2/9)/2 = 8/9 (both tokens), 1]; the batch-wide alpha is 31/99.
    # Step 2: two lag-1 responses with d_i = 0.5 each -> lag 1: alpha_raw = 1,
    #   alpha = 0.5 * 2/9 + 0.5 = 11/18; lag 0 (absent) keeps 1/4.
    ais = AdaptiveIS(AISConfig(enabled=True, per_lag=True))
    r = ratios_of(HAND_D)
    w, k = compute_weights_and_keep(r, SeqMIS())
    out = ais.update(r, w, k, HAND_A, torch.tensor([0, 0, 1, 1]))
    by_lag = out.metrics["by_lag"]
    assert sorted(by_lag) == ["0", "1"]
    assert by_lag["0"] == pytest.approx(
        {"bias": 0.5, "noise": math.sqrt(1 / 8), "alpha_raw": 0.5, "alpha": 0.25}, rel=1e-12
    )
    assert by_lag["1"] == pytest.approx(
        {"bias": 0.25, "noise": math.sqrt(5 / 144), "alpha_raw": 4 / 9, "alpha": 2 / 9}, rel=1e-12
    )
    assert out.metrics["alpha"] == pytest.approx(31 / 99, rel=1e-12)  # batch-wide EMA, logged
    assert out.alpha_B.tolist() == pytest.approx([0.25, 0.25, 2 / 9, 2 / 9], rel=1e-12)
    np.testing.assert_allclose(
        mix_weights(w, k, out.alpha_B).tolist(), [[1.25, 0], [0, 0], [8 / 9, 8 / 9], [1, 1]], rtol=1e-12
    )
    r2 = ratios_of(STEP2_D)
    w2, k2 = compute_weights_and_keep(r2, SeqMIS())
    out = ais.update(r2, w2, k2, STEP2_A, np.array([1, 1], dtype=np.int32))
    assert list(out.metrics["by_lag"]) == ["1"]
    assert out.metrics["by_lag"]["1"]["alpha"] == pytest.approx(11 / 18, rel=1e-12)
    state = ais.state_dict()
    assert state["alpha_by_lag"] == pytest.approx({"0": 0.25, "1": 11 / 18}, rel=1e-12)
    assert state["alpha"] == pytest.approx(65 / 99, rel=1e-12)


def test_a_batch_without_sequence():
    # alpha_raw = 0, bias and noise None; the EMA takes its step with alpha_raw = 0
    ais = AdaptiveIS(AISConfig(per_lag=True))
    r = ratios_of(HAND_D)
    w, k = compute_weights_and_keep(r, SeqMIS())
    ais.update(r, w, k, HAND_A, torch.tensor([0, 0, 1, 1]))
    lags_before = ais.state_dict()["alpha_by_lag"]
    empty = compute_log_ratios(torch.full((2, 3), NAN), torch.zeros(2, 3), torch.ones(2, 3))
    we, ke = compute_weights_and_keep(empty, SeqMIS())
    out = ais.update(empty, we, ke, torch.zeros(2), torch.tensor([0, 1]))
    assert out.metrics["bias"] is None and out.metrics["noise"] is None
    assert out.metrics["alpha_raw"] == 0.0
    assert out.metrics["alpha"] == pytest.approx(0.5 * 31 / 99, rel=1e-12)
    assert out.metrics["by_lag"] == {} and ais.state_dict()["alpha_by_lag"] == lags_before
    assert mix_weights(we, ke, out.alpha_B).tolist() == [[0.0] * 3] * 2


def test_omega_by_hand_and_its_bounds():
    w = torch.tensor([[0.0, 0.5, 1.0, 3.0], [2.0, 7.0, 0.0, 0.0]])
    keep = torch.tensor([[True, True, True, True], [True, False, False, False]])
    # (1 - 0.25) + 0.25 w: 0.75, 0.875, 1, 1.5 | 1.25, then 0 where not kept
    assert mix_weights(w, keep, 0.25).tolist() == [[0.75, 0.875, 1.0, 1.5], [1.25, 0.0, 0.0, 0.0]]
    assert mix_weights(w, keep, 0.0).tolist() == keep.float().tolist()
    assert mix_weights(w, keep, 1.0).tolist() == (w * keep).tolist()
    assert mix_weights(w, keep, torch.tensor([1.0, 0.5])).tolist()[1][0] == 1.5  # per response
    assert mix_weights(w.double(), keep, 0.5).dtype == torch.float64
    big = torch.rand(50, 50, dtype=torch.float64) * 1e6
    for alpha in (0.0, 0.3, 0.999999, 1.0):
        omega = mix_weights(big, torch.ones(50, 50, dtype=torch.bool), alpha)
        assert (omega <= big.clamp(min=1.0)).all() and (omega >= big.clamp(max=1.0)).all()
    with pytest.raises(ValueError, match="alpha"):
        mix_weights(w, keep, 1.5)
    with pytest.raises(ValueError, match="alpha"):
        mix_weights(w, keep, torch.tensor([0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match="shape|same"):
        mix_weights(w, keep[:, :2], 0.5)


def test_sequence_deltas_ignore_padding_invalid_tokens_and_check_shapes():
    r = ratios_of(HAND_D)
    w, k = compute_weights_and_keep(r, SeqMIS())
    garbage_w = torch.where(r.valid_BT, w, torch.tensor(1e9))  # never read where not valid
    garbage_k = k | ~r.valid_BT
    assert sequence_deltas(r, garbage_w, garbage_k, HAND_A).tolist() == pytest.approx([1, 0, 0.5, 0])
    with pytest.raises(ValueError, match="advantages"):
        sequence_deltas(r, w, k, torch.ones(3))
    with pytest.raises(ValueError, match="finite"):
        sequence_deltas(r, w, k, torch.tensor([1.0, 1.0, float("inf"), 1.0]))
    with pytest.raises(ValueError, match="shape"):
        sequence_deltas(r, w[:, :1], k, HAND_A)


# ---- properties -------------------------------------------------------------------------------


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


# ---- state ------------------------------------------------------------------------------------


def stream_of(num, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        mu = -rng.exponential(1.0, size=(6, 5))
        old = mu + rng.normal(0.3, 0.5, size=(6, 5))
        r = compute_log_ratios(mu, old, np.ones((6, 5)))
        w, k = compute_weights_and_keep(r, SeqMIS())
        out.append((r, w, k, torch.tensor(rng.normal(size=6)), torch.tensor(rng.integers(0, 3, 6))))
    return out


@pytest.mark.parametrize("per_lag", [False, True])
def test_state_dict_round_trip_through_json_continues_identically(per_lag):
    stream = stream_of(12)
    a = AdaptiveIS(AISConfig(per_lag=per_lag))
    for batch in stream[:5]:
        a.update(*batch)
    b = AdaptiveIS(AISConfig(per_lag=per_lag))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # through JSON, as in a checkpoint
    assert b.state_dict() == a.state_dict()
    for batch in stream[5:]:
        x, y = a.update(*batch), b.update(*batch)
        assert x.metrics == y.metrics and torch.equal(x.alpha_B, y.alpha_B)
    if per_lag:
        assert set(a.state_dict()["alpha_by_lag"]) == {"0", "1", "2"}


def test_a_version_1_state_is_refused():
    v1 = {"num_batches": 12, "severity_sum": 1.0, "s_ref": 0.1, "alpha": 0.2}
    with pytest.raises(ValueError, match="version 1"):
        AdaptiveIS(AISConfig()).load_state_dict(v1)


def test_config_has_no_version_1_fields():
    assert set(AISConfig.model_fields) == {"enabled", "beta", "c", "per_lag"}
    assert AISConfig().beta == 0.5 and not AISConfig().per_lag
    with pytest.raises(ValueError):
        AISConfig(warmup_batches=3)


# ---- the correction service -------------------------------------------------------------------


def core_inputs():
    mu, old, mask = batch_of(HAND_D, torch.float32)
    return mu.numpy(), old.numpy(), mask.numpy().astype(bool), np.array([0, 0, 1, 1], np.int32)


def test_service_applies_omega_and_reports_applied_and_pre_ais_statistics():
    core = CorrectionCore(CorrectionConfig(ais=AISConfig(enabled=True)))
    mu, old, mask, lag = core_inputs()
    res = core.process(mu, old, mask, lag, HAND_A.numpy())
    a = 31 / 99
    np.testing.assert_allclose(
        res.weights_BT, [[1 + a, 0], [0, 0], [1 - a / 2, 1 - a / 2], [1, 1]], rtol=1e-6
    )
    m = res.metrics
    assert m["ais/enabled"] == 1 and m["ais/alpha"] == pytest.approx(a, rel=1e-6)
    assert m["ais/alpha_raw"] == pytest.approx(62 / 99, rel=1e-6)
    assert m["ais/bias"] == pytest.approx(3 / 8, rel=1e-6)
    assert m["ais/noise"] == pytest.approx(math.sqrt(37 / 704), rel=1e-6)
    r = compute_log_ratios(mu, old, mask)
    w, _ = compute_weights_and_keep(r, SeqMIS())
    before = method_statistics(r, w)
    after = method_statistics(r, torch.from_numpy(res.weights_BT))
    assert m["method_before_ais/weight_mean"] == pytest.approx(before["weight_mean"])
    assert m["correction/weight_mean"] == pytest.approx(after["weight_mean"])
    assert m["correction/weight_max"] == pytest.approx(1 + a, rel=1e-6)
    assert m["correction/keep_token_frac"] == m["method_before_ais/keep_token_frac"] == 5 / 6
    assert m["correction/keep_seq_frac_by_len/<=128"] == 0.75
    assert not any(k.startswith("ais/by_lag/") for k in m)
    # the state advanced once: a second identical batch gives alpha = 0.5 a + 0.5 * 62/99
    m2 = core.process(mu, old, mask, lag, HAND_A.numpy()).metrics
    assert m2["ais/alpha"] == pytest.approx(0.5 * a + 0.5 * 62 / 99, rel=1e-6)
    restored = CorrectionCore(CorrectionConfig(ais=AISConfig(enabled=True)))
    restored.load_state_dict(json.loads(json.dumps(core.state_dict())))
    assert restored.state_dict() == core.state_dict()


def test_service_without_ais_logs_alpha_but_applies_w():
    core = CorrectionCore(CorrectionConfig())
    mu, old, mask, lag = core_inputs()
    res = core.process(mu, old, mask, lag, HAND_A.numpy())
    np.testing.assert_allclose(res.weights_BT, [[2, 0], [0, 0], [0.5, 0.5], [1, 1]], rtol=1e-6)
    m = res.metrics
    assert m["ais/enabled"] == 0 and m["ais/alpha"] == pytest.approx(31 / 99, rel=1e-6)
    assert not any(k.startswith("method_before_ais/") for k in m)
    assert m["correction/weight_max"] == pytest.approx(2.0)
    # no advantages: AIS values None and its state untouched (refused when AIS is on)
    state = core.state_dict()
    m = core.process(mu, old, mask, lag).metrics
    assert m["ais/alpha"] is None and m["ais/bias"] is None and m["ais/severity"] is not None
    assert core.state_dict() == state
    with pytest.raises(ValueError, match="advantage"):
        CorrectionCore(CorrectionConfig(ais=AISConfig(enabled=True))).process(mu, old, mask, lag)


def test_service_per_lag_streams_each_bucket_and_applies_its_alpha():
    core = CorrectionCore(CorrectionConfig(ais=AISConfig(enabled=True, per_lag=True)))
    mu, old, mask, lag = core_inputs()
    res = core.process(mu, old, mask, lag, HAND_A.numpy())
    m = res.metrics
    assert m["ais/by_lag/0/alpha"] == pytest.approx(0.25) and m["ais/by_lag/1/alpha"] == pytest.approx(2 / 9)
    assert m["ais/by_lag/1/alpha_raw"] == pytest.approx(4 / 9, rel=1e-6)
    assert {"ais/by_lag/0/bias", "ais/by_lag/0/noise"} <= set(m)
    np.testing.assert_allclose(res.weights_BT, [[1.25, 0], [0, 0], [8 / 9, 8 / 9], [1, 1]], rtol=1e-6)
    assert core.state_dict()["ais"]["alpha_by_lag"] == pytest.approx({"0": 0.25, "1": 2 / 9})
