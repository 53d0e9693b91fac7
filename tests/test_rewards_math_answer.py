"""Math-answer reward: the number after the last ``####`` (else the last number), by value."""

import pytest

from system.config.data import MathAnswerReward
from system.rewards.math_answer import math_answer
from system.rewards.numbers import final_answer, last_number, normalise_number
from system.rewards.registry import build_reward


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("so 3 + 4 = 7\n#### 7", "7", 1.0),
        ("#### 1,550", "1550", 1.0),  # thousands comma
        ("#### 120.0", "120", 1.0),  # trailing .0
        ("#### 4.50", "4.5", 1.0),
        ("#### -6", "-6", 1.0),
        ("#### 6", "-6", 0.0),
        ("#### 5 oops #### 7", "7", 1.0),  # the last marker counts
        ("#### 7 then #### 5", "7", 0.0),
        ("the answer is 12 apples, not 13", "13", 1.0),  # no marker: the last number
        ("the answer is 13, I think 12", "13", 0.0),
        ("no number at all", "3", 0.0),
        ("", "3", 0.0),
        ("#### ", "3", 0.0),  # a marker with no number is no answer
    ],
)
def test_hand_values(completion, reference, expected):
    assert math_answer(completion, reference) == expected


def test_format_bonus_only_for_a_wrong_marked_answer():
    reward = build_reward(MathAnswerReward(format_bonus=0.1))
    assert reward("#### 8", "7") == 0.1  # well formed, wrong
    assert reward("#### 7", "7") == 1.0
    assert reward("it is 8", "7") == 0.0  # unmarked and wrong: no bonus
    assert reward("####", "7") == 0.0


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("1,000", "1000"), ("1000.00", "1000"), ("-0", "0"), ("0.50", "0.5"), ("12", "12"),
     ("abc", None), ("", None), ("nan", None)],
)
def test_normalise_number(text, canonical):
    assert normalise_number(text) == canonical


def test_a_run_of_digits_longer_than_decimals_precision_is_a_number_not_a_crash():
    """Found by a review: 29+ digits raised decimal.InvalidOperation, failing the rollout call and the
    run (and again on resume: the prompt re-samples with the same seed)."""
    reward = build_reward(MathAnswerReward(format_bonus=0.1))
    assert normalise_number("1" * 29) == "1" * 29 and normalise_number("2" * 40 + ".50") == "2" * 40 + ".5"
    assert reward("answer " + "1" * 29, "72") == 0.0  # unmarked, wrong
    assert reward("#### 1" + "0" * 30, "72") == 0.1  # marked, wrong: the format bonus
    assert reward("#### 1" + "0" * 30, "1" + "0" * 30) == 1.0


def test_number_finders():
    assert final_answer("a #### b") == (True, None)
    assert final_answer("no marker 5") == (False, "5")
    assert final_answer("x #### 1,234 and 5") == (True, "1,234")
    assert last_number("1 then 2.5 then -3") == "-3"
    assert last_number("none") is None


@pytest.mark.parametrize("completion, reference, expected", [
    # found by a probe: the first digits after '####' were taken from a fraction, exponent, hex or list
    ("#### 3/4", "3", 0.0), ("#### 5e3", "5", 0.0), ("#### 0x10", "0", 0.0), ("the list 1,2,3", "123", 0.0),
    ("#### 1000,000", "1000000", 0.0),
    # the typographic minus (U+2212) is a minus
    ("#### \u22125", "5", 0.0), ("#### \u22125", "-5", 1.0),
    # still read: thousands in groups of three, a full stop or comma after, a dollar before
    ("#### $1,234.50.", "1234.5", 1.0), ("so the answer is 42.", "42", 1.0), ("x = 12, y = 7", "7", 1.0),
    # a unit or a word in any script after it, any script but Latin before it (a review of the first
    # version: Python's Unicode \w had '答案是42' and '#### 42km' read as no number)
    ("答案是42", "42", 1.0), ("所以一共是42个。", "42", 1.0), ("#### 42km", "42", 1.0), ("#### 42nd", "42", 1.0),
    ("#### \u0664\u0662", "42", 1.0), ("5eggs", "5", 1.0), ("H2O weighs 18", "18", 1.0),
])
def test_a_number_stands_alone(completion, reference, expected):
    assert math_answer(completion, reference) == expected


