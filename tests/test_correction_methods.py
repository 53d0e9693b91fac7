"""Correction weights, keep masks and their statistics (spec section 2), derived by hand."""

import math

import numpy as np
import pytest
import torch

from system.config.correction import (
    METHOD_TYPES,
    GeoRS,
    IcePop,
    NoCorrection,
    SeqMIS,
    SeqTIS,
    TokenTIS,
)
from system.correction import (
    METHOD_REGISTRY,
    CorrectionMethod,
    compute_diagnostics,
    compute_log_ratios,
    compute_weights,
    compute_weights_and_keep,
    default_method_configs,
    keep_mask,
    method_statistics,
)

E = math.e
NAN = float("nan")
# The hand batch of test_correction_diagnostics: valid d = [-0.5, 1, 0 | 0, -, -],
# rho = [e^-.5, e, 1 | 1], T = [3, 1], L = [0.5, 0], rho_seq = [e^.5, 1].
MU = [[-1.0, -2.0, -0.5], [-0.5, NAN, -3.0]]
OLD = [[-1.5, -1.0, -0.5], [-0.5, -1.0, 7.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def hand_ratios(dtype=torch.float64):
    return compute_log_ratios(
        torch.tensor(MU, dtype=dtype), torch.tensor(OLD, dtype=dtype), torch.tensor(MASK)
    )


def weights(method, dtype=torch.float64):
    return compute_weights(hand_ratios(dtype), method).tolist()


S = math.exp(0.5)  # rho_seq of row 0
M = (math.exp(-0.5) + 2 + 1 + 1) / 4  # token-tis mean over the 4 valid tokens


@pytest.mark.parametrize(
    "method, want",
    [
        (NoCorrection(), [[1, 1, 1], [1, 0, 0]]),
        (TokenTIS(), [[math.exp(-0.5), 2.0, 1], [1, 0, 0]]),  # min(e, 2) = 2
        (IcePop(), [[math.exp(-0.5), E, 1], [1, 0, 0]]),  # every rho in [0.5, 5]
        (IcePop(lo=0.7, hi=2.0), [[0, 0, 1], [1, 0, 0]]),  # e^-.5 = .61 < .7, e > 2
        (SeqTIS(), [[S, S, S], [1, 0, 0]]),  # e^.5 = 1.65 < 2
        (SeqTIS(c=1.5), [[1.5] * 3, [1, 0, 0]]),
        (SeqMIS(), [[S, S, S], [1, 0, 0]]),  # L = .5 <= log 3
        (SeqMIS(hi=1.5), [[0, 0, 0], [1, 0, 0]]),  # .5 > log 1.5 = .405
        (SeqMIS(lo=1.2, hi=3.0), [[S, S, S], [0, 0, 0]]),  # L = 0 < log 1.2
        (GeoRS(), [[0, 0, 0], [1, 0, 0]]),  # L/T = 1/6 > log 1.001; row 1: 0
        (GeoRS(lo=0.9, hi=1.2), [[1, 1, 1], [1, 0, 0]]),  # 1/6 <= log 1.2 = .182
        # veto 0.7: log .7 = -.357 > d = -.5 in row 0, so row 0 is dropped whole
        (TokenTIS(veto=0.7), [[0, 0, 0], [1, 0, 0]]),
        (SeqMIS(veto=0.7), [[0, 0, 0], [1, 0, 0]]),
        (SeqMIS(veto=0.5), [[S, S, S], [1, 0, 0]]),  # log .5 = -.69 < -.5: no veto
        # token methods normalise by the mean over the 4 valid tokens
        (TokenTIS(self_normalize=True), [[math.exp(-0.5) / M, 2 / M, 1 / M], [1 / M, 0, 0]]),
        # sequence methods by the mean over the 2 sequences: (e^.5 + 1) / 2
        (SeqTIS(self_normalize=True), [[2 * S / (S + 1)] * 3, [2 / (S + 1), 0, 0]]),
        # the veto comes first: mean over sequences of [0, 1] is 0.5
        (SeqMIS(veto=0.7, self_normalize=True), [[0, 0, 0], [2.0, 0, 0]]),
        (TokenTIS(veto=0.7, self_normalize=True), [[0, 0, 0], [4.0, 0, 0]]),  # token mean 1/4
        (
            IcePop(lo=4.0, hi=5.0, self_normalize=True),
            [[0, 0, 0], [0, 0, 0]],
        ),  # all rejected: stays 0
    ],
    ids=lambda x: repr(x) if not isinstance(x, list) else "",
)
def test_weights_by_hand(method, want):
    np.testing.assert_allclose(weights(method), want, rtol=1e-12, atol=0)
    # no weight underflows here: the keep mask is exactly where w > 0
    assert keep_mask(hand_ratios(), method).tolist() == (np.array(want) > 0).tolist()


def test_keep_mask_is_the_decision_not_w_positive(monkeypatch):
    r = hand_ratios()
    # a TIS-like method whose weights underflow to 0 still rejects nothing ...
    # (the registry is read-only: the test swaps an entry of its underlying dict)
    monkeypatch.setitem(
        METHOD_REGISTRY._entries, "token-tis", CorrectionMethod("token", lambda r, m: torch.zeros_like(r.rho_BT))
    )
    w, k = compute_weights_and_keep(r, TokenTIS())
    assert w.tolist() == [[0.0] * 3] * 2 and torch.equal(k, r.valid_BT)
    # ... and a masking method's decision stands whatever its weights are
    monkeypatch.setitem(
        METHOD_REGISTRY._entries,
        "seq-mis",
        CorrectionMethod("sequence", lambda r, m: torch.zeros(2, dtype=torch.float64), METHOD_REGISTRY["seq-mis"].keep),
    )
    assert keep_mask(r, SeqMIS(hi=1.5)).tolist() == [[False] * 3, [True, False, False]]
    assert keep_mask(r, SeqMIS()).tolist() == [[True] * 3, [True, False, False]]
    # veto 0.9: d = -0.5 < log 0.9 drops row 0
    assert keep_mask(r, SeqMIS(veto=0.9)).tolist() == [[False] * 3, [True, False, False]]


def test_registry_covers_every_config_type_and_defaults_are_the_spec_defaults():
    assert METHOD_TYPES == ("none", "token-tis", "icepop", "seq-tis", "seq-mis", "geo-rs")  # the union's order
    assert tuple(METHOD_REGISTRY) == METHOD_TYPES
    defaults = default_method_configs()
    assert list(defaults) == list(METHOD_TYPES)
    assert defaults["token-tis"].c == 2.0 and defaults["seq-tis"].c == 2.0
    assert (defaults["icepop"].lo, defaults["icepop"].hi) == (0.5, 5.0)
    assert (defaults["seq-mis"].lo, defaults["seq-mis"].hi) == (None, 3.0)
    assert (defaults["geo-rs"].lo, defaults["geo-rs"].hi) == (0.999, 1.001)
    assert all(c.veto is None and not c.self_normalize for c in defaults.values())


def test_thresholds_use_the_unclamped_log_ratio():
    # row 0: three tokens with d = 10: L = 30 (rho_seq clamps to e^20);
    # row 1: d = 22, 0, 0: L = 20 after the per-token clamp (dc = 20);
    # row 2: one token d = 30: icepop must see 30, not the clamped 20.
    old = (
        torch.tensor([[10.0, 10.0, 10.0], [22.0, 0.0, 0.0], [30.0, 0.0, 0.0]], dtype=torch.float64)
        - 30.0
    )
    mu = torch.full((3, 3), -30.0, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0]])
    r = compute_log_ratios(mu, old, mask)
    assert r.seq_logratio_B.tolist() == [30.0, 20.0, 20.0]
    e20 = math.exp(20.0)
    # hi = e^25: 30 > 25 rejects row 0 although its clamped ratio e^20 < e^25
    w = compute_weights(r, SeqMIS(hi=math.exp(25.0))).tolist()
    assert w[0] == [0, 0, 0] and w[1] == pytest.approx([e20] * 3, rel=1e-12)
    # icepop: d = 30 > 25 rejected though rho = e^20; d = 22 < 25 kept at e^20
    w = compute_weights(r, IcePop(lo=0.5, hi=math.exp(25.0))).tolist()
    assert w[2][0] == 0 and w[1][0] == pytest.approx(e20, rel=1e-12) and w[1][1] == 1
    assert compute_weights(r, SeqTIS(c=5.0)).tolist()[0] == [5.0] * 3


