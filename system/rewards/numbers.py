"""Finding and comparing numeric answers in free text (GSM8K's ``#### <number>`` convention).

A number is an optional minus sign (``-`` or the typographic ``\u2212``), digits (thousands
commas only between groups of three: ``1,234``), and an optional decimal part: ``-1,234.50``. It
stands alone: not inside a fraction (``3/4``), an exponent (``5e3``), a hex literal (``0x10``), a
list (``1,2,3``) or after a Latin letter (``x2``), none of which is a number here; a unit after it
is fine (``42km``). Two numbers are equal when
their values are, so ``"1,000"``, ``"1000"`` and ``"1000.0"`` are one answer.
"""

import decimal
import re
from decimal import Decimal

MINUS = "\u2212"
"""The typographic minus sign, read as ``-``."""

NUMBER = re.compile(r"(?<![A-Za-z0-9_.,/\-\u2212])[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
                    r"(?![0-9/]|[.,]\d|[eE][-+]?\d|[xX][0-9A-Fa-f])")
"""A number standing alone in text (module docstring): no ASCII letter, digit, fraction bar, list or
longer number right before it; after it no digit, fraction bar, decimal or list continuation,
exponent or hex digits. A unit or a word in any script may follow (``42km``, ``42个``), any script
but Latin may precede (``答案是42``); a sentence's full stop or comma after it is fine."""

MARKER = "####"
"""GSM8K's final-answer marker."""


def normalise_number(text: str) -> str | None:
    """Canonical decimal string of ``text`` (``"1,000.0"`` -> ``"1000"``), None if not a number.

    Exact at any length (the context's precision covers every digit: a degenerate completion's
    run of 30 digits is a number, not an ``InvalidOperation`` that would fail the rollout)."""
    cleaned = text.strip().replace(",", "").replace(MINUS, "-")
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


_MARKS = re.compile(r"(?<!#)####(?!#)")
"""Exactly four ``#``: five or more open a deeper markdown heading, never an answer."""

_HEADING = re.compile(r"[ \t]+(?:[^\s\d$\-\u2212]|\d+[.)][ \t]+[^\W\d_])")
"""After a ``####`` at a line's start: white space, then anything but a number (``#### Step 1: ...``,
``#### **Step 1**``), or a numbered title (``#### 2. Add the pears``)."""

_BEFORE_NUMBER = re.compile(r"[ \t]*\$?[ \t]*")
"""What may stand between the marker and its number: spaces and a dollar sign (``#### $1,234``)."""


def answer_marker(text: str) -> int | None:
    """Where the text after the last answer marker starts, None when ``text`` has none.

    A marker is ``####`` (exactly four), except a markdown heading: a ``####`` that starts a line
    (up to three spaces before it), is followed by a title rather than a number (:data:`_HEADING`),
    and has more text on the lines after it (``#### Step 1: cost of the apples``, which instruct
    models write). A ``####`` ending the
    completion with words after it (``... 27 in all.\n#### unknown``) is a marker with no number."""
    for match in reversed(list(_MARKS.finditer(text))):
        line_start = text.rfind("\n", 0, match.start()) + 1
        at_line_start = not text[line_start:match.start()].strip(" ") and match.start() - line_start <= 3
        line_end = text.find("\n", match.end())
        more_after = line_end >= 0 and text[line_end:].strip() != ""
        if at_line_start and more_after and _HEADING.match(text, match.end()):
            continue
        return match.end()
    return None


def number_after_marker(text: str) -> str | None:
    """The number right after the last answer marker (:func:`answer_marker`; spaces and a ``$`` may
    come between them), None when there is no marker or the marker is not followed by a number.

    Right after, not anywhere after: the first number found further on was a wrong answer's
    reasoning (``#### Step 2: ...`` read as 2) or a fraction's part read loosely; verl's strict GSM8K
    reward reads ``#### <number>`` the same way."""
    start = answer_marker(text)
    if start is None:
        return None
    match = NUMBER.match(text, _BEFORE_NUMBER.match(text, start).end())
    return match.group(0) if match else None


def last_number(text: str) -> str | None:
    """The last number anywhere in ``text``, None when there is none."""
    matches = NUMBER.findall(text)
    return matches[-1] if matches else None
