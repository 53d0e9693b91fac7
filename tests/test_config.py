"""Config composition, strictness and every shipped preset."""

import json
from pathlib import Path

import pytest

from system.config import ConfigError, RunConfig, dump_config, load_resolved, resolve_config
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
