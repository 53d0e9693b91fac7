"""Math-answer reward: 1.0 when the completion's final number equals the reference.

The completion's answer is the number right after its last ``####`` marker (spaces and a ``$`` may
come between); a completion whose last marker has no number there has no answer (0: the number in
its reasoning before the marker is not taken instead). Without a marker the answer is the last
number in the text. A markdown heading (``#### Step 1: ...`` starting a line, with text after it)
is not a marker (``numbers.answer_marker``). Numbers compare by value, tolerant of thousands
commas and trailing zeros (``"1,000.0"`` == ``"1000"``). A wrong answer in the well-formed
``#### <number>`` form earns ``format_bonus`` (0 by default); anything else earns 0.
"""

from collections.abc import Callable

from system.rewards.numbers import answer_marker, last_number, normalise_number, number_after_marker


def math_answer(completion: str, reference: str, format_bonus: float = 0.0) -> float:
    """1.0 if the final number equals ``reference``, ``format_bonus`` if wrong but marked, else 0."""
    marked = number_after_marker(completion)
    raw = marked if marked is not None or answer_marker(completion) is not None else last_number(completion)
    want = normalise_number(reference)
    if raw is not None and want is not None and normalise_number(raw) == want:
        return 1.0
    return format_bonus if marked is not None else 0.0


def math_answer_reward(format_bonus: float) -> Callable[[str, str], float]:
    """:func:`math_answer` with ``format_bonus`` bound."""

    def reward(completion: str, reference: str) -> float:
        return math_answer(completion, reference, format_bonus)

    return reward
