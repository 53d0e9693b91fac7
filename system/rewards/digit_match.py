"""Digit-match reward of the arithmetic task: partial credit for digits right in place.

The answer is the leading run of digits of the completion (after leading whitespace); what
follows it, e.g. tokens generated after a missing end-of-sequence, is ignored. Digits are
compared **left-aligned**: the i-th answer digit with the i-th reference digit, in the
order they are generated, so the credit a digit earns never depends on tokens sampled
after it (a clean per-token signal for RL). With

    reward = (# positions i where answer[i] == reference[i]) / max(len(answer), len(reference))

an exact answer scores 1.0, each wrong, missing or extra digit costs ``1 / max_len``, and an
empty or non-numeric answer scores 0. Reference ``"82"``: ``"82"`` -> 1, ``"72"`` -> 0.5,
``"8"`` -> 0.5, ``"821"`` -> 2/3, ``"182"`` -> 0, ``"+="`` -> 0.
"""

import re

_LEADING_DIGITS = re.compile(r"\s*(\d*)")


def answer_digits(completion: str) -> str:
    """The leading run of digits of ``completion`` ("" when it does not start with one)."""
    return _LEADING_DIGITS.match(completion).group(1)


def digit_match(completion: str, reference: str) -> float:
    """Fraction of left-aligned digit positions that agree, over the longer of the two."""
    answer = answer_digits(completion)
    if not answer or not reference:
        return 0.0
    matches = sum(a == r for a, r in zip(answer, reference, strict=False))
    return matches / max(len(answer), len(reference))
