"""Config composition, strictness and every shipped preset."""

import itertools
import json
import os
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from actors.cli import app
from system.config import (
    ConfigError,
    RunConfig,
    check_output_dir,
    dump_config,
    load_resolved,
    resolve_config,
)
from system.config.correction import CorrectionConfig, IcePop, SeqMIS, TokenTIS
from system.config.learner import LearnerConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = sorted(CONFIGS.rglob("*.yaml"))


def test_presets_exist():
    assert len(PRESETS) >= 10, PRESETS


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_preset_validates(path):
    # Overlays are validated on top of the defaults, the way users compose them.
    resolve_config([path])


def test_default_is_seq_mis_hi_3_and_tiny_preset_equals_defaults():
    default = resolve_config()
    assert default.correction.method == SeqMIS(hi=3.0)
    assert resolve_config([CONFIGS / "tiny_cpu.yaml"]) == default


def test_precedence_presets_left_to_right_then_overrides(tmp_path):
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text("max_steps: 5\nlearner: {lr: 0.1}\n")
    b.write_text("max_steps: 7\n")
    cfg = resolve_config([a, b], ["learner.lr=0.25"])
    assert (cfg.max_steps, cfg.learner.lr) == (7, 0.25)
    cfg = resolve_config([b, a])
    assert cfg.max_steps == 5


def test_switching_union_type_drops_the_old_variant_fields(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("correction: {method: {type: seq-mis, hi: 2.0}}\n")
    cfg = resolve_config([p], ["correction.method.type=token-tis", "correction.method.c=5"])
    assert cfg.correction.method == TokenTIS(c=5.0)
    cfg = resolve_config([p], ["correction.method.type=icepop"])
    assert cfg.correction.method == IcePop()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("correction.method.hii=2", "correction.method.seq-mis.hii"),
        ("correction.method.hi=abc", "correction.method.seq-mis.hi"),
        ("correction.method.hi=-1", "correction.method.seq-mis.hi"),
        ("rollout.quantization=int4", "rollout.quantization"),
        ("learner.num_ranks=0", "learner.num_ranks"),
        ("learner.num_ranks=3", "learner.num_ranks (3) must divide"),
        ("nosuch=1", "nosuch"),
        ("async.max_lag=-1", "async.max_lag"),
        ("correction.method.type=bogus", "correction.method"),
    ],
)
def test_bad_values_name_the_dotted_path(override, needle):
    with pytest.raises(ConfigError) as err:
        resolve_config([], [override])
    assert needle in str(err.value)


@pytest.mark.parametrize("text", ["novalue", "=3", "a..b=1"])
def test_malformed_override(text):
    with pytest.raises(ConfigError, match="dotted.key=value"):
        resolve_config([], [text])


def test_bad_preset_files_name_the_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="missing.yaml"):
        resolve_config([missing])
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        resolve_config([broken])
    listy = tmp_path / "listy.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigError, match="listy.yaml"):
        resolve_config([listy])


def test_resolved_dump_round_trips_with_user_spelling(tmp_path):
    cfg = resolve_config([], ["async.max_lag=0", "correction.method.type=geo-rs"])
    text = dump_config(cfg)
    assert json.loads(text)["async"]["max_lag"] == 0
    path = tmp_path / "config.json"
    path.write_text(text)
    assert load_resolved(path) == cfg


def test_configs_are_frozen():
    cfg = RunConfig()
    with pytest.raises(Exception, match="frozen"):
        cfg.max_steps = 3


def _walk(model_cls, prefix=""):
    for name, field in model_cls.model_fields.items():
        yield prefix + name, field
        ann = field.annotation
        for sub in getattr(ann, "__args__", (ann,)):
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                yield from _walk(sub, f"{prefix}{name}.")


def test_every_field_is_documented():
    undocumented = [p for p, f in _walk(RunConfig) if not f.description]
    assert undocumented == []


# -- strict numbers (issue 9 a) -------------------------------------------------------------------

def _number_fields(model_cls, prefix="", loc_prefix="", setup=()):
    """(dotted key, overrides selecting its union member, error path, kind) of every int / float
    field, found by walking the annotations (a union member is selected with its ``type``)."""
    for name, field in model_cls.model_fields.items():
        key = field.alias or name
        args = typing.get_args(field.annotation) or (field.annotation,)
        members = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if members:
            for member in members:
                if field.discriminator:  # a tagged union, maybe of one member
                    tag = member.model_fields["type"].default
                    yield from _number_fields(member, f"{prefix}{key}.", f"{loc_prefix}{key}.{tag}.",
                                              (*setup, f"{prefix}{key}.type={tag}"))
                else:
                    yield from _number_fields(member, f"{prefix}{key}.", f"{loc_prefix}{key}.", setup)
            continue
        kinds = {a for a in args if a in (int, float)}
        if kinds:
            yield f"{prefix}{key}", setup, f"{loc_prefix}{key}", "float" if float in kinds else "int"


