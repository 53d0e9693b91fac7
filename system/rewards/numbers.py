"""Finding and comparing numeric answers in free text (GSM8K's ``#### <number>`` convention).

A number is an optional minus sign, digits with optional thousands commas, and an optional
decimal part: ``-1,234.50``. Two numbers are equal when their values are, so ``"1,000"``,
``"1000"`` and ``"1000.0"`` are one answer.
"""

import decimal
import re
from decimal import Decimal

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
"""A number in text; commas are allowed anywhere after the first digit."""

MARKER = "####"
"""GSM8K's final-answer marker."""


def normalise_number(text: str) -> str | None:
    """Canonical decimal string of ``text`` (``"1,000.0"`` -> ``"1000"``), None if not a number.

    Exact at any length (the context's precision covers every digit: a degenerate completion's
    run of 30 digits is a number, not an ``InvalidOperation`` that would fail the rollout)."""
    cleaned = text.strip().replace(",", "")
    with decimal.localcontext() as ctx:
        ctx.prec = max(28, len(cleaned) + 2)
        try:
            value = Decimal(cleaned)
            if not value.is_finite():
                return None
            if value == 0:
                return "0"
            if value == value.to_integral_value():
                return str(value.quantize(Decimal(1)))
            return format(value.normalize(), "f")
        except ArithmeticError:  # InvalidOperation and its kin: not a number we can compare
            return None


def number_after_marker(text: str) -> str | None:
    """The first number after the last ``####`` in ``text``, None when there is none."""
    head, marker, tail = text.rpartition(MARKER)
    if not marker:
        return None
    match = NUMBER.search(tail)
    return match.group(0) if match else None


def last_number(text: str) -> str | None:
    """The last number anywhere in ``text``, None when there is none."""
    matches = NUMBER.findall(text)
    return matches[-1] if matches else None
