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

_BEFORE_NUMBER = re.compile(r"(?:[ \t\u00a0]+|(?:the[ \t]+)?(?:final[ \t]+)?answer(?:[ \t]+is)?|[:=(]|\*{1,2}"
                            r"|\\boxed\{|\\?\$|\\[(\[])*", re.IGNORECASE)
"""What may stand between the marker and its number, in any order on the marker's line: spaces (a
no-break one too), an answer label (``Final Answer``), ``:``, ``=``, ``(``, bold ``**``, ``\\boxed{``, a
dollar sign (``$`` or ``\\$``) and LaTeX's ``\\(`` or ``\\[`` (``#### $1,234``, ``#### Final Answer: **18**``,
``#### $\\boxed{18}$``, ``#### \\(18\\)``, ``#### (18)``). Found by a review: only the order ``\\boxed{``
then ``$`` was read, so the usual ``$\\boxed{18}$`` (and ``\\(18\\)``, ``\\$18``, ``####: 18``) scored 0."""

_NUMBERED_PREFIX = re.compile(r"(?m)^[ ]{0,3}####[ \t]+\d+[.)]")
"""A numbered title's ``#### 2.``, whose number is not an answer."""

_NUMBERED_TITLE = re.compile(_NUMBERED_PREFIX.pattern + r"[ \t]+[^\W\d_]")
"""``#### 2. Add the pears``: a numbered title, when the text has two or more (a list of headings)."""


def _number_at(text: str, start: int) -> str | None:
    match = NUMBER.match(text, _BEFORE_NUMBER.match(text, start).end())
    return match.group(0) if match else None


def _last_marker(text: str) -> tuple[int, str | None] | None:
    """``(end of the last answer marker, the number right after it or None)``, None without a marker.

    A marker is ``####`` (exactly four), except a markdown heading, a ``####`` starting a line (up to
    three spaces before it) that is either a title with no number right after it and more text on
    the lines after it (``#### Step 1: cost of the apples``, ``#### **Step 1**``, which instruct
    models write), or one of two or more numbered titles (``#### 1. Compute ...``, ``#### 2. Add
    ...``). A ``####`` ending the completion with words after it (``... 27 in all.\n#### unknown``)
    is a marker with no number; ``#### 18. So she pays 18 dollars.`` is the answer 18."""
    numbered_list = len(_NUMBERED_TITLE.findall(text)) >= 2
    text_end = len(text.rstrip())  # text after position i is not blank iff i < text_end (once, not per marker)
    for match in reversed(list(_MARKS.finditer(text))):
        line_start = text.rfind("\n", 0, match.start()) + 1
        at_line_start = not text[line_start:match.start()].strip(" ") and match.start() - line_start <= 3
        if at_line_start and numbered_list and _NUMBERED_TITLE.match(text, line_start):
            continue
        number = _number_at(text, match.end())
        line_end = text.find("\n", match.end())
        title = text[match.end():line_end if line_end >= 0 else len(text)].strip() != ""
        more_after = 0 <= line_end < text_end
        if at_line_start and number is None and title and more_after:
            continue
        return match.end(), number
    return None


def final_answer(text: str) -> tuple[bool, str | None]:
    """``(marked, number)``: the number right after the last answer marker (``marked``; spaces, an answer
    label, bold, ``\\boxed{`` and a ``$`` may come between; None when none is there: no answer, not
    the reasoning's number before the marker or a later one: ``#### Step 2: ...`` is no 2), else the
    last number in ``text`` outside numbered headings (``#### 2. Add the pears`` is no number 2)."""
    found = _last_marker(text)
    if found is not None:
        return True, found[1]
    if len(_NUMBERED_TITLE.findall(text)) >= 2:
        text = _NUMBERED_PREFIX.sub("", text)
    return False, last_number(text)


def last_number(text: str) -> str | None:
    """The last number anywhere in ``text``, None when there is none."""
    matches = NUMBER.findall(text)
    return matches[-1] if matches else None