def test_weight_dtype_follows_the_inputs_and_weights_are_detached():
    assert compute_weights(hand_ratios(torch.float32), SeqMIS()).dtype == torch.float32
    assert compute_weights(hand_ratios(torch.bfloat16), SeqMIS()).dtype == torch.float32
    assert compute_weights(hand_ratios(torch.float64), SeqMIS()).dtype == torch.float64
    mu = torch.tensor(MU, requires_grad=True)
    w = compute_weights(compute_log_ratios(mu, torch.tensor(OLD), torch.tensor(MASK)), TokenTIS())
    assert not w.requires_grad


def test_method_statistics_by_hand():
    r = hand_ratios()
    stats = method_statistics(r, compute_weights(r, IcePop(lo=0.7, hi=2.0)))
    # w = [0, 0, 1 | 1]: 2 of 4 tokens kept, both sequences keep a token
    assert stats == {
        "keep_token_frac": 0.5,
        "keep_seq_frac": 1.0,
        "weight_mean": 0.5,
        "weight_max": 1.0,
        "ess": 2.0**2 / (4 * 2.0),  # (sum w)^2 / (n sum w^2)
        "keep_seq_frac_by_len": {"<=128": 1.0, "<=512": None, "<=2048": None, ">2048": None},
    }
    stats = method_statistics(r, compute_weights(r, TokenTIS()))
    w = [math.exp(-0.5), 2.0, 1.0, 1.0]
    assert stats["weight_mean"] == pytest.approx(sum(w) / 4) and stats["weight_max"] == 2.0
    assert stats["ess"] == pytest.approx(sum(w) ** 2 / (4 * sum(x * x for x in w)))
    stats = method_statistics(r, compute_weights(r, SeqMIS(hi=1.5)))  # w = [0, 0, 0 | 1]
    assert stats["keep_seq_frac"] == 0.5 and stats["keep_token_frac"] == 0.25


