"""Policy-gradient losses as pure torch functions: advantages, the PPO surrogate, aggregation."""

from system.losses.advantages import group_advantages
from system.losses.aggregation import AGGREGATION_MODES, AGGREGATIONS, aggregate
from system.losses.policy_gradient import ppo_token_loss

__all__ = ["AGGREGATIONS", "AGGREGATION_MODES", "aggregate", "group_advantages", "ppo_token_loss"]
