"""CTPO (spec section 4): values by hand, a per-token loop reference, and where the gradient goes."""

import math

import numpy as np
import pytest
import torch

from system.config.learner import CTPOLossConfig
from system.losses import ctpo_token_loss

NAN = float("nan")
CFG = CTPOLossConfig()


def run(delta_BT, adv_B, valid_BT, w_BT, cfg=CFG):
    """CTPO with old = -1 and cur = old + delta (cur a leaf), returning loss, stats and d sum(loss) / d cur."""
    old = torch.full(delta_BT.shape, -1.0, dtype=torch.float64)
    cur = (old + delta_BT).requires_grad_(True)
    loss, stats = ctpo_token_loss(cur, old, adv_B, w_BT, valid_BT, cfg)
    loss.sum().backward()
    return loss.detach(), stats, cur.grad


def test_positive_advantage_by_hand():
    # valid tokens at columns 0, 1, 3 (positions t = 1, 2, 3); column 2 is masked garbage
    delta = torch.tensor([[0.1, 0.1, NAN, -0.3]], dtype=torch.float64)
    valid = torch.tensor([[True, True, False, True]])
    w = torch.tensor([[1.0, 1.0, NAN, 2.0]], dtype=torch.float64)
    loss, stats, grad = run(delta, torch.tensor([1.0], dtype=torch.float64), valid, w)
    # prefix lr = 0.1, 0.2, -0.1; bounds +0.05 sqrt(t), -0.025 sqrt(t)
    # t=1: min(e^.1, e^.05) -> clipped high; t=2: min(e^.2, e^(.05 sqrt 2)) -> clipped high;
    # t=3: -0.1 >= -0.025 sqrt 3 = -0.0433 is not: r = e^-.1 < r_clip, min takes the unclipped r
    want = [-math.exp(0.05), -math.exp(0.05 * math.sqrt(2)), 0.0, -2 * math.exp(-0.1)]
    np.testing.assert_allclose(loss[0].tolist(), want, rtol=1e-12)
    # gradient only where the unclipped term is active: -w A r = -2 e^-.1
    np.testing.assert_allclose(grad[0].tolist(), [0.0, 0.0, 0.0, -2 * math.exp(-0.1)], rtol=1e-12)
    assert stats["clip_frac_high"] == pytest.approx(2 / 3) and stats["clip_frac_low"] == 0.0
    assert stats["clip_frac_dual"] == 0.0 and stats["num_tokens"] == 3
    assert stats["ratio_mean"] == pytest.approx(
        (math.exp(0.1) + math.exp(0.2) + math.exp(-0.1)) / 3
    )
    assert stats["clip_frac_high_by_pos"] == {
        "<=128": 2 / 3,
        "<=512": None,
        "<=2048": None,
        ">2048": None,
    }


def test_negative_advantage_dual_and_low_clip_by_hand():
    delta = torch.tensor([[0.1, 0.1, -0.3]], dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0, 2.0]], dtype=torch.float64)
    loss, stats, grad = run(
        delta, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool), w
    )
    # A < 0: obj = -max(r, r_clip), then max(obj, -e^(0.05 sqrt t)).
    # t=1: -e^.1 < -e^.05 -> dual; t=2: -e^.2 < -e^(.05 sqrt 2) -> dual;
    # t=3: -max(e^-.1, e^(-.025 sqrt 3)) = -e^(-.025 sqrt 3) (low clip) > -e^(.05 sqrt 3)
    want = [math.exp(0.05), math.exp(0.05 * math.sqrt(2)), 2 * math.exp(-0.025 * math.sqrt(3))]
    np.testing.assert_allclose(loss[0].tolist(), want, rtol=1e-12)
    assert grad.abs().max() == 0.0  # every token is clipped
    assert stats["clip_frac_dual"] == pytest.approx(2 / 3)
    assert stats["clip_frac_low"] == pytest.approx(1 / 3) and stats["clip_frac_high"] == 0.0


def test_prefix_cap_and_per_token_clamp():
    # cur - old = 6, 6, -50: prefix 6, 12 (capped to 10), then 12 - 20 = -8 (step clamped to -20)
    cfg = CTPOLossConfig(c_hi=100.0, c_lo=100.0)  # bounds far away: no clipping
    delta = torch.tensor([[6.0, 6.0, -50.0]], dtype=torch.float64)
    loss, stats, grad = run(
        delta,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.bool),
        torch.ones(1, 3, dtype=torch.float64),
        cfg,
    )
    np.testing.assert_allclose(
        loss[0].tolist(), [-math.exp(6), -math.exp(10), -math.exp(-8)], rtol=1e-12
    )
    np.testing.assert_allclose(
        grad[0].tolist(), [-math.exp(6), -math.exp(10), -math.exp(-8)], rtol=1e-12
    )