def test_method_statistics_ignore_weights_at_invalid_tokens_and_all_zero_ess():
    r = hand_ratios()
    w = torch.tensor([[0.0, 0.0, 0.0], [0.0, NAN, 99.0]], dtype=torch.float64)
    stats = method_statistics(r, w)
    assert stats["ess"] == 0.0 and stats["weight_max"] == 0.0 and stats["keep_seq_frac"] == 0.0
    with pytest.raises(ValueError, match="shape"):
        method_statistics(r, torch.zeros(2, 4))


def test_keep_seq_frac_by_length_bucket():
    # lengths 128, 129, 512, 513, 2049, 0: buckets <=128: 1 seq, <=512: 2, <=2048: 1, >2048: 1
    lengths = torch.tensor([128, 129, 512, 513, 2049, 0])
    mask = torch.arange(2100)[None, :] < lengths[:, None]
    mu = torch.zeros(6, 2100, dtype=torch.float64)
    old = mu.clone()
    old[1, 0] = -5.0  # rejected by seq-mis lo = 0.5: L = -5 < log .5
    old[4, 0] = 5.0  # rejected by hi = 3: L = 5 > log 3
    r = compute_log_ratios(mu, old, mask)
    stats = method_statistics(r, compute_weights(r, SeqMIS(lo=0.5, hi=3.0)))
    assert stats["keep_seq_frac_by_len"] == {
        "<=128": 1.0,
        "<=512": 0.5,
        "<=2048": 1.0,
        ">2048": 0.0,
    }
    assert stats["keep_seq_frac"] == 3 / 5