NUMBERED = "#### 1. Cost of the apples\n3 x 4 = 12\n#### 2. Add the pears\n12 + 6 = 18"

HEADINGS = ("#### Step 1: Cost of the apples\n3 apples x $4 = $12\n#### Step 2: Add the pears\n"
            "$12 + $6 = $18\nThe answer is \\boxed{18}.")


@pytest.mark.parametrize("completion, reference, expected", [
    # found by a probe: a last marker without a number right after it fell back to the last number of
    # the whole text, the reasoning before the marker: each of these scored 1.0
    ("She buys 3 pens at $9 each, paying 27 in all. #### 3/4", "27", 0.0),
    ("She buys 3 pens at $9 each, paying 27 in all. ####", "27", 0.0),
    ("She buys 3 pens at $9 each, paying 27 in all. #### unknown", "27", 0.0),
    ("paying 27 in all.\n#### unknown", "27", 0.0),  # a '####' line that ends the text is no heading
    ("x = 12\n#### 1.2e1", "12", 0.0),
    # ... and the number anywhere after the marker: a wrong answer's words before its number
    ("#### about 27", "27", 0.0),
    # markdown headings (a '####' line with a word and text after it) are not markers: the answer is
    # the last number (18); before, "Step 2" was read as the answer 2
    (HEADINGS, "18", 1.0), (HEADINGS, "2", 0.0),
    (HEADINGS + "\n#### 18", "18", 1.0), (HEADINGS + "\n#### 17", "18", 0.0),  # a real marker still counts
    ("The answer is 18.\n####\n\nQuestion: Mary buys 3 pens.", "3", 0.0),  # '####' then no number: no answer
    ("The answer is 18.\n####\n\nQuestion: Mary buys 3 pens.", "18", 0.0),
    ("##### 5 things\nso 7", "7", 1.0),  # five '#' are a heading's, never a marker
    ("#### **Step 1**\n3 + 4 = 7", "7", 1.0),  # a bold title
    (NUMBERED, "18", 1.0), (NUMBERED, "2", 0.0), (NUMBERED + "\n#### 2. Done\n", "2", 0.0),  # numbered titles
    ("#### 18.\nQuestion: Mary buys 3 pens.", "18", 1.0), ("#### -5\nnext", "-5", 1.0),  # answers, text after
    # a review: an answer written as a sentence is an answer, not a numbered title
    ("#### 18. So she pays 18 dollars.\nQuestion: Mary buys 3 pens.", "18", 1.0),
    ("#### 18. So she pays 18 dollars.\nQuestion: Mary buys 3 pens.", "3", 0.0),
    # an answer label, bold and \boxed between the marker and its number
    ("#### **18**", "18", 1.0), ("#### Final Answer: 10\nExplanation: 3 + 7", "10", 1.0),
    ("#### The answer is $1,234.", "1234", 1.0), ("#### \\boxed{18}", "18", 1.0),
    # still read: spaces and a dollar sign between the marker and its number, no space at all
    ("#### $1,234", "1234", 1.0), ("####42", "42", 1.0), ("  #### 18\n", "18", 1.0),
    # a review: LaTeX's usual order, math delimiters, an escaped dollar, a colon, '=' or '(' before it
    ("#### $\\boxed{18}$", "18", 1.0), ("#### \\(\\boxed{18}\\)", "18", 1.0), ("#### \\(18\\)", "18", 1.0),
    ("#### \\[18\\]", "18", 1.0), ("#### \\$18", "18", 1.0), ("#### **\\$18.00**", "18", 1.0),
    ("####: 18", "18", 1.0), ("#### = 18", "18", 1.0), ("#### (18)", "18", 1.0), ("#### \u00a018", "18", 1.0),
    ("#### $\\boxed{17}$", "18", 0.0),  # read, and wrong
    ("#### (Step 1) add\n3 + 4 = 7", "7", 1.0),  # still a heading: no number after its '('
])
def test_the_answer_is_the_number_right_after_the_last_marker(completion, reference, expected):
    assert math_answer(completion, reference) == expected


def test_no_format_bonus_for_a_heading_or_a_marker_without_a_number():
    reward = build_reward(MathAnswerReward(format_bonus=0.1))
    assert reward(HEADINGS, "7") == 0.0  # headings are not the well-formed '#### <number>'
    assert reward("27 in all. #### unknown", "7") == 0.0
    assert reward("27 in all. #### 8", "7") == 0.1
