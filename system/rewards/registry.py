"""The reward registry: ``build_reward(cfg)`` picks the reward function by ``cfg.type``."""

from collections.abc import Callable

from system.config.data import DigitMatchReward, MathAnswerReward, RewardConfig, ScratchpadReward
from system.registry import Registry, config_types
from system.rewards.digit_match import digit_match
from system.rewards.math_answer import math_answer_reward
from system.rewards.scratchpad import scratchpad_reward

RewardFn = Callable[[str, str], float]
"""``reward(completion_text, reference) -> float``."""

REWARDS: Registry[Callable[..., RewardFn]] = Registry("data.reward.type", config_types(RewardConfig), {
    "digit-match": lambda cfg: digit_match,
    "math-answer": lambda cfg: math_answer_reward(cfg.format_bonus),
    "scratchpad": lambda cfg: scratchpad_reward,
})
"""Reward builders (``cfg -> reward function``) keyed by ``data.reward.type``."""


def build_reward(cfg: DigitMatchReward | MathAnswerReward | ScratchpadReward) -> RewardFn:
    """The reward function of ``cfg`` (``data.reward``)."""
    return REWARDS[cfg.type](cfg)
