"""Config values that make no sense are refused, naming the field: booleans and non-finite values
in number fields, and thresholds that would reject or truncate the on-policy ratio 1."""

import typing

import pytest
from pydantic import BaseModel, ValidationError

from system.config import (
    ConfigError,
    RunConfig,
    resolve_config,
)
from system.config.correction import CorrectionConfig, IcePop, SeqMIS
from system.config.learner import LearnerConfig

# -- strict numbers (issue 9 a) -------------------------------------------------------------------

def _number_fields(model_cls, prefix="", loc_prefix="", setup=(), of=(int, float)):
    """(dotted key, overrides selecting its union member, error path, kind) of every int / float
    field (``of``: those kinds), found by walking the annotations (a union member is selected with
    its ``type``)."""
    for name, field in model_cls.model_fields.items():
        key = field.alias or name
        args = typing.get_args(field.annotation) or (field.annotation,)
        members = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if members:
            for member in members:
                if field.discriminator:  # a tagged union, maybe of one member
                    tag = member.model_fields["type"].default
                    yield from _number_fields(member, f"{prefix}{key}.", f"{loc_prefix}{key}.",
                                              (*setup, f"{prefix}{key}.type={tag}"), of)
                else:
                    yield from _number_fields(member, f"{prefix}{key}.", f"{loc_prefix}{key}.", setup, of)
            continue
        kinds = {a for a in args if a in of}
        if kinds:
            yield f"{prefix}{key}", setup, f"{loc_prefix}{key}", "float" if float in kinds else kinds.pop().__name__


NUMBER_FIELDS = list(_number_fields(RunConfig))
BOOL_FIELDS = list(_number_fields(RunConfig, of=(bool,)))


def test_the_walk_finds_the_number_fields():
    keys = {k for k, *_ in NUMBER_FIELDS}
    assert {"seed", "max_steps", "learner.lr", "async.max_lag", "correction.method.hi",
            "correction.method.c", "correction.method.lo", "ray.num_cpus", "model.hidden_size",
            "learner.max_nonfinite_steps", "correction.method.veto"} <= keys
    assert len(NUMBER_FIELDS) > 40


@pytest.mark.parametrize(("key", "setup", "loc", "kind"), NUMBER_FIELDS, ids=[f"{k}-{s}" for k, s, *_ in NUMBER_FIELDS])
def test_no_number_field_takes_a_boolean_or_a_non_finite_value(key, setup, loc, kind):
    # The error names the dotted key as typed (without the union tag pydantic adds to its location).
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


def test_the_walk_finds_the_boolean_fields():
    keys = {k for k, *_ in BOOL_FIELDS}
    assert {"weight_sync.shared_memory", "async.queue_ahead", "report.console",
            "rollout.engine.enforce_eager", "model.trust_remote_code", "correction.method.self_normalize"} <= keys
    assert all(kind == "bool" for *_, kind in BOOL_FIELDS)


@pytest.mark.parametrize(("key", "setup", "loc", "kind"), BOOL_FIELDS, ids=[f"{k}-{s}" for k, s, *_ in BOOL_FIELDS])
def test_no_boolean_field_takes_a_number_or_a_word(key, setup, loc, kind):
    """A probe: ``weight_sync.shared_memory=1`` became true and ``=0.0`` or ``=n`` false (pydantic's
    lax booleans). YAML's own booleans still work (``yes``/``no`` are booleans to YAML)."""
    for value, shown in [("1", "1"), ("0", "0"), ("0.0", "0.0"), ("n", "'n'"), ("maybe", "'maybe'"), ("2", "2")]:
        with pytest.raises(ConfigError) as err:
            resolve_config([], [*setup, f"{key}={value}"])
        assert f"{loc}: expected true or false, got {shown}" in str(err.value), (value, str(err.value))
    for value, parsed in (("false", False), ("no", False), ("off", False), ("true", True), ("yes", True)):
        try:  # taken, as YAML reads it (a union member may want other fields: then no error at this key)
            node = resolve_config([], [*setup, f"{key}={value}"])
        except ConfigError as err:
            assert f"{loc}: " not in str(err), (value, str(err))
            continue
        for part in key.split("."):
            node = getattr(node, "async_" if part == "async" else part)
        assert node is parsed, (key, value)


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
    assert resolve_config([], [f"max_steps={2**63 - 1}"]).max_steps == 2**63 - 1
    # the seed reaches numpy's legacy seeding in vLLM's engine: 0 .. 2**32 - 1
    assert resolve_config([], [f"seed={2**32 - 1}"]).seed == 2**32 - 1
    with pytest.raises(ConfigError, match="seed: Input should be less than or equal to 4294967295"):
        resolve_config([], [f"seed={2**32}"])
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
    method = resolve_config([], overrides).correction.method.model_dump()
    for override in overrides:  # each value set is the resolved method's
        field, value = override.removeprefix("correction.method.").split("=")
        assert method[field] == (value if field == "type" else float(value)), override


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


