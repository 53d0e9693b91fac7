"""Group-relative advantages of GRPO and Dr.GRPO (spec section 5).

    GRPO:     A_i = (R_i - mean_g(R)) / (std_g(R) + 1e-6)
    Dr.GRPO:  A_i =  R_i - mean_g(R)

where g is the group (prompt) of response i and std_g is the POPULATION standard deviation
(``unbiased=False``, divisor G): a group whose rewards are all equal gets A = 0, and a
single-response group is defined (A = 0). Computed in float64 without a loop over groups;
returned in the rewards' floating dtype (at least float32).

Shapes: the README's suffix legend (B responses).
"""

import torch

from system.config.learner import AdvantageType
from system.registry import Registry, config_types

GRPO_STD_EPS = 1e-6
"""Added to the group std before dividing."""

SCALE_BY_STD: Registry[bool] = Registry("learner.advantage", config_types(AdvantageType), {"grpo": True, "dr-grpo": False})
"""``learner.advantage`` -> whether the group advantage is divided by the group std."""


def group_advantages(rewards_B, group_index_B, scale_by_std: bool) -> torch.Tensor:
    """Rewards centred on their group mean, divided by the group std + 1e-6 when ``scale_by_std``.

    ``group_index_B`` holds any integer id per response (e.g. from ``np.unique(uids,
    return_inverse=True)``); responses with the same id form a group.
    """
    rewards_B = torch.as_tensor(rewards_B).detach()
    group_index_B = torch.as_tensor(group_index_B, device=rewards_B.device)
    if rewards_B.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards_B.shape)}")
    if group_index_B.shape != rewards_B.shape:
        raise ValueError(
            f"group_index has shape {tuple(group_index_B.shape)} but rewards have {tuple(rewards_B.shape)}"
        )
    if group_index_B.is_floating_point() or group_index_B.is_complex():
        raise ValueError(f"group_index must be an integer tensor, got {group_index_B.dtype}")
    out_dtype = torch.promote_types(rewards_B.dtype, torch.float32)
    rewards_B = rewards_B.to(torch.float64)
    _, group_B = torch.unique(group_index_B, return_inverse=True)
    num_groups = int(group_B.max().item()) + 1 if group_B.numel() else 0
    size_G = torch.zeros(num_groups, dtype=torch.float64, device=rewards_B.device)
    size_G.index_add_(0, group_B, torch.ones_like(rewards_B))
    mean_G = torch.zeros_like(size_G).index_add_(0, group_B, rewards_B) / size_G
    centred_B = rewards_B - mean_G[group_B]
    if scale_by_std:
        var_G = torch.zeros_like(size_G).index_add_(0, group_B, centred_B.square()) / size_G
        centred_B = centred_B / (var_G.sqrt()[group_B] + GRPO_STD_EPS)
    return centred_B.to(out_dtype)