NUMBER_FIELDS = list(_number_fields(RunConfig))


def test_the_walk_finds_the_number_fields():
    keys = {k for k, *_ in NUMBER_FIELDS}
    assert {"seed", "max_steps", "learner.lr", "async.max_lag", "correction.method.hi",
            "correction.method.c", "correction.method.lo", "ray.num_cpus", "model.hidden_size",
            "learner.max_nonfinite_steps", "correction.method.veto"} <= keys
    assert len(NUMBER_FIELDS) > 40


@pytest.mark.parametrize(("key", "setup", "loc", "kind"), NUMBER_FIELDS, ids=[f"{k}-{s}" for k, s, *_ in NUMBER_FIELDS])
def test_no_number_field_takes_a_boolean_or_a_non_finite_value(key, setup, loc, kind):
    # The error names the dotted path (with the union tag, as pydantic locates it).
    values = ["true", "false", ".inf", "-.inf", ".nan", "1e400", "nan", "inf"]
    for value in values:
        with pytest.raises(ConfigError) as err:
            resolve_config([], [*setup, f"{key}={value}"])
        assert f"{loc}: " in str(err.value), (value, str(err.value))
    with pytest.raises(ConfigError, match="expected a number, got the boolean true"):
        resolve_config([], [*setup, f"{key}=true"])
    if kind == "float":
        with pytest.raises(ConfigError, match="finite number"):
            resolve_config([], [*setup, f"{key}=.inf"])


def test_the_issue_examples_are_refused():
    with pytest.raises(ConfigError, match=r"learner\.lr: Input should be a finite number"):
        resolve_config([], ["learner.lr=.inf"])
    with pytest.raises(ConfigError, match="max_steps: expected a number, got the boolean true"):
        resolve_config([], ["max_steps=true"])


def test_strings_and_ints_still_convert_to_numbers(tmp_path):
    # YAML reads 1e-3 as a string (no dot) and 2 as an int; both are floats in the config.
    cfg = resolve_config([], ["learner.lr=1e-3", "learner.grad_clip=2", "max_steps='12'", "rollout.top_p=0.5"])
    assert (cfg.learner.lr, cfg.learner.grad_clip, cfg.max_steps, cfg.rollout.top_p) == (0.001, 2.0, 12, 0.5)
    assert type(cfg.learner.grad_clip) is float and type(cfg.max_steps) is int
    preset = tmp_path / "p.yaml"
    preset.write_text("learner: {lr: 3e-4, weight_decay: 0}\nmax_steps: 4.0\n")
    cfg = resolve_config([preset])
    assert (cfg.learner.lr, cfg.learner.weight_decay, cfg.max_steps) == (0.0003, 0.0, 4)
    # boolean fields still take booleans
    assert resolve_config([], ["report.console=false"]).report.console is False


def test_int_fields_hold_64_bit_values_and_seeds_are_not_negative():
    assert resolve_config([], [f"seed={2**63 - 1}"]).seed == 2**63 - 1
    for value in (2**63, -(2**63) - 1, 10**400):
        with pytest.raises(ConfigError, match="seed"):
            resolve_config([], [f"seed={value}"])
    with pytest.raises(ConfigError, match="seed: Input should be greater than or equal to 0"):
        resolve_config([], ["seed=-1"])


def test_max_nonfinite_steps_field():
    assert RunConfig().learner.max_nonfinite_steps == 3
    assert resolve_config([], ["learner.max_nonfinite_steps=0"]).learner.max_nonfinite_steps == 0
    for bad in ("-1", "true", "1.5"):
        with pytest.raises(ConfigError, match=r"learner\.max_nonfinite_steps"):
            resolve_config([], [f"learner.max_nonfinite_steps={bad}"])
    doc = LearnerConfig.model_fields["max_nonfinite_steps"].description
    assert "non-finite" in doc and "skipped" in doc


# -- thresholds that make no sense (issue 9 b) ----------------------------------------------------