def test_prompt_pools_are_bounded_and_gsm8k_is_scored_by_math_answer():
    """Found by a probe: num_prompts=1e15 passed --dry-run, then the sampler's permutation asked for
    7 PiB; gsm8k with digit-match scored exact answers below 1 ('#### 72' against 72: 0)."""
    for task in ("arithmetic", "addition-scratchpad"):
        reward = "scratchpad" if task == "addition-scratchpad" else "digit-match"
        with pytest.raises(ConfigError, match=r"data.task.num_prompts: Input should be less than or equal to 10000000"):
            resolve_config([], [f"data.task.type={task}", f"data.reward.type={reward}", "data.task.num_prompts=1000000000000000"])
    with pytest.raises(ConfigError, match="data.task.type gsm8k needs data.reward.type math-answer, got digit-match"):
        resolve_config([], ["data.task={type: gsm8k, path: x.jsonl}", "data.reward.type=digit-match"])
    assert resolve_config([], ["data.task={type: gsm8k, path: x.jsonl}", "data.reward.type=math-answer"]).data.task.type == "gsm8k"


@pytest.mark.parametrize("project, found", [("a/b", "(found /)"), ("team:x", "(found :)"), ("p%?", "(found % ?)"),
                                            ("x" * 129, "(it has 129)"), ("", "(it has 0)")])
def test_a_w_and_b_project_name_w_and_b_refuses_is_refused_up_front(project, found):
    """Found by a probe: ``report.wandb.project=a/b`` passed ``--dry-run``; the run then started without
    its W&B record (W&B's ``UsageError: Invalid project name``)."""
    with pytest.raises(ConfigError, match=r"report\.wandb\.project: .*1-128 characters") as info:
        resolve_config([], [f"report.wandb.project='{project}'"])
    assert found in str(info.value)
    assert resolve_config([], ["report.wandb.project=my-project_2"]).report.wandb.project == "my-project_2"


def test_sizes_no_run_could_hold_are_refused_before_anything_starts():
    """A probe's dry runs accepted these; each run would have failed late or exhausted memory:
    async.max_lag=10**18 (every step record counts each lag up to it), a batch of 8 * 10**15
    sequences, a tiny model of 6.1e13 parameters (64 x 64 x ... per layer, 10**9 layers)."""
    with pytest.raises(ConfigError, match=r"async\.max_lag: Input should be less than or equal to 1024"):
        resolve_config([], ["async.max_lag=1000000000000000000"])
    assert resolve_config([], ["async.max_lag=1024"]).async_.max_lag == 1024
    with pytest.raises(ConfigError, match=r"8,000,000,000,000,000 sequences a step, above 1,000,000"):
        resolve_config([], ["prompts_per_step=1000000000000000"])
    assert resolve_config([], ["prompts_per_step=125000"]).sequences_per_step == 10**6  # the bound itself
    # per layer 2 h^2 + 2 h kv + 3 h i = 2*64^2 + 2*64*32 + 3*64*256 = 61,440; times 10**9 layers
    with pytest.raises(ConfigError, match=r"about 6.1e\+13 parameters, above the 2e\+09"):
        resolve_config([], ["model.num_layers=1000000000"])
    assert resolve_config([], []).model.approx_params() == 2 * 61_440  # the default's two layers


@pytest.mark.parametrize("value", ["CPU", "GPU", "memory", "object_store_memory", "node:10.0.0.1",
                                   "accelerator_type:A100", " "])
@pytest.mark.parametrize("field", ["rollout_resource", "learner_resource"])
def test_a_role_resource_must_be_a_custom_one(field, value):
    """Found by a review: ``ray.rollout_resource=CPU`` passed validation and --dry-run, and Ray refused
    it only after the cluster started ("Use the 'num_cpus' and 'num_gpus' keyword instead"), without
    naming the field. Custom names pass."""
    with pytest.raises(ConfigError, match=rf"ray\.{field}"):
        resolve_config([], [f"ray.{field}={value}"] if value.strip() else [f"ray.{field}=' '"])
    assert getattr(resolve_config([], [f"ray.{field}=gpu_node"]).ray, field) == "gpu_node"