def ref_ctpo(delta, adv, valid, w, cfg=CFG):
    """Loop reference: loss and d loss[i,t] / d cur[i,t] (only the current token carries gradient)."""
    loss, grad = np.zeros(delta.shape), np.zeros(delta.shape)
    for i in range(delta.shape[0]):
        prefix, t, A = 0.0, 0, adv[i]
        for s in range(delta.shape[1]):
            if not valid[i, s]:
                continue
            t += 1
            prefix += min(max(delta[i, s], -20.0), 20.0)
            lr = min(prefix, 10.0)
            lo, hi = -cfg.c_lo * t**cfg.p, cfg.c_hi * t**cfg.p
            lrc = min(max(lr, lo), hi)
            r, rc = math.exp(lr), math.exp(lrc)
            obj, g = (
                (r * A, A * r) if r * A <= rc * A else (rc * A, A * r if lo <= lr <= hi else 0.0)
            )
            if A < 0 and math.exp(cfg.c_dual * t**cfg.p) * A > obj:
                obj, g = math.exp(cfg.c_dual * t**cfg.p) * A, 0.0
            loss[i, s], grad[i, s] = -w[i, s] * obj, -w[i, s] * g
    return loss, grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference_and_gradient_reaches_only_the_current_token(seed):
    rng = np.random.default_rng(seed)
    B, T = 4, 9
    delta = rng.normal(0, 0.08, size=(B, T))
    valid = rng.random((B, T)) < 0.8
    adv = np.array([1.3, -0.7, 0.0, -2.0])
    w = rng.uniform(0, 2, size=(B, T))
    cfg = CTPOLossConfig(c_lo=0.05, c_hi=0.1, c_dual=0.15, p=0.5)
    want_loss, want_grad = ref_ctpo(delta, adv, valid, w, cfg)
    old = torch.from_numpy(-rng.exponential(size=(B, T)))
    cur = (old + torch.from_numpy(delta)).requires_grad_(True)
    args = (old, torch.from_numpy(adv), torch.from_numpy(w), torch.from_numpy(valid), cfg)
    loss, _ = ctpo_token_loss(cur, *args)
    np.testing.assert_allclose(loss.detach().numpy(), want_loss, rtol=1e-10, atol=1e-12)
    # full Jacobian d loss[i, t] / d cur[j, s]: diagonal only, equal to the reference
    jac = torch.autograd.functional.jacobian(lambda c: ctpo_token_loss(c, *args)[0], cur.detach())
    jac = jac.reshape(B * T, B * T).numpy()
    np.testing.assert_allclose(np.diag(jac), want_grad.reshape(-1), rtol=1e-10, atol=1e-12)
    assert np.count_nonzero(jac - np.diag(np.diag(jac))) == 0
    assert np.count_nonzero(want_grad) > 0  # the test does exercise a gradient


def test_non_finite_inputs_stay_out_of_loss_and_gradient():
    cur = torch.tensor([[-1.0, NAN, -2.0, -float("inf")]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.0, NAN, -1.0]])
    valid = torch.tensor([[True, True, True, False]])
    loss, stats = ctpo_token_loss(cur, old, torch.tensor([1.0]), torch.ones(1, 4), valid, CFG)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(cur.grad).all()
    assert loss[0, 1:].tolist() == [0.0, 0.0, 0.0] and cur.grad[0, 1:].tolist() == [0.0, 0.0, 0.0]
    assert stats["num_tokens"] == 1


def test_position_buckets_and_all_masked():
    T = 200
    delta = torch.full(
        (1, T), 0.5, dtype=torch.float64
    )  # lr = 0.5 t is above 0.05 sqrt(t) everywhere
    _, stats, _ = run(
        delta,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, T, dtype=torch.bool),
        torch.ones(1, T, dtype=torch.float64),
    )
    assert stats["clip_frac_high_by_pos"] == {
        "<=128": 1.0,
        "<=512": 1.0,
        "<=2048": None,
        ">2048": None,
    }
    loss, stats, grad = run(
        delta,
        torch.tensor([1.0], dtype=torch.float64),
        torch.zeros(1, T, dtype=torch.bool),
        torch.ones(1, T, dtype=torch.float64),
    )
    assert loss.abs().sum() == 0 and grad.abs().sum() == 0 and stats["clip_frac_high"] is None


def test_bad_shapes_raise_value_error():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        ctpo_token_loss(x, x, torch.zeros(3), x, x.bool(), CFG)
    with pytest.raises(ValueError, match="weights"):
        ctpo_token_loss(x, x, torch.zeros(2), torch.zeros(2, 4), x.bool(), CFG)
