"""The registry from ``learner.loss.type`` to its per-token policy surrogate (spec sections 4, 5).

Every entry has one signature,

    loss_fn(current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT, cfg) -> (loss_BT, stats)

with ``weights_BT`` the detached correction weights ``w`` and ``valid_BT`` the valid tokens.
"""

from collections.abc import Callable

import torch

from system.config.learner import CTPOLossConfig, PPOLossConfig
from system.correction.ctpo import ctpo_token_loss
from system.losses.policy_gradient import ppo_token_loss

LossOutput = tuple[torch.Tensor, dict]


def _ppo(cur_BT, old_BT, adv_B, w_BT, valid_BT, cfg: PPOLossConfig) -> LossOutput:
    return ppo_token_loss(cur_BT, old_BT, adv_B, w_BT, valid_BT, cfg.eps_lo, cfg.eps_hi)


def _ctpo(cur_BT, old_BT, adv_B, w_BT, valid_BT, cfg: CTPOLossConfig) -> LossOutput:
    return ctpo_token_loss(cur_BT, old_BT, adv_B, valid_BT, w_BT, cfg)


POLICY_LOSSES: dict[str, Callable[..., LossOutput]] = {"ppo": _ppo, "ctpo": _ctpo}


def policy_token_loss(
    current_logp_BT: torch.Tensor,
    proximal_logp_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    weights_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    cfg: PPOLossConfig | CTPOLossConfig,
) -> LossOutput:
    """Per-token loss ``l_BT`` and the surrogate's stats, chosen by ``cfg.type``."""
    if cfg.type not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {cfg.type!r}; known: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[cfg.type](current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT, cfg)
