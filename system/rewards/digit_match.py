"""Digit-match reward of the arithmetic task: partial credit for digits right in place.

The answer is the leading run of digits of the completion (after leading whitespace); what
follows it, e.g. tokens generated after a missing end-of-sequence, is ignored. Digits are
compared **right-aligned** (units with units, tens with tens, as in written addition), and

    reward = (# positions where answer and reference digits agree) / max(len(answer), len(reference))

so an exact answer scores 1.0, a wrong or extra digit costs ``1 / max_len``, and an empty or
non-numeric answer scores 0. Example: reference ``"82"``: ``"82"`` -> 1, ``"72"`` -> 0.5,
``"182"`` -> 2/3, ``"8"`` -> 0 (its ``8`` sits in the units place), ``"+="`` -> 0.
"""

import re

_LEADING_DIGITS = re.compile(r"\s*(\d*)")


def answer_digits(completion: str) -> str:
    """The leading run of digits of ``completion`` ("" when it does not start with one)."""
    return _LEADING_DIGITS.match(completion).group(1)


def digit_match(completion: str, reference: str) -> float:
    """Fraction of right-aligned digit positions that agree, over the longer of the two."""
    answer = answer_digits(completion)
    if not answer or not reference:
        return 0.0
    matches = sum(a == r for a, r in zip(reversed(answer), reversed(reference), strict=False))
    return matches / max(len(answer), len(reference))
