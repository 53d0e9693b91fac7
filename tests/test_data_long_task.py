"""The long-response task: the tape format (hand-derived), its length in tokens, the reward's hand values."""

import random
import re
from pathlib import Path

import pytest

from system.config import RunConfig
from system.config.data import ScratchpadAdditionTaskConfig, ScratchpadReward
from system.config.loading import resolve_config
from system.data.prompt_source import PromptSource, build_prompt_source
from system.data.scratchpad import (
    ALPHABET,
    ScratchpadAdditionPrompts,
    scratchpad_lines,
    scratchpad_reference,
)
from system.models.tokenizer import train_char_tokenizer
from system.rewards.registry import build_reward
from system.rewards.scratchpad import scratchpad_reward, split_scratchpad

# 4729 + 3856, column by column from the units:
#   9 + 6 + 0 = 15 -> carry 1, digit 5; the operands lose their 9 and 6: .472 / .385
#   2 + 5 + 1 =  8 -> carry 0, digit 8; written so far "85"
#   7 + 8 + 0 = 15 -> carry 1, digit 5; written "585"
#   4 + 3 + 1 =  8 -> carry 0, digit 8; written "8585"; the sum with 5 digits: 08585
REF_4729_3856 = ".472+.385|1|5...;..47+..38|0|85..;...4+...3|1|585.;....+....|0|8585>08585"
PRESET = Path(__file__).resolve().parents[1] / "configs" / "long_cpu.yaml"
LINES = REF_4729_3856.split(">")[0].split(";")


def test_reference_hand_derived():
    assert scratchpad_reference(4729, 3856) == REF_4729_3856
    # 9729 + 3856 = 13585: the same columns but the last one, 9 + 3 + 1 = 13, carries out
    assert scratchpad_reference(9729, 3856) == (
        ".972+.385|1|5...;..97+..38|0|85..;...9+...3|1|585.;....+....|1|3585>13585")
    # 29 + 56 = 85: 9 + 6 + 0 = 15, then 2 + 5 + 1 = 8
    assert scratchpad_lines(29, 56) == [".2+.5|1|5.", "..+..|0|85"]
    assert scratchpad_reference(29, 56) == ".2+.5|1|5.;..+..|0|85>085"
    # one digit: 7 + 8 = 15
    assert scratchpad_reference(7, 8) == ".+.|1|5>15"


@pytest.mark.parametrize(("n", "length"), [(1, 10), (2, 25), (3, 46), (4, 73), (5, 106), (6, 145)])
def test_reference_length_is_3n2_plus_6n_plus_1(n, length):
    # n lines of 3n + 4 characters, n - 1 ";", one ">", n + 1 answer digits
    assert n * (3 * n + 4) + (n - 1) + 1 + (n + 1) == length == 3 * n * n + 6 * n + 1
    pool = ScratchpadAdditionPrompts(ScratchpadAdditionTaskConfig(num_digits=n, num_prompts=30), seed=0)
    assert {len(pool[i].reference) for i in range(30)} == {length}


def test_tokens_per_response_with_the_tasks_tokenizer():
    pool = ScratchpadAdditionPrompts(ScratchpadAdditionTaskConfig(num_digits=4, num_prompts=300), seed=1)
    texts = [pool[i].text + pool[i].reference for i in range(300)]
    assert set("".join(texts)) == set(ALPHABET)  # 300 tapes use every character of the task
    tok = train_char_tokenizer(texts, 128)
    assert len(tok) == 3 + 16  # <pad>, <eos>, <unk> + one token per character
    for i in range(300):
        ids = tok.encode(pool[i].reference)
        # one token a character: 73 tokens, 74 with <eos>, inside the 48-160 the task asks for
        assert len(ids) == 73 and 48 <= len(ids) + 1 <= 160
        assert tok.decode(ids) == pool[i].reference
        assert len(tok.encode(pool[i].text)) == 10  # "dddd+dddd="


