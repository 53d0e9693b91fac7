"""Scratchpad reward of the long addition task: partial credit for steps and for answer digits.

Both the completion and the reference (``".472+.385|1|5...;...>08585"``, see
:mod:`system.data.scratchpad`) are read the same way: the text before the first ``">"`` is
the scratchpad, split on ``";"`` into pieces (one per step, i.e. per tape line); the answer
is the leading run of digits right after that ``">"`` (empty when there is no ``">"``);
anything after the answer's digits, e.g. tokens sampled after a missing end-of-sequence, is
ignored. With ``P`` the completion's pieces and ``R`` the reference's,

    steps  = (# k where P[k] == R[k]) / max(len(P), len(R))
    answer = (# i where answer[i] == ref_answer[i]) / max(len(answer), len(ref_answer))
    reward = (steps + answer) / 2                            (answer = 0 when it is empty)

so a step counts only when its whole line is right and in place (a missing, extra or wrong
line costs ``1 / (2 max(len(P), len(R)))``), the answer's digits are compared left-aligned as
in :func:`system.rewards.digit_match.digit_match`, and the reward lies in [0, 1]: 1 exactly
for the reference itself, 0 for an unparsable completion (no line right in place and no
answer digit right: ``""``, ``"+="``, free text). The reference of ``"29+56="`` is
``".2+.5|1|5.;..+..|0|85>085"``; against it ``".2+.5|0|5.;..+..|0|75>075"`` (carry dropped:
both lines wrong, answer 2 of 3 digits) scores (0 + 2/3) / 2 = 1/3,
``".2+.5|1|5.;..+..|0|85>086"`` scores (1 + 2/3) / 2 = 5/6, ``".2+.5|1|5.;..+..|0|85"``
(stopped before the answer) (1 + 0) / 2 = 1/2 and ``">085"`` (0 + 1) / 2 = 1/2.
"""

from system.data.scratchpad import ANSWER_MARKER, STEP_SEPARATOR
from system.rewards.digit_match import answer_digits


def split_scratchpad(text: str) -> tuple[list[str], str]:
    """``(pieces, answer digits)`` of ``text``: pieces before the first ``">"``, digits right after it."""
    pad, marker, rest = text.partition(ANSWER_MARKER)
    return pad.split(STEP_SEPARATOR), (answer_digits(rest) if marker else "")


def _in_place(got: list[str] | str, want: list[str] | str) -> float:
    """Fraction of positions where ``got`` and ``want`` agree, over the longer of the two."""
    longest = max(len(got), len(want))
    if not longest:
        return 0.0
    return sum(g == w for g, w in zip(got, want, strict=False)) / longest


def scratchpad_reward(completion: str, reference: str) -> float:
    """Half the fraction of steps right in place plus half the fraction of answer digits right in place."""
    pieces, answer = split_scratchpad(completion)
    ref_steps, ref_answer = split_scratchpad(reference)
    answer_credit = _in_place(answer, ref_answer) if answer else 0.0
    return (_in_place(pieces, ref_steps) + answer_credit) / 2
