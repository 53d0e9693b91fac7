"""Math-answer reward: 1.0 when the completion's final number equals the reference.

The completion's answer is the number after its last ``####``; without a ``####`` it is the
last number in the text. Numbers compare by value, tolerant of thousands commas and trailing
zeros (``"1,000.0"`` == ``"1000"``). A wrong answer in the well-formed ``#### <number>`` form
earns ``format_bonus`` (0 by default); anything else earns 0.
"""

from collections.abc import Callable

from system.rewards.numbers import last_number, normalise_number, number_after_marker


def math_answer(completion: str, reference: str, format_bonus: float = 0.0) -> float:
    """1.0 if the final number equals ``reference``, ``format_bonus`` if wrong but marked, else 0."""
    marked = number_after_marker(completion)
    raw = marked if marked is not None else last_number(completion)
    want = normalise_number(reference)
    if raw is not None and want is not None and normalise_number(raw) == want:
        return 1.0
    return format_bonus if marked is not None else 0.0


def math_answer_reward(format_bonus: float) -> Callable[[str, str], float]:
    """:func:`math_answer` with ``format_bonus`` bound."""

    def reward(completion: str, reference: str) -> float:
        return math_answer(completion, reference, format_bonus)

    return reward