def test_empty_batch_statistics_and_weights():
    r = compute_log_ratios(torch.full((2, 3), NAN), torch.zeros(2, 3), torch.ones(2, 3))
    for method in default_method_configs().values():
        w = compute_weights(r, method.model_copy(update={"self_normalize": True}))
        assert w.tolist() == [[0.0] * 3] * 2
        stats = method_statistics(r, w)
        assert stats["ess"] is None and stats["keep_seq_frac_by_len"]["<=128"] is None


def _one_response(*d):
    """One response whose tokens have exactly these log-ratios: mu = 0 and old = d give d = old - mu = d."""
    old = torch.tensor([list(d)], dtype=torch.float64)
    return compute_log_ratios(torch.zeros_like(old), old, torch.ones_like(old, dtype=torch.long))


def _below(x):
    return math.nextafter(x, -math.inf)


def _above(x):
    return math.nextafter(x, math.inf)


def test_every_threshold_includes_its_boundary_and_the_veto_is_strict():
    """Spec section 2 by its inequalities, at the boundary and one float64 ulp outside it (a review
    found no test telling ``<=`` from ``<``): icepop keeps ``lo <= rho <= hi``; seq-mis keeps
    ``log lo <= L <= log hi``; geo-rs keeps ``log lo <= L / T <= log hi``; the veto drops a response
    with a token ``d < log veto``, so ``d = log veto`` stays."""
    lo, hi = math.log(0.5), math.log(5.0)
    kept = keep_mask(_one_response(lo, hi), IcePop()).tolist()
    assert kept == [[True, True]]
    np.testing.assert_allclose(compute_weights(_one_response(lo, hi), IcePop()).tolist(), [[0.5, 5.0]], rtol=1e-15)
    assert keep_mask(_one_response(_below(lo), _above(hi)), IcePop()).tolist() == [[False, False]]

    log3 = math.log(3.0)
    assert keep_mask(_one_response(log3), SeqMIS()).tolist() == [[True]]
    np.testing.assert_allclose(compute_weights(_one_response(log3), SeqMIS()).tolist(), [[3.0]], rtol=1e-15)
    assert keep_mask(_one_response(_above(log3)), SeqMIS()).tolist() == [[False]]
    assert keep_mask(_one_response(lo), SeqMIS(lo=0.5)).tolist() == [[True]]
    assert keep_mask(_one_response(_below(lo)), SeqMIS(lo=0.5)).tolist() == [[False]]

    g_lo, g_hi = math.log(0.999), math.log(1.001)  # one token: L / T = d exactly
    assert keep_mask(_one_response(g_lo), GeoRS()).tolist() == keep_mask(_one_response(g_hi), GeoRS()).tolist() == [[True]]
    assert keep_mask(_one_response(_below(g_lo)), GeoRS()).tolist() == [[False]]
    assert keep_mask(_one_response(_above(g_hi)), GeoRS()).tolist() == [[False]]

    # veto 0.5 on token-tis (C = 2): d = log 0.5 stays, w = min(0.5, 2); one ulp below drops the response
    at = _one_response(lo, 0.0)
    assert keep_mask(at, TokenTIS(veto=0.5)).tolist() == [[True, True]]
    np.testing.assert_allclose(compute_weights(at, TokenTIS(veto=0.5)).tolist(), [[0.5, 1.0]], rtol=1e-15)
    assert compute_weights(_one_response(_below(lo), 0.0), TokenTIS(veto=0.5)).tolist() == [[0.0, 0.0]]


def _one_response_f32(*d):
    """As ``_one_response`` in float32: each d is float32's value nearest to it (``torch.tensor`` rounds)."""
    old = torch.tensor([list(d)], dtype=torch.float32)
    return compute_log_ratios(torch.zeros_like(old), old, torch.ones_like(old, dtype=torch.long))