def _check_tape(a: int, b: int, reference: str, n: int) -> None:
    """Recompute every field of every line from its meaning, independently of the generator."""
    tape, answer = reference.split(">")
    lines = tape.split(";")
    assert len(lines) == n and answer == str(a + b).zfill(n + 1)
    carry = 0
    for k, line in enumerate(lines, start=1):
        xs, ys, c, written = re.fullmatch(r"([.\d]+)\+([.\d]+)\|(\d)\|([.\d]+)", line).groups()
        assert xs == "." * k + str(a)[: n - k] and ys == "." * k + str(b)[: n - k]
        column = (a // 10 ** (k - 1)) % 10 + (b // 10 ** (k - 1)) % 10 + carry
        carry = column // 10
        assert int(c) == carry
        assert written == str((a + b) % 10**k).zfill(k) + "." * (n - k)


def test_pool_prompts_are_exact_digit_sums_written_correctly():
    pool = ScratchpadAdditionPrompts(ScratchpadAdditionTaskConfig(num_digits=4, num_prompts=200), seed=5)
    for i in range(len(pool)):
        p = pool[i]
        a, b = re.fullmatch(r"(\d{4})\+(\d{4})=", p.text).groups()
        assert a[0] != "0" and b[0] != "0"
        assert p.prompt_id == f"scratch-5-{i}"
        _check_tape(int(a), int(b), p.reference, 4)
    _check_tape(4729, 3856, REF_4729_3856, 4)


def test_pool_is_deterministic_bounded_and_registered():
    cfg = ScratchpadAdditionTaskConfig(num_prompts=50)
    one, again, other = (ScratchpadAdditionPrompts(cfg, s) for s in (1, 1, 2))
    texts = [one[i].text for i in range(50)]
    assert texts == [again[i].text for i in range(50)]
    assert sum(t == other[i].text for i, t in enumerate(texts)) < 3 and len(set(texts)) > 45
    assert one[-1] == one[49]
    with pytest.raises(IndexError, match="out of range for 50"):
        one[50]
    source = build_prompt_source(cfg, seed=3)
    assert isinstance(source, ScratchpadAdditionPrompts) and isinstance(source, PromptSource)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (REF_4729_3856, 1.0),
        (REF_4729_3856 + "|0|.;", 1.0),  # what follows the answer's digits is ignored
        # line 3 with a wrong sum digit (575. for 585.): lines 3/4, answer 5/5 -> (3/4 + 1) / 2
        (REF_4729_3856.replace("|1|585.", "|1|575."), 0.875),
        # stopped inside line 3: pieces [l1, l2, "...4"] -> 2 / max(3, 4); no answer -> (1/2 + 0) / 2
        (";".join(LINES[:2]) + ";...4", 0.25),
        # an extra (repeated) line: 4 of max(5, 4) pieces right, answer right -> (4/5 + 1) / 2
        (";".join(LINES + LINES[-1:]) + ">08585", 0.9),
        # answer without its leading 0: 8585 vs 08585 left-aligned, 8/0 5/8 8/5 5/8 all differ -> (1 + 0) / 2
        (";".join(LINES) + ">8585", 0.5),
        (";".join(LINES) + ">", 0.5),  # marker but no digits: the answer is empty
        (">08585", 0.5),  # answer only: piece "" is no line -> (0 + 1) / 2
        # carry of column 1 dropped (0 for 1), the rest consistent with it: 2+5+0 = 7, ...
        # every line differs from the reference (line 1 in its carry, lines 2-4 in their
        # written digits); answer 08575 vs 08585: 4 of 5 digits -> (0 + 4/5) / 2
        (".472+.385|0|5...;..47+..38|0|75..;...4+...3|1|575.;....+....|0|8575>08575", 0.4),
        ("", 0.0),
        ("+=", 0.0),
        ("the sum is 8585", 0.0),
    ],
)
def test_reward_hand_values(completion, expected):
    assert scratchpad_reward(completion, REF_4729_3856) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (".2+.5|1|5.;..+..|0|85>085", 1.0),
        (".2+.5|0|5.;..+..|0|75>075", 1 / 3),  # both lines wrong, answer 0?5: 2 of 3 -> (0 + 2/3) / 2
        (".2+.5|1|5.;..+..|0|85>086", 5 / 6),  # lines right, answer 2 of 3 -> (1 + 2/3) / 2
        (".2+.5|1|5.;..+..|0|85", 0.5),
        (">085", 0.5),
    ],
)
def test_reward_docstring_examples(completion, expected):
    assert scratchpad_reward(completion, ".2+.5|1|5.;..+..|0|85>085") == pytest.approx(expected)


def test_reward_is_in_unit_interval_on_corrupted_references():
    rng = random.Random(0)
    pool = ScratchpadAdditionPrompts(ScratchpadAdditionTaskConfig(num_prompts=40), seed=0)
    for i in range(40):
        ref = pool[i].reference
        for _ in range(10):
            chars = list(ref)
            for _ in range(rng.randint(1, 5)):
                chars[rng.randrange(len(chars))] = rng.choice(ALPHABET)
            value = scratchpad_reward("".join(chars), ref)
            assert 0.0 <= value <= 1.0
            assert value < 1.0 or "".join(chars) == ref


def test_split_and_registry():
    assert split_scratchpad("a;b>12x>3") == (["a", "b"], "12")
    assert split_scratchpad("a;b") == (["a", "b"], "")
    assert build_reward(ScratchpadReward()) is scratchpad_reward


def test_preset_fits_the_model_and_the_task():
    cfg = resolve_config([PRESET])
    assert isinstance(cfg, RunConfig)
    assert cfg.data.task.type == "addition-scratchpad" and cfg.data.reward.type == "scratchpad"
    n = cfg.data.task.num_digits
    prompt_tokens, response_tokens = 2 * n + 2, 3 * n * n + 6 * n + 1 + 1  # + <eos>
    assert response_tokens <= cfg.rollout.max_new_tokens
    assert prompt_tokens + cfg.rollout.max_new_tokens <= cfg.model.max_position_embeddings
