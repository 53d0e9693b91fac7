"""Digit-match reward: left-aligned digits right in place, over the longer length (hand values)."""

import pytest

from system.config.data import DigitMatchReward
from system.rewards.digit_match import answer_digits, digit_match
from system.rewards.registry import build_reward


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("82", "82", 1.0),
        ("72", "82", 0.5),  # tens wrong, units right: 1 of 2
        ("8", "82", 0.5),  # first digit right, second missing: 1 of max(1, 2)
        ("821", "82", 2 / 3),  # extra digit: 2 of max(3, 2)
        ("182", "82", 0.0),  # shifted: 1/8, 8/2 and 2/- all differ
        ("111", "111", 1.0),
        ("101", "111", 2 / 3),
        (" 82", "82", 1.0),  # leading whitespace is not part of the answer
        ("82=7+", "82", 1.0),  # what follows the digit run is ignored
        ("+=", "82", 0.0),  # no leading digits
        ("", "82", 0.0),
        ("9", "9", 1.0),
        ("0", "9", 0.0),
        ("1000", "1001", 0.75),
    ],
)
def test_hand_values(completion, reference, expected):
    assert digit_match(completion, reference) == pytest.approx(expected)


def test_answer_is_the_leading_digit_run():
    assert answer_digits("  123abc4") == "123"
    assert answer_digits("x123") == ""


def test_registry_returns_digit_match():
    reward = build_reward(DigitMatchReward())
    assert reward("72", "82") == 0.5
