"""Config composition, strictness and every shipped preset."""

import itertools
import json
from pathlib import Path

import pytest

from system.config import (
    ConfigError,
    RunConfig,
    dump_config,
    load_resolved,
    resolve_config,
)
from system.config.correction import IcePop, SeqMIS, TokenTIS

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


def test_a_key_twice_in_one_yaml_mapping_is_refused_naming_file_key_and_lines(tmp_path):
    # PyYAML keeps the last of two equal keys silently: a preset's first value would vanish
    preset = tmp_path / "twice.yaml"
    preset.write_text("learner:\n  lr: 1.0e-3\n  grad_clip: 1.0\n  lr: 2.0e-3\n")
    with pytest.raises(ConfigError, match=r"(?s)twice\.yaml.*key 'lr' appears twice \(line 2, column 3 and line 4"):
        resolve_config([preset])
    with pytest.raises(ConfigError, match=r"(?s)override 'learner=\{lr: 1, lr: 2\}'.*key 'lr' appears twice"):
        resolve_config([], ["learner={lr: 1, lr: 2}"])
    # the same key name in two different mappings is fine
    ok = tmp_path / "ok.yaml"
    ok.write_text("learner: {lr: 1.0e-3}\nrollout: {group_size: 4}\n")
    assert resolve_config([ok]).learner.lr == 1.0e-3


def test_cross_field_bounds_are_refused_naming_both_fields():
    with pytest.raises(ConfigError, match=r"num_workers \(3\) is above max_workers \(2\)"):
        resolve_config([], ["rollout.num_workers=3", "rollout.max_workers=2"])
    assert resolve_config([], ["rollout.num_workers=2", "rollout.max_workers=2"]).rollout.max_workers == 2
    # the tiny model's context holds prompt + response: 128 positions leave no room for a prompt at 128
    with pytest.raises(ConfigError, match=r"rollout\.max_new_tokens \(128\).*model\.max_position_embeddings \(128\)"):
        resolve_config([], ["rollout.max_new_tokens=128"])
    assert resolve_config([], ["rollout.max_new_tokens=127"]).rollout.max_new_tokens == 127