def _f32_step(x, towards):
    return float(np.nextafter(np.float32(x), np.float32(towards)))


def test_float32_inputs_meet_each_threshold_as_float32_holds_it():
    """Found by a spec audit: ``mu = 0, old = log 3`` in float32 (float32's log 3, 2e-8 above log 3) was
    rejected by seq-mis, ``d`` being compared in float64 with ``math.log(3)``; so were icepop at float32's
    log 0.5 (below log 0.5) and log 5 (above log 5), seq-mis ``lo`` at log 0.5, and the veto vetoed at
    float32's log 1e-4 (below it). A threshold is now ``log x`` at the inputs' precision, so each keeps
    its boundary, and one float32 step beyond it is still outside."""
    lo, hi, log3 = math.log(0.5), math.log(5.0), math.log(3.0)
    assert keep_mask(_one_response_f32(lo, hi), IcePop()).tolist() == [[True, True]]
    outside = _one_response_f32(_f32_step(lo, -np.inf), _f32_step(hi, np.inf))
    assert keep_mask(outside, IcePop()).tolist() == [[False, False]]

    assert keep_mask(_one_response_f32(log3), SeqMIS()).tolist() == [[True]]
    # the weight is float32's rho at float32's log 3: exp(1.0986123085) = 3.0000000595, rounded to float32
    assert compute_weights(_one_response_f32(log3), SeqMIS()).tolist() == [[float(np.float32(3.0000000595))]]
    assert keep_mask(_one_response_f32(_f32_step(log3, np.inf)), SeqMIS()).tolist() == [[False]]
    assert keep_mask(_one_response_f32(lo), SeqMIS(lo=0.5)).tolist() == [[True]]
    assert keep_mask(_one_response_f32(_f32_step(lo, -np.inf)), SeqMIS(lo=0.5)).tolist() == [[False]]

    g_lo, g_hi = math.log(0.999), math.log(1.001)
    assert keep_mask(_one_response_f32(g_lo), GeoRS()).tolist() == keep_mask(_one_response_f32(g_hi), GeoRS()).tolist() == [[True]]
    assert keep_mask(_one_response_f32(_f32_step(g_lo, -np.inf)), GeoRS()).tolist() == [[False]]
    assert keep_mask(_one_response_f32(_f32_step(g_hi, np.inf)), GeoRS()).tolist() == [[False]]

    veto = math.log(1e-4)
    assert keep_mask(_one_response_f32(veto, 0.0), TokenTIS(veto=1e-4)).tolist() == [[True, True]]
    assert keep_mask(_one_response_f32(_f32_step(veto, -np.inf), 0.0), TokenTIS(veto=1e-4)).tolist() == [[False, False]]


@pytest.mark.parametrize("path", ["torch", "fused"])
def test_float32_frac_outside_counts_only_beyond_the_threshold(path):
    """``frac_outside_2x`` / ``_5x`` count |d| > log 2 / log 5 strictly: float32's log 2 (above log 2) and
    log 5 (above log 5) are at the threshold, not beyond it; one float32 step more is beyond it.
    Tokens: |d| at log 2, beyond log 2, at log 5, beyond log 5, and 0: 2x counts 3 of 5, 5x counts 1."""
    from system.correction import fused

    l2, l5 = math.log(2.0), math.log(5.0)
    old = torch.tensor([[l2, -_f32_step(l2, np.inf), -l5, _f32_step(l5, np.inf), 0.0]], dtype=torch.float32)
    mu, mask = torch.zeros_like(old), torch.ones_like(old, dtype=torch.long)
    if path == "torch":
        diagnostics = compute_diagnostics(compute_log_ratios(mu, old, mask))
    else:
        if not fused.available():
            pytest.skip("the fused pass is not built (no C++ compiler)")
        diagnostics = fused.full_path(mu, old, mask, SeqMIS())[0]
    assert diagnostics["frac_outside_2x"] == 3 / 5 and diagnostics["frac_outside_5x"] == 1 / 5
