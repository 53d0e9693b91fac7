"""AIS (spec section 3): the stateless diagnostics by hand, the alpha recursion, omega, the state."""

import json
import math

import numpy as np
import pytest
import torch

from system.config.correction import AISConfig
from system.correction import AdaptiveIS, ais_diagnostics, compute_log_ratios

NAN = float("nan")


def diag(severity, reliability=1.0, variance=0.0):
    return {"severity": severity, "reliability": reliability, "variance_amplification": variance}


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
    assert ais_diagnostics(empty) == diag(None, None, None)


def test_warmup_then_gate_then_ema_by_hand():
    ais = AdaptiveIS(AISConfig(enabled=True, warmup_batches=3))
    for s in (0.1, 0.2, 0.3):
        out = ais.update(diag(s, 0.8, 0.5))
        assert out["alpha"] == 0.0 and out["alpha_raw"] == 0.0 and out["gate"] == 0.0
    assert out["s_ref"] == pytest.approx(0.2)  # mean of the K = 3 warm-up severities
    out = ais.update(diag(0.3, 0.8, 0.5))
    # gate = (0.3 - 0.2) / ((2 - 1) * 0.2) = 0.5; alpha_raw = 0.5 * 0.8 / (1 + 0.25) = 0.32
    assert out["gate"] == pytest.approx(0.5) and out["alpha_raw"] == pytest.approx(0.32)
    assert out["alpha"] == pytest.approx(0.1 * 0.32)  # 0.9 * 0 + 0.1 * 0.32
    out = ais.update(diag(0.5, 1.0, 0.0))  # gate clips to 1, alpha_raw = 1
    assert out["gate"] == 1.0 and out["alpha_raw"] == 1.0
    assert out["alpha"] == pytest.approx(0.9 * 0.032 + 0.1)
    out = ais.update(diag(0.1, 1.0, 0.0))  # below S_ref: gate 0, alpha decays
    assert out["gate"] == 0.0 and out["alpha"] == pytest.approx(0.9 * (0.9 * 0.032 + 0.1))
    assert set(out) == {
        "alpha",
        "alpha_raw",
        "gate",
        "severity",
        "reliability",
        "variance_amplification",
        "s_ref",
    }


def test_no_mismatch_keeps_alpha_raw_zero():
    ais = AdaptiveIS(AISConfig(warmup_batches=2))
    mu = torch.tensor([[-1.0, -2.0], [-0.1, -3.0]])
    d = ais.diagnostics(compute_log_ratios(mu, mu, torch.ones(2, 2)))
    assert d == diag(0.0, 1.0, 0.0)
    outs = [ais.update(d) for _ in range(6)]
    assert all(o["alpha_raw"] == 0.0 and o["alpha"] == 0.0 for o in outs)


def test_alpha_rises_when_severity_grows():
    def run(severities):
        ais = AdaptiveIS(AISConfig(warmup_batches=2))
        return [ais.update(diag(s, 0.9, 0.3))["alpha"] for s in severities]

    growing = run([0.1, 0.1, 0.11, 0.12, 0.14, 0.16, 0.19])
    assert all(b > a for a, b in zip(growing[2:], growing[3:], strict=False)) and growing[2] > 0
    flat = run([0.1, 0.1, 0.11, 0.11, 0.11, 0.11, 0.11])
    assert growing[-1] > flat[-1]  # same history up to batch 3, then more severity -> more alpha


def test_an_empty_batch_leaves_the_state_untouched():
    ais = AdaptiveIS(AISConfig(warmup_batches=1))
    ais.update(diag(0.1))
    ais.update(diag(0.3))
    before = ais.state_dict()
    out = ais.update(diag(None, None, None))
    assert (
        ais.state_dict() == before and out["alpha"] == before["alpha"] and out["alpha_raw"] == 0.0
    )


def test_state_dict_round_trip_continues_identically():
    rng = np.random.default_rng(0)
    stream = [diag(float(s), float(r), float(v)) for s, r, v in rng.random((25, 3))]
    a = AdaptiveIS(AISConfig(warmup_batches=4))
    for d in stream[:7]:
        a.update(d)
    b = AdaptiveIS(AISConfig(warmup_batches=4))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # through JSON, as in a checkpoint
    for d in stream[7:]:
        assert a.update(d) == b.update(d)
    # restored in the middle of the warm-up too
    c, e = AdaptiveIS(AISConfig(warmup_batches=4)), AdaptiveIS(AISConfig(warmup_batches=4))
    c.update(stream[0])
    e.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert [c.update(d) for d in stream[1:9]] == [e.update(d) for d in stream[1:9]]


def test_omega_by_hand_and_its_bound():
    w = torch.tensor([[0.0, 0.5, 1.0, 3.0], [2.0, 7.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, True, True], [True, False, False, False]])
    omega = AdaptiveIS.omega(w, valid, 0.25)
    # 1 + 0.25 (w - 1): 0.75, 0.875, 1, 1.5 | 1.25, then 0 where not valid
    assert omega.tolist() == [[0.75, 0.875, 1.0, 1.5], [1.25, 0.0, 0.0, 0.0]]
    assert AdaptiveIS.omega(w, valid, 0.0).tolist() == valid.float().tolist()
    assert AdaptiveIS.omega(w, valid, 1.0).tolist() == (w * valid).tolist()
    big = torch.rand(50, 50, dtype=torch.float64) * 1e6
    for alpha in (0.0, 0.3, 0.999999, 1.0):
        assert AdaptiveIS.omega(big, torch.ones(50, 50, dtype=torch.bool), alpha).max() <= max(
            1.0, big.max()
        )
    with pytest.raises(ValueError, match="alpha"):
        AdaptiveIS.omega(w, valid, 1.5)
    with pytest.raises(ValueError, match="shape|differ"):
        AdaptiveIS.omega(w, valid[:, :2], 0.5)
