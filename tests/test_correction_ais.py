"""AIS version 2 by hand (spec section 3; the alpha rule is our reconstruction from the paper's abstract).

The stateless diagnostics S, R, V; bias, noise, alpha_raw and the EMA over two steps; a per-lag
example; omega; the per-sequence deltas. The properties are in ``test_correction_ais_properties.py``,
the state and the correction service in ``test_correction_ais_service.py``.
"""

import math

import numpy as np
import pytest
import torch
from ais_batches import (  # a helper module beside the tests
    HAND_A,
    HAND_D,
    NAN,
    STEP2_A,
    STEP2_D,
    ratios_of,
)

from system.config.correction import (
    AISConfig,
    SeqMIS,
)
from system.correction import (
    AdaptiveIS,
    ais_diagnostics,
    ais_estimate,
    compute_log_ratios,
    compute_weights_and_keep,
    estimate_alpha,
    mix_weights,
    oracle_alpha,
    sequence_deltas,
)


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


def test_bias_is_exact_for_float32_inputs_near_w_1():
    """d_i from the float64 weights: float32 inputs with a mismatch of ~2e-5 (w - 1 ~ 2e-5, which a
    float32 w holds to ~6e-8, a relative error ~3e-3 in w - 1) give the bias of a float64 reference
    of the spec's formula, b = mean_i A_i / T_i sum_t k (w - 1), with w = min(exp(old - mu), 2) (token TIS)."""
    from system.config.correction import CorrectionConfig, TokenTIS
    from system.correction.service import CorrectionCore

    rng = np.random.default_rng(3)
    mu = (-rng.uniform(0.5, 3.0, (16, 50))).astype(np.float32)
    old = (mu.astype(np.float64) + rng.normal(2e-5, 1e-5, mu.shape)).astype(np.float32)
    mask = np.ones(mu.shape, dtype=bool)
    adv = np.linspace(1.0, 2.0, 16).astype(np.float32)
    w = np.minimum(np.exp(old.astype(np.float64) - mu.astype(np.float64)), 2.0)
    bias = float(np.mean(adv.astype(np.float64) * (w - 1.0).mean(axis=1)))
    m = CorrectionCore(CorrectionConfig(method=TokenTIS())).process(mu, old, mask, np.zeros(16, np.int32), adv).metrics
    assert m["ais/bias"] == pytest.approx(bias, rel=1e-9)
    r = compute_log_ratios(torch.from_numpy(mu), torch.from_numpy(old), torch.from_numpy(mask))
    assert ais_estimate(r, TokenTIS(), torch.from_numpy(adv))["bias"] == pytest.approx(bias, rel=1e-9)


def test_alpha_raw_is_the_same_for_d_scaled_by_1e160_or_1e_minus_160():
    """alpha_raw depends on the d_i only up to a common scale (b**2 and s2 scale alike): equal non-zero
    d_i give 1 at any scale, and a mixed set gives its value at 1e-160 and 1e160 too (b**2 of the raw
    values would underflow to 0 or overflow to inf there)."""
    from system.correction.ais import alpha_of_deltas

    mu = torch.full((4, 3), -1.0, dtype=torch.float64)
    r = compute_log_ratios(mu, mu, torch.ones(4, 3))  # rho = 1: R = 1, n_eff = 4
    equal = torch.full((4,), 1e-300, dtype=torch.float64)
    assert alpha_of_deltas(r, equal)["alpha_raw"] == 1.0
    d = torch.tensor([1.0, 1.2, 0.7, 1.1], dtype=torch.float64)
    # by hand: b = 1.0, s2 = (0 + .04 + .09 + .01) / 4 = .035, noise2 = .035 / 4, alpha_raw = (1 - noise2) / 1
    base = alpha_of_deltas(r, d)
    assert base["alpha_raw"] == pytest.approx(1.0 - 0.035 / 4, rel=1e-12)
    for scale in (1e160, 1e-160):
        scaled = alpha_of_deltas(r, d * scale)
        assert scaled["alpha_raw"] == pytest.approx(base["alpha_raw"], rel=1e-12)
        assert scaled["bias"] == pytest.approx(scale, rel=1e-12)
        assert scaled["noise"] == pytest.approx(scale * math.sqrt(0.035 / 4), rel=1e-12)
