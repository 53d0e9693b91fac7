"""Math-answer reward: 1.0 when the completion's final number equals the reference.

The completion's answer is the number right after its last ``####`` marker (spaces, an answer label,
bold, ``\\boxed{`` and a ``$`` may come between: ``#### Final Answer: $18``); a completion whose last
marker has no number there has no answer (0: the number in its reasoning before the marker is not
taken instead). Without a marker the answer is the last number in the text. A markdown heading
(``#### Step 1: ...`` starting a line, with text after it, or a list of numbered ones) is not a
marker (``numbers.final_answer``). Numbers compare by value, tolerant of thousands
commas and trailing zeros (``"1,000.0"`` == ``"1000"``). A wrong answer in the well-formed
``#### <number>`` form earns ``format_bonus`` (0 by default); anything else earns 0.
"""

from collections.abc import Callable

from system.rewards.numbers import final_answer, normalise_number


def math_answer(completion: str, reference: str, format_bonus: float = 0.0) -> float:
    """1.0 if the final number equals ``reference``, ``format_bonus`` if wrong but marked, else 0."""
    marked, raw = final_answer(completion)
    want = normalise_number(reference)
    if raw is not None and want is not None and normalise_number(raw) == want:
        return 1.0
    return format_bonus if marked and raw is not None else 0.0


def math_answer_reward(format_bonus: float) -> Callable[[str, str], float]:
    """:func:`math_answer` with ``format_bonus`` bound."""

    def reward(completion: str, reference: str) -> float:
        return math_answer(completion, reference, format_bonus)

    return reward
