"""The synthetic addition pool: deterministic by seed, exact-digit operands, correct sums."""

import re

import pytest

from system.config.data import ArithmeticTaskConfig
from system.data.arithmetic import ArithmeticPrompts, operand_range
from system.data.prompt_source import PromptSource, build_prompt_source

PATTERN = re.compile(r"^(\d+)\+(\d+)=$")


def test_prompts_are_sums_with_exact_digit_operands():
    pool = ArithmeticPrompts(ArithmeticTaskConfig(num_digits=3, num_prompts=200), seed=5)
    for i in range(len(pool)):
        p = pool[i]
        a, b = PATTERN.match(p.text).groups()
        assert len(a) == len(b) == 3 and a[0] != "0" and b[0] != "0"
        assert int(p.reference) == int(a) + int(b)  # the sum, recomputed from the text
        assert p.prompt_id == f"arith-5-{i}"


def test_same_seed_same_pool_other_seed_other_pool():
    cfg = ArithmeticTaskConfig(num_prompts=50)
    one, again, other = ArithmeticPrompts(cfg, 1), ArithmeticPrompts(cfg, 1), ArithmeticPrompts(cfg, 2)
    texts = [one[i].text for i in range(50)]
    assert texts == [again[i].text for i in range(50)]
    # 50 draws from 90 x 90 pairs: two seeds agreeing on more than a handful would be a bug
    assert sum(t == other[i].text for i, t in enumerate(texts)) < 5
    assert len(set(texts)) > 40


def test_one_digit_operands_include_zero():
    assert operand_range(1) == (0, 9)
    assert operand_range(2) == (10, 99)
    assert operand_range(4) == (1000, 9999)


def test_indexing_is_bounded_and_negative_indices_wrap():
    pool = ArithmeticPrompts(ArithmeticTaskConfig(num_prompts=7), seed=0)
    assert len(pool) == 7
    assert pool[-1] == pool[6]
    with pytest.raises(IndexError, match="out of range for 7"):
        pool[7]


def test_registry_builds_the_pool_and_iterates_it_in_order():
    task = ArithmeticTaskConfig(num_prompts=4)
    source = build_prompt_source(task, seed=3)
    assert isinstance(source, PromptSource)
    assert [source[i].prompt_id for i in range(len(source))] == [f"arith-3-{i}" for i in range(4)]
