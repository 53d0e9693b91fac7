"""The reward registry: ``build_reward(cfg)`` picks the reward function by ``cfg.type``."""

from collections.abc import Callable

from system.config.data import DigitMatchReward, MathAnswerReward, ScratchpadReward
from system.rewards.digit_match import digit_match
from system.rewards.math_answer import math_answer_reward
from system.rewards.scratchpad import scratchpad_reward

RewardFn = Callable[[str, str], float]
"""``reward(completion_text, reference) -> float``."""

_BUILDERS: dict[str, Callable[..., RewardFn]] = {
    "digit-match": lambda cfg: digit_match,
    "math-answer": lambda cfg: math_answer_reward(cfg.format_bonus),
    "scratchpad": lambda cfg: scratchpad_reward,
}


def build_reward(cfg: DigitMatchReward | MathAnswerReward | ScratchpadReward) -> RewardFn:
    """The reward function of ``cfg`` (``data.reward``)."""
    builder = _BUILDERS.get(cfg.type)
    if builder is None:
        raise ValueError(f"data.reward.type {cfg.type!r} is not one of {sorted(_BUILDERS)}")
    return builder(cfg)
