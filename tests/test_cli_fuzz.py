"""Fuzz of ``aisrl train --dry-run`` over random argument lists (issue 9 f).

Whatever the presets and overrides, the command either succeeds with exactly one JSON document
on stdout (``{"config": ..., "placement": ...}``) or exits 2 with an ``error:`` message; it
never ends in a traceback. Runs in-process through typer's CliRunner (no Ray, nothing written).
"""

import json
import typing
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from actors.cli import app
from system.config import RunConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = sorted(str(p) for p in CONFIGS.rglob("*.yaml"))
runner = CliRunner()


def _schema_keys(model_cls, prefix=""):
    """Every dotted key of the schema, union members' keys included (``correction.method.c``)."""
    for name, field in model_cls.model_fields.items():
        key = prefix + (field.alias or name)
        yield key
        for sub in typing.get_args(field.annotation) or (field.annotation,):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                yield from _schema_keys(sub, key + ".")


SCHEMA_KEYS = sorted(set(_schema_keys(RunConfig)))
UNION_TYPES = ["none", "token-tis", "icepop", "seq-tis", "seq-mis", "geo-rs", "ppo", "ctpo", "tiny",
               "pretrained", "arithmetic", "addition-scratchpad", "gsm8k", "digit-match", "math-answer", "scratchpad", "vllm"]
NASTY_VALUES = ["true", "false", ".inf", "-.inf", ".nan", "nan", "inf", "-1", "0", "1", "2", "0.5", "3.0",
                "1e400", "1e-3", "-1e400", "", "[1,2]", "{}", "{a: 1}", "{type: icepop, hi: 2}", "null", "~",
                "'1'", "\"x\"", "9223372036854775808", "-9223372036854775809", "1_000", "0x10", "[",
                "{", "a: b: c", "!!python/object:os.system", "&a [*a]", "2020-01-01", "yes"]

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
real_key = st.sampled_from(SCHEMA_KEYS)
key_strategy = st.one_of(
    real_key,
    real_key,
    real_key,
    real_key.map(lambda k: k + ".nosuch"),
    real_key.map(lambda k: k.rsplit(".", 1)[0] + ".hii"),
    st.lists(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), min_size=1, max_size=3).map(".".join),
    _text,
)
value_strategy = st.one_of(st.sampled_from(NASTY_VALUES), st.sampled_from(UNION_TYPES), _text)
override = st.builds(lambda k, v: f"{k}={v}", key_strategy, value_strategy)
other_arg = st.one_of(
    st.sampled_from(PRESETS),
    st.sampled_from(["nope.yaml", "/nonexistent/x.yml", "configs", "a.json", "/dev/null.yaml"]),
    _text.filter(lambda s: not s.startswith("-")),  # a leading dash is an option for click
)
# Mostly overrides (so that most examples reach validation), sometimes a preset or a stray word,
# in any order.
arguments = st.tuples(st.lists(override, max_size=5), st.lists(other_arg, max_size=2)).flatmap(
    lambda parts: st.permutations(parts[0] + parts[1]))


def check_outcome(args: list[str]) -> None:
    result = runner.invoke(app, ["train", "--dry-run", *args])
    assert "Traceback" not in result.output, result.output
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output, result.exception)
    if result.exit_code == 0:
        doc = json.loads(result.stdout)  # the whole of stdout: exactly one document
        assert set(doc) == {"config", "placement"}
        RunConfig.model_validate(doc["config"])
    else:
        assert "error" in result.stderr.lower(), (args, result.output)
        assert result.stdout == "", (args, result.stdout)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments)
@example([])
@example(["correction.method.hi=2", "correction.method.type=icepop"])
@example(["learner.lr=.inf", "max_steps=true"])
@example(["correction.method={type: [1]}"])
@example(["learner=[1,2]", "learner.lr=2"])
@example(["output_dir=/dev/null"])
@example(["output_dir=" + "x" * 5000])
@example(["output_dir=/proc/nonexistent/run"])
@example(["nope.yaml", "also_not_a_preset"])
@example(["seed=1e400", "rollout.num_workers=9223372036854775808"])
@example([str(CONFIGS / "correction" / "icepop.yaml"), "correction.method.lo=1"])
def test_dry_run_ends_in_one_json_document_or_an_error(args):
    check_outcome(args)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["correction.method.type", "correction.method.hi",
                                           "correction.method.lo", "correction.method.c"]),
                          st.sampled_from(["icepop", "seq-mis", "token-tis", "geo-rs", "0.5", "2", "1.5", "7"])),
                min_size=1, max_size=4, unique_by=lambda kv: kv[0]),
       st.randoms(use_true_random=False))
def test_override_order_never_changes_the_outcome(pairs, rnd):
    # Distinct keys in any order: the same config, or the same error.
    args = [f"{k}={v}" for k, v in pairs]
    shuffled = list(args)
    rnd.shuffle(shuffled)
    first, second = runner.invoke(app, ["train", "--dry-run", *args]), runner.invoke(app, ["train", "--dry-run", *shuffled])
    assert (first.exit_code, first.stdout) == (second.exit_code, second.stdout), (args, shuffled)
    assert first.exit_code in (0, 2)


def test_demo_dump_and_report_refuse_bad_paths_and_sizes_with_exit_2(tmp_path):
    """Each a message naming the option or the file, never a traceback (found by a hostile probe)."""
    cases = [
        (["demo-dump", str(tmp_path / "x.npz"), "--sigma", "inf"], "--sigma must be finite"),
        (["demo-dump", str(tmp_path / "x.npz"), "--sequences", "100000000"], "at most 10^8"),
        (["demo-dump", str(tmp_path)], "give a file name"),
        (["train", "--dry-run", "learner.mini_batches=1000"], "learner.mini_batches (1000) is more than"),
    ]
    (tmp_path / "afile").write_text("x")
    # probe 9: "cannot write the dump (File exists)" did not say which part was wrong
    cases.append((["demo-dump", str(tmp_path / "afile" / "x.npz")],
                  f"path's directory '{tmp_path / 'afile'}' exists and is not a directory"))
    cases.append((["report", str(tmp_path / "afile"), "--out", ""], "Invalid value for '--out' / '-o': empty"))
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), args
    dump = tmp_path / "d.npz"
    assert runner.invoke(app, ["demo-dump", str(dump)]).exit_code == 0
    # probe 9: a second demo-dump replaced the file without a word (it may be a run's dumps/step_*.npz)
    before = dump.read_bytes()
    again = runner.invoke(app, ["demo-dump", str(dump), "--seed", "1"])
    assert again.exit_code == 2 and "exists: pass --overwrite" in " ".join(again.output.split())
    assert dump.read_bytes() == before
    assert runner.invoke(app, ["demo-dump", str(dump), "--seed", "1", "--overwrite"]).exit_code == 0
    assert dump.read_bytes() != before
    (tmp_path / "out" / "report.html").mkdir(parents=True)  # the report's own name taken by a directory
    result = runner.invoke(app, ["report", str(dump), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "cannot write the report" in " ".join(result.output.split())
