"""The one registry of policy losses: ``learner.loss.type`` (the config's discriminated union) -> surrogate.

Every surrogate has one signature (spec sections 4 and 5)::

    loss_fn(current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT, cfg) -> (loss_BT, stats)

with ``weights_BT`` the detached correction weights ``w``, ``valid_BT`` the valid tokens and
``cfg`` the union member of ``learner.loss``.
"""

from collections.abc import Callable

import torch

from system.config.learner import CTPOLossConfig, LossConfig, PPOLossConfig
from system.losses.ctpo import ctpo_token_loss
from system.losses.policy_gradient import ppo_token_loss
from system.registry import Registry, config_types

LossOutput = tuple[torch.Tensor, dict]

POLICY_LOSSES: Registry[Callable[..., LossOutput]] = Registry(
    "learner.loss.type", config_types(LossConfig), {"ppo": ppo_token_loss, "ctpo": ctpo_token_loss})
"""Per-token surrogates keyed by ``learner.loss.type``."""


def policy_token_loss(
    current_logp_BT: torch.Tensor,
    proximal_logp_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    weights_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    cfg: PPOLossConfig | CTPOLossConfig,
) -> LossOutput:
    """Per-token loss ``l_BT`` and the surrogate's stats, chosen by ``cfg.type``."""
    return POLICY_LOSSES[cfg.type](current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT, cfg)