# A band [lo, hi] must hold the on-policy ratio 1 strictly inside (else ratios 1 +- noise are
# rejected on one side); a truncation cap c must be >= 1 (else the ratio 1 itself is truncated).
@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["correction.method.hi=0.5"], "hi"),
        (["correction.method.hi=0.999"], "hi"),
        (["correction.method.hi=1"], "hi"),
        (["correction.method.lo=1", "correction.method.hi=3"], "lo"),
        (["correction.method.lo=1.5", "correction.method.hi=3"], "lo"),
        (["correction.method.type=icepop", "correction.method.lo=1"], "lo"),
        (["correction.method.type=icepop", "correction.method.hi=1"], "hi"),
        (["correction.method.type=icepop", "correction.method.hi=0.9", "correction.method.lo=0.1"], "hi"),
        (["correction.method.type=geo-rs", "correction.method.lo=1.0001"], "lo"),
        (["correction.method.type=geo-rs", "correction.method.hi=0.9999", "correction.method.lo=0.5"], "hi"),
        (["correction.method.type=token-tis", "correction.method.c=0.5"], "c"),
        (["correction.method.type=seq-tis", "correction.method.c=0.99"], "c"),
    ],
)
def test_thresholds_that_reject_the_on_policy_ratio_are_refused(overrides, field):
    with pytest.raises(ConfigError) as err:
        resolve_config([], overrides)
    assert f"correction.method.{field}: " in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["correction.method.hi=1.0001"],
        ["correction.method.lo=0.9999", "correction.method.hi=1.0001"],
        ["correction.method.type=icepop", "correction.method.lo=0.99", "correction.method.hi=1.01"],
        ["correction.method.type=geo-rs"],
        ["correction.method.type=token-tis", "correction.method.c=1"],
        ["correction.method.type=seq-tis", "correction.method.c=1"],
    ],
)
def test_thresholds_around_1_are_accepted(overrides):
    resolve_config([], overrides)


def test_lo_must_be_below_hi():
    with pytest.raises(ConfigError, match=r"lo \(0\.5\) must be < hi \(0\.5\)"):
        resolve_config([], ["correction.method.type=icepop", "correction.method.lo=0.5", "correction.method.hi=0.5"])
    with pytest.raises(ConfigError, match=r"lo \(2\.0\) must be < hi \(1\.5\)"):
        resolve_config([], ["correction.method.lo=2", "correction.method.hi=1.5"])


def test_method_classes_alone_still_build_any_band():
    # The formulas' tests build bands away from 1; only a run's config refuses them.
    assert SeqMIS(lo=1.2, hi=3.0).lo == 1.2 and IcePop(lo=4.0, hi=5.0).lo == 4.0
    with pytest.raises(ValidationError, match=r"method\.lo"):
        CorrectionConfig(method=SeqMIS(lo=1.2, hi=3.0))


# -- overrides do not depend on their order (issue 9 c) -------------------------------------------

def test_override_order_does_not_matter_for_a_union_type():
    a = resolve_config([], ["correction.method.hi=2", "correction.method.type=icepop"])
    b = resolve_config([], ["correction.method.type=icepop", "correction.method.hi=2"])
    assert a == b
    assert a.correction.method == IcePop(hi=2.0)  # lo keeps icepop's default


