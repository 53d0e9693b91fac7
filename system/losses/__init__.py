"""Policy-gradient losses as pure torch functions: advantages, the PPO and CTPO surrogates, their
registry (``learner.loss.type``), aggregation."""

from system.losses.advantages import SCALE_BY_STD, group_advantages
from system.losses.aggregation import AGGREGATION_MODES, AGGREGATIONS, aggregate
from system.losses.ctpo import ctpo_token_loss
from system.losses.policy_gradient import ppo_token_loss
from system.losses.registry import POLICY_LOSSES, policy_token_loss

__all__ = ["AGGREGATIONS", "AGGREGATION_MODES", "POLICY_LOSSES", "SCALE_BY_STD", "aggregate", "ctpo_token_loss",
           "group_advantages", "policy_token_loss", "ppo_token_loss"]
