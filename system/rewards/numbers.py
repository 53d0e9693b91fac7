"""Finding and comparing numeric answers in free text (GSM8K's ``#### <number>`` convention).

A number is an optional minus sign, digits with optional thousands commas, and an optional
decimal part: ``-1,234.50``. Two numbers are equal when their values are, so ``"1,000"``,
``"1000"`` and ``"1000.0"`` are one answer.
"""

import re
from decimal import Decimal, InvalidOperation

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
"""A number in text; commas are allowed anywhere after the first digit."""

MARKER = "####"
"""GSM8K's final-answer marker."""


def normalise_number(text: str) -> str | None:
    """Canonical decimal string of ``text`` (``"1,000.0"`` -> ``"1000"``), None if not a number."""
    cleaned = text.strip().replace(",", "")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == 0:
        return "0"
    if value == value.to_integral_value():
        return str(value.quantize(Decimal(1)))
    return format(value.normalize(), "f")


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
