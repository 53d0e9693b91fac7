"""GRPO / Dr.GRPO group advantages (spec section 5) by hand and against a loop reference."""

import math

import numpy as np
import pytest
import torch

from system.losses import group_advantages


def test_grpo_by_hand_uses_the_population_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 3.0, 2.0])
    groups = torch.tensor([7, 7, 7, 7, 2, 2, 9])
    got = group_advantages(rewards, groups, scale_by_std=True).tolist()
    # group 7: mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-6)
    # group 2: mean 4, population std 1 -> +-1 / (1 + 1e-6); group 9 (alone): 0 / (0 + 1e-6) = 0
    a, b = 0.5 / (0.5 + 1e-6), 1 / (1 + 1e-6)
    np.testing.assert_allclose(got, [a, -a, -a, a, b, -b, 0.0], rtol=1e-6)


def test_dr_grpo_only_centres():
    got = group_advantages(
        torch.tensor([1.0, 0.0, 0.0, 5.0, 3.0]), torch.tensor([0, 0, 0, 1, 1]), scale_by_std=False
    )
    np.testing.assert_allclose(got.tolist(), [2 / 3, -1 / 3, -1 / 3, 1.0, -1.0], rtol=1e-6)


def test_equal_rewards_give_zero_and_dtypes():
    got = group_advantages(np.array([2.0, 2.0, 2.0]), np.array([4, 4, 4]), scale_by_std=True)
    assert got.tolist() == [0.0, 0.0, 0.0] and got.dtype == torch.float64
    assert (
        group_advantages(
            torch.ones(2, dtype=torch.float16), torch.zeros(2, dtype=torch.int32), True
        ).dtype
        == torch.float32
    )
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.int64), True).numel() == 0


@pytest.mark.parametrize("scale", [True, False])
def test_matches_a_per_group_loop(scale):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=40)
    groups = rng.integers(100, 110, size=40)
    want = np.empty(40)
    for g in set(groups.tolist()):
        idx = [i for i in range(40) if groups[i] == g]
        r = rewards[idx]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / len(r))
        want[idx] = [(x - mean) / (std + 1e-6) if scale else x - mean for x in r]
    np.testing.assert_allclose(
        group_advantages(rewards, groups, scale).numpy(), want, rtol=1e-12, atol=1e-12
    )


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.int64), True)
    with pytest.raises(ValueError, match="group_index"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.int64), True)
    with pytest.raises(ValueError, match="integer"):
        group_advantages(torch.zeros(3), torch.zeros(3), True)