def test_every_permutation_of_overrides_gives_one_config(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("correction: {method: {type: token-tis, c: 3}}\nlearner: {loss: {type: ctpo}}\n")
    overrides = [
        "correction.method.lo=0.8", "correction.method.type=seq-mis", "correction.method.hi=2.5",
        "learner.loss.type=ppo", "learner.loss.eps_hi=0.3", "learner={num_ranks: 4, lr: 0.01}",
    ]  # 6! = 720 orders
    configs = {resolve_config([preset], list(p)).model_dump_json() for p in itertools.permutations(overrides)}
    assert len(configs) == 1
    cfg = RunConfig.model_validate_json(configs.pop())
    assert cfg.correction.method == SeqMIS(lo=0.8, hi=2.5)
    assert (cfg.learner.loss.type, cfg.learner.loss.eps_hi, cfg.learner.lr, cfg.learner.num_ranks) == ("ppo", 0.3, 0.01, 4)


def test_a_key_the_final_union_member_lacks_is_an_error_in_either_order():
    for overrides in (["correction.method.hi=2", "correction.method.type=token-tis"],
                      ["correction.method.type=token-tis", "correction.method.hi=2"]):
        with pytest.raises(ConfigError, match=r"correction\.method\.token-tis\.hi: Extra inputs"):
            resolve_config([], overrides)


def test_a_mapping_override_and_a_key_below_it_combine():
    for overrides in (["correction.method={type: icepop, hi: 7}", "correction.method.hi=2"],
                      ["correction.method.hi=2", "correction.method={type: icepop, hi: 7}"]):
        assert resolve_config([], overrides).correction.method == IcePop(hi=2.0)


def test_a_key_below_a_non_mapping_override_is_an_error():
    for overrides in (["learner=3", "learner.lr=0.1"], ["learner.lr=0.1", "learner=3"]):
        with pytest.raises(ConfigError, match=r"override 'learner\.lr=0\.1' sets a key below learner, which override 'learner=3'"):
            resolve_config([], overrides)


def test_a_key_given_twice_takes_the_last_value():
    assert resolve_config([], ["max_steps=3", "max_steps=5"]).max_steps == 5


# -- output_dir and --dry-run (issue 9 d, e) ------------------------------------------------------

runner = CliRunner()


def test_dry_run_prints_one_json_object_with_config_and_placement():
    result = runner.invoke(app, ["train", "--dry-run", "correction.method.type=icepop", "learner.num_ranks=4"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is one document
    assert set(doc) == {"config", "placement"}
    want = resolve_config([], ["correction.method.type=icepop", "learner.num_ranks=4"])
    assert RunConfig.model_validate(doc["config"]) == want
    assert doc["config"]["async"] == {"max_lag": 1, "queue_ahead": False}  # users' spelling
    roles = {r["role"]: r["count"] for r in doc["placement"]}
    assert roles == {"rollout_worker": 1, "learner_rank": 4, "correction_service": 1}


def test_dry_run_creates_nothing(tmp_path):
    out = tmp_path / "new" / "run"
    result = runner.invoke(app, ["train", "--dry-run", f"output_dir={out}"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "new").exists()


def _refused(result, needle):
    text = " ".join(result.stderr.split())  # rich wraps long lines
    return result.exit_code == 2 and needle in text and "Traceback" not in result.output


@pytest.mark.parametrize("dry", [["--dry-run"], []], ids=["dry-run", "train"])
def test_output_dir_that_is_a_file_or_below_one_is_refused_before_anything_starts(tmp_path, dry):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for path, why in ((a_file, "exists and is not a directory"), (a_file / "run", "cannot be created")):
        result = runner.invoke(app, ["train", *dry, f"output_dir={path}"])
        assert _refused(result, f"error: output_dir '{path}' {why}"), result.output
        assert result.stdout == ""
    assert a_file.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission bits")
def test_output_dir_in_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        result = runner.invoke(app, ["train", "--dry-run", f"output_dir={ro / 'run'}"])
        assert _refused(result, "is not writable"), result.output
        assert "output_dir" in result.stderr
    finally:
        ro.chmod(0o700)


def test_output_dir_that_cannot_be_written_is_refused_whoever_runs_the_tests(tmp_path, monkeypatch):
    # As root no permission bit blocks a write, so os.access stands in for a read-only parent.
    denied = {str(tmp_path / "ro")}
    real_access = os.access
    monkeypatch.setattr("system.config.paths.os.access", lambda p, mode: str(p) not in denied and real_access(p, mode))
    (tmp_path / "ro").mkdir()
    result = runner.invoke(app, ["train", "--dry-run", f"output_dir={tmp_path / 'ro' / 'new' / 'run'}"])
    assert _refused(result, f"output_dir '{tmp_path / 'ro' / 'new' / 'run'}' cannot be created: '{tmp_path / 'ro'}' is not writable"), result.output
    result = runner.invoke(app, ["train", "--dry-run", f"output_dir={tmp_path / 'ro'}"])
    assert _refused(result, f"output_dir '{tmp_path / 'ro'}' is not writable"), result.output


def test_report_out_that_is_a_file_is_refused(tmp_path):
    dump = tmp_path / "d.npz"
    assert runner.invoke(app, ["demo-dump", str(dump), "--sequences", "4", "--max-len", "4"]).exit_code == 0
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for path, why in ((a_file, "exists and is not a directory"), (a_file / "o", "cannot be created")):
        result = runner.invoke(app, ["report", str(dump), "--out", str(path)])
        assert _refused(result, f"error: --out '{path}' {why}"), result.output


def test_check_output_dir_accepts_new_and_existing_directories(tmp_path):
    check_output_dir(tmp_path)
    check_output_dir(tmp_path / "a" / "b" / "c")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match="output_dir: String should have at least 1 character"):
        resolve_config([], ["output_dir=''"])
    with pytest.raises(ConfigError, match="broken symbolic link"):
        (tmp_path / "link").symlink_to(tmp_path / "missing")
        check_output_dir(tmp_path / "link")
    with pytest.raises(ConfigError, match="output_dir"):
        check_output_dir(tmp_path / ("x" * 300))
