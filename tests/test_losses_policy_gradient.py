"""The weighted PPO surrogate (spec section 5): values and gradients by hand, NaN safety."""

import math

import numpy as np
import pytest
import torch

from system.config.learner import PPOLossConfig
from system.losses import aggregate, ppo_token_loss

NAN = float("nan")


def run(log_ratio, adv, w, valid, eps_lo=0.2, eps_hi=0.28):
    old = torch.full(log_ratio.shape, -2.0, dtype=torch.float64)
    cur = (old + log_ratio).requires_grad_(True)
    loss, stats = ppo_token_loss(cur, old, adv, w, valid, PPOLossConfig(eps_lo=eps_lo, eps_hi=eps_hi))
    loss.sum().backward()
    return loss.detach(), stats, cur.grad


def test_values_gradients_and_stats_by_hand():
    # r = e^x for x = log 1.5, log 0.9, log 0.5, log 1.1; A = +2 on row 0, -1 on row 1
    x = torch.tensor(
        [[math.log(1.5), math.log(0.9)], [math.log(0.5), math.log(1.1)]], dtype=torch.float64
    )
    w = torch.tensor([[1.0, 0.5], [2.0, 1.0]], dtype=torch.float64)
    loss, stats, grad = run(
        x, torch.tensor([2.0, -1.0], dtype=torch.float64), w, torch.ones(2, 2, dtype=torch.bool)
    )
    # (0,0): A>0, r=1.5 > 1.28: min(3.0, 2.56) = 2.56 clipped -> loss -2.56, grad 0
    # (0,1): A>0, r=0.9 inside: -0.5 * 0.9 * 2 = -0.9, grad -w A r = -0.9
    # (1,0): A<0, r=0.5 < 0.8: min(-0.5, -0.8) = -0.8 clipped -> loss 2 * 0.8 = 1.6, grad 0
    # (1,1): A<0, r=1.1: min(-1.1, -1.1) -> loss 1.1, grad -w A r = 1.1
    np.testing.assert_allclose(loss.tolist(), [[-2.56, -0.9], [1.6, 1.1]], rtol=1e-12)
    np.testing.assert_allclose(grad.tolist(), [[0.0, -0.9], [0.0, 1.1]], rtol=1e-12, atol=1e-15)
    assert (
        stats["clip_frac"] == 0.5
        and stats["clip_frac_high"] == 0.25
        and stats["clip_frac_low"] == 0.25
    )
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.9 + 0.5 + 1.1) / 4)
    logs = [math.log(v) for v in (1.5, 0.9, 0.5, 1.1)]
    assert stats["approx_kl_k1"] == pytest.approx(-sum(logs) / 4)
    assert stats["approx_kl"] == pytest.approx(sum(math.exp(v) - 1 - v for v in logs) / 4)


def test_symmetric_eps_and_zero_advantage():
    x = torch.tensor([[math.log(1.25), math.log(0.75)]], dtype=torch.float64)
    loss, stats, grad = run(
        x,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.bool),
        0.2,
        0.2,
    )
    np.testing.assert_allclose(loss.tolist(), [[-1.2, -0.75]], rtol=1e-12)  # 1.25 clips to 1.2
    loss, stats, grad = run(
        x,
        torch.tensor([0.0], dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.bool),
    )
    assert loss.abs().sum() == 0 and grad.abs().sum() == 0 and stats["clip_frac"] == 0.0


def test_nan_safe_in_values_and_gradients():
    cur = torch.tensor(
        [[-1.0, NAN, -2.0, -float("inf")], [-1.0, -1.0, -1.0, -1.0]], requires_grad=True
    )
    old = torch.tensor([[-1.0, -1.0, NAN, -1.0], [NAN, NAN, NAN, NAN]])
    w = torch.tensor([[1.0, 1.0, 1.0, NAN], [NAN] * 4])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    loss, stats = ppo_token_loss(cur, old, torch.tensor([1.0, -1.0]), w, valid, PPOLossConfig(eps_lo=0.2, eps_hi=0.28))
    out = aggregate(loss, valid, "token-mean")
    out.backward()
    assert torch.isfinite(loss).all() and torch.isfinite(out) and torch.isfinite(cur.grad).all()
    # only (0, 0) is usable: r = 1, loss -1; it is the only token with a gradient
    assert loss.tolist() == [[-1.0, 0.0, 0.0, 0.0], [0.0] * 4] and stats["num_tokens"] == 1
    assert cur.grad[0, 0] != 0 and cur.grad.abs().sum() == cur.grad[0, 0].abs()


def test_extreme_ratios_stay_finite():
    x = torch.tensor([[500.0, -500.0, 30.0]], dtype=torch.float64)
    loss, stats, grad = run(
        x,
        torch.tensor([-1.0], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.bool),
    )
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert loss[0, 0].item() == pytest.approx(math.exp(20.0))  # log-ratio clamped to 20 before exp


def test_all_masked_gives_zero_loss_and_none_stats():
    loss, stats, grad = run(
        torch.zeros(2, 3, dtype=torch.float64),
        torch.ones(2, dtype=torch.float64),
        torch.ones(2, 3, dtype=torch.float64),
        torch.zeros(2, 3, dtype=torch.bool),
    )
    assert loss.abs().sum() == 0 and grad.abs().sum() == 0
    assert stats["num_tokens"] == 0 and stats["clip_frac"] is None and stats["approx_kl"] is None


def test_bad_shapes_raise_value_error():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        ppo_token_loss(x, x, torch.zeros(2, 1), x, x.bool())
    with pytest.raises(ValueError, match="valid"):
        ppo_token_loss(x, x, torch.zeros(2), x, torch.ones(3, 2, dtype=torch.bool))


def test_the_ratio_outside_the_band_on_the_unclipped_side_keeps_its_gradient_and_is_no_clip():
    """PPO's min takes the unclipped term where clipping would not lower the objective: A > 0 with
    r < 1 - eps_lo, and A < 0 with r > 1 + eps_hi (a review found no token of either kind in the
    hand test, so counting every out-of-band token as clipped would have passed).
    (0,0): A = +1, r = 0.5: min(0.5, 0.8) = 0.5 -> loss -0.5 (w = 1), grad -w A r = -0.5
    (1,0): A = -1, r = 1.5: min(-1.5, -1.28) = -1.5 -> loss +1.5, grad -w A r = +1.5
    Neither is clipped: clip_frac = clip_frac_low = clip_frac_high = 0."""
    x = torch.tensor([[math.log(0.5)], [math.log(1.5)]], dtype=torch.float64)
    loss, stats, grad = run(x, torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64),
                            torch.ones(2, 1, dtype=torch.bool))
    np.testing.assert_allclose(loss.tolist(), [[-0.5], [1.5]], rtol=1e-12)
    np.testing.assert_allclose(grad.tolist(), [[-0.5], [1.5]], rtol=1e-12)
    assert stats["clip_frac"] == stats["clip_frac_low"] == stats["clip_frac_high"] == 0.0
