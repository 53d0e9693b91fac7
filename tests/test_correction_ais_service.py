"""AIS version 2 state (EMA, per-lag EMAs, JSON round trip, version 1 refused) and the correction
service's AIS metrics and applied weights (spec section 3)."""

import json
import math

import numpy as np
import pytest
import torch
from ais_batches import (  # a helper module beside the tests
    HAND_A,
    HAND_D,
    batch_of,
)

from system.config.correction import (
    AISConfig,
    CorrectionConfig,
    SeqMIS,
)
from system.correction import (
    AdaptiveIS,
    compute_log_ratios,
    compute_weights_and_keep,
)
from system.correction.service import CorrectionCore


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
    # by hand over the 6 valid tokens: w = 2, 0, .5, .5, 1, 1 (sum 5) before AIS and
    # omega = 1 + a, 0, 1 - a/2, 1 - a/2, 1, 1 (sum 1 + a + 2 - a + 2 = 5) after: both means 5/6
    assert m["method_before_ais/weight_mean"] == pytest.approx(5 / 6, rel=1e-6)
    assert m["correction/weight_mean"] == pytest.approx(5 / 6, rel=1e-6)
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
    # no advantages: the batch's AIS values None and the state untouched (refused when AIS is on); the EMA
    # is still logged (spec section 3: every step), unchanged at 31/99
    state = core.state_dict()
    m = core.process(mu, old, mask, lag).metrics
    assert m["ais/bias"] is None and m["ais/alpha_raw"] is None and m["ais/severity"] is not None
    assert m["ais/alpha"] == pytest.approx(31 / 99, rel=1e-6)
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


@pytest.mark.parametrize("fused_pass", [True, False], ids=["fused", "torch"])
def test_service_streams_every_section_1_diagnostic_of_each_lag(fused_pass, monkeypatch):
    """``mismatch_by_lag/<lag>/<key>`` for every section 1 key (as ``summary.json``'s ``by_lag``), equal
    to the plain numpy reference of ``test_correction_reference`` on each lag's rows (it shares no
    code with ``system.correction``), whichever path computes them."""
    from test_correction_reference import TOL, ref_diagnostics

    from system.correction import fused
    from system.correction.diagnostics import DIAGNOSTIC_KEYS

    if fused_pass and not fused.available():
        pytest.skip("the fused pass is not built")
    monkeypatch.setattr(fused, "available", lambda: fused_pass)
    rng = np.random.default_rng(3)
    mu = -rng.exponential(1.0, size=(9, 7)).astype(np.float32)
    old = (mu + rng.normal(0.0, 0.3, size=(9, 7))).astype(np.float32)
    mask = rng.random((9, 7)) < 0.8
    lag = np.array([0, 1, 2, 0, 1, 2, 0, 0, 1], dtype=np.int32)
    metrics = CorrectionCore(CorrectionConfig()).process(mu, old, mask, lag, rng.normal(size=9)).metrics
    for name in ("0", "1", "2"):
        rows = lag == int(name)
        reference = ref_diagnostics(mu[rows], old[rows], mask[rows])
        assert set(reference) == set(DIAGNOSTIC_KEYS)
        for key, value in reference.items():
            got = metrics[f"mismatch_by_lag/{name}/{key}"]
            assert got is not None and got == pytest.approx(float(value), **TOL), (name, key)
