"""Config composition, strictness and every shipped preset."""

import itertools
import json
import re
from pathlib import Path

import pytest

from system.config import (
    ConfigError,
    RunConfig,
    dump_config,
    resolve_config,
)
from system.config.correction import IcePop, SeqMIS, TokenTIS
from system.config.loading import read_preset

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = sorted(CONFIGS.rglob("*.yaml"))


def test_presets_exist():
    assert len(PRESETS) >= 10, PRESETS


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_preset_validates(path):
    # Overlays are validated on top of the defaults, the way users compose them; every value the file
    # sets is the resolved config's value there (read back from the file's own YAML, key by key)
    cfg = resolve_config([path]).model_dump(mode="json", by_alias=True)
    values = list(_leaves(read_preset(path)))
    assert values, path
    for dotted, value in values:
        got = cfg
        for key in dotted:
            got = got[key]
        assert got == (pytest.approx(value) if isinstance(value, float) else value), (".".join(dotted), got, value)


def _leaves(tree: dict, prefix: tuple = ()):
    """(dotted path, value) of every leaf of a nested mapping."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


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
        ("correction.method.hii=2", "correction.method.hii: Extra inputs"),  # as typed: no union tag
        ("correction.method.hi=abc", "correction.method.hi: "),
        ("correction.method.hi=-1", "correction.method.hi: "),
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
    assert resolve_config([path]) == cfg  # a run's config.json is the preset of its --resume


def test_a_dump_with_characters_outside_the_bmp_round_trips_and_json_presets_read_as_json(tmp_path):
    """Found by a review: config.json escaped an emoji as a surrogate pair, which the YAML reader turned
    into two lone surrogates (the resumed run then failed encoding its prompts), and a JSON preset
    indented with tabs was refused as invalid YAML. A ``.json`` preset is now read as JSON (a key given
    twice refused, as in YAML), and the dump keeps the characters as they are."""
    cfg = resolve_config([], ["data.task.type=gsm8k", "data.task.path=train.jsonl", "data.reward.type=math-answer",
                              "data.task.prompt_template=\U0001f914 {question} \u00e9\u4e2d"])
    path = tmp_path / "config.json"
    path.write_text(dump_config(cfg), encoding="utf-8")
    assert "🤔" in path.read_text(encoding="utf-8")
    back = resolve_config([path])
    assert back == cfg and back.data.task.prompt_template.encode("utf-8")  # no lone surrogate
    tabbed = tmp_path / "tabbed.json"
    tabbed.write_text(json.dumps({"max_steps": 7, "async": {"max_lag": 0}}, indent="\t"), encoding="utf-8")
    assert (resolve_config([tabbed]).max_steps, resolve_config([tabbed]).async_.max_lag) == (7, 0)
    twice = tmp_path / "twice.json"
    twice.write_text('{"max_steps": 7, "max_steps": 8}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"twice\.json.*invalid JSON: key 'max_steps' appears twice"):
        resolve_config([twice])
    broken = tmp_path / "broken.json"
    broken.write_text('{"max_steps": ', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.json.*invalid JSON"):
        resolve_config([broken])
    empty = tmp_path / "empty.json"
    empty.write_text("", encoding="utf-8")
    assert read_preset(empty) == {}


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
        with pytest.raises(ConfigError, match=r"correction\.method\.hi: Extra inputs are not permitted "
                                              r"\(correction\.method is token-tis\)"):
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


def test_a_hash_in_an_override_is_part_of_the_value():
    # YAML would end a plain scalar at " #" (a comment): the GSM8K instruction lost its "####"
    cfg = resolve_config(["configs/gpu_qwen25_1p5b_gsm8k.yaml"], [
        "data.task.prompt_template=Solve {question} then end with #### and the number",
        "output_dir=runs/exp #2", "report.wandb.run_name=#1"])
    assert cfg.data.task.prompt_template == "Solve {question} then end with #### and the number"
    assert (cfg.output_dir, cfg.report.wandb.run_name) == ("runs/exp #2", "#1")
    # quoted, YAML keeps the "#" itself; a "#" inside a word never was a comment
    assert resolve_config([], ["report.wandb.run_name='exp #1'"]).report.wandb.run_name == "exp #1"
    assert resolve_config([], ["report.wandb.run_name=a#b"]).report.wandb.run_name == "a#b"
    # a "#" inside a word before the comment-like " #" (YAML kept "x#y" and cut the rest)
    assert resolve_config([], ["report.wandb.run_name=x#y #z"]).report.wandb.run_name == "x#y #z"
    # a flow mapping with a quoted " #" is YAML's to read
    cfg = resolve_config([], ['data.task={type: gsm8k, path: /tmp/x.jsonl, prompt_template: "{question} #### n"}',
                              "data.reward.type=math-answer"])
    assert cfg.data.task.prompt_template == "{question} #### n"


def test_errors_name_the_key_as_typed_the_layer_that_set_it_and_a_string_read_as_a_number(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("learner:\n  lr: -2\n")
    with pytest.raises(ConfigError, match=r"learner\.lr: Input should be greater than 0 \[set by preset '.*bad\.yaml'\]"):
        resolve_config([preset])
    with pytest.raises(ConfigError, match=r"learner\.lr: .* \[set by the overrides\]"):
        resolve_config([preset], ["learner.lr=-1"])
    with pytest.raises(ConfigError, match=r"output_dir: Input should be a valid string \(YAML read the value as "
                                          r"int 123: quote the text, \"output_dir='\.\.\.'\"\)"):
        resolve_config([], ["output_dir=123"])
    with pytest.raises(ConfigError, match=r"run_name: .*as date datetime\.date\(2024, 6, 1\)"):
        resolve_config([], ["report.wandb.run_name=2024-06-01"])
    with pytest.raises(ConfigError, match=r"data\.task\.path: Field required"):  # not data.task.gsm8k.path
        resolve_config([], ["data.task.type=gsm8k", "data.reward.type=math-answer"])


def test_an_unknown_key_near_a_known_one_is_answered_with_it():
    """A probe: ``max_step`` was refused without a hint. The closest known key beside it (difflib ratio
    >= 0.75: ``max_step`` / ``max_steps`` 2*8/17 = 0.94, ``lrr`` / ``lr`` 2*2/5 = 0.8) is suggested."""
    said = {}
    for override in ("max_step=3", "learner.lrr=1e-5", "correction.method.hii=2", "zzz=1"):
        with pytest.raises(ConfigError) as err:
            resolve_config([], [override])
        said[override] = str(err.value).splitlines()[1].strip()
    assert said == {
        "max_step=3": "max_step: Extra inputs are not permitted (did you mean max_steps?) [set by the overrides]",
        "learner.lrr=1e-5": "learner.lrr: Extra inputs are not permitted (did you mean learner.lr?) "
                            "[set by the overrides]",
        "correction.method.hii=2": "correction.method.hii: Extra inputs are not permitted (correction.method is "
                                   "seq-mis; did you mean correction.method.hi?) [set by the overrides]",
        "zzz=1": "zzz: Extra inputs are not permitted [set by the overrides]",  # nothing close: no guess
    }


def test_settings_that_cannot_learn_are_refused():
    with pytest.raises(ConfigError, match=r"rollout\.group_size: Input should be greater than or equal to 2"):
        resolve_config([], ["rollout.group_size=1"])  # a lone sample: advantage 0, no gradient
    with pytest.raises(ConfigError, match="addition-scratchpad needs data.reward.type scratchpad, got digit-match"):
        resolve_config([], ["data.task.type=addition-scratchpad", "rollout.max_new_tokens=96"])
    with pytest.raises(ConfigError, match="arithmetic needs data.reward.type digit-match or math-answer"):
        resolve_config([], ["data.reward.type=scratchpad"])
    # 9-digit operands: sums of up to 10 digits, cut at 6 tokens by the default
    with pytest.raises(ConfigError, match=r"max_new_tokens \(6\) is below the 10 tokens of a full answer"):
        resolve_config([], ["data.task.num_digits=9"])
    assert resolve_config([], ["data.task.num_digits=5"]).data.task.num_digits == 5  # 6 digits fit
    # the scratchpad tape of 4 digits is 3 * 16 + 24 + 1 = 73 characters
    with pytest.raises(ConfigError, match=r"below the 73 tokens"):
        resolve_config(["configs/long_cpu.yaml"], ["rollout.max_new_tokens=72"])
    assert resolve_config(["configs/long_cpu.yaml"], ["rollout.max_new_tokens=73"]).rollout.max_new_tokens == 73


def test_a_home_directory_in_paths_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = resolve_config([], ["output_dir=~/runs/a", "data.task.type=gsm8k", "data.task.path=~/d/x.jsonl",
                              "data.reward.type=math-answer"])
    assert cfg.output_dir == f"{tmp_path}/runs/a" and cfg.data.task.path == f"{tmp_path}/d/x.jsonl"
    # a user that does not exist: refused (it read as the relative directory ./~aisrl-no-such-user/run)
    with pytest.raises(ConfigError, match=r"output_dir: .*'~aisrl-no-such-user': no such user's home directory"):
        resolve_config([], ["output_dir=~aisrl-no-such-user/run"])
    with pytest.raises(ConfigError, match=r"data.task.path: .*'~aisrl-no-such-user': no such user"):
        resolve_config([], ["data.task.type=gsm8k", "data.task.path=~aisrl-no-such-user/x.jsonl",
                            "data.reward.type=math-answer"])


def test_the_tiny_model_cannot_use_a_chat_template():
    # its character tokenizer has none: every worker failed at start, five times over
    with pytest.raises(ConfigError, match="chat_template needs a model whose tokenizer has a chat template"):
        resolve_config([], ["data.task.type=gsm8k", "data.task.path=x.jsonl", "data.reward.type=math-answer",
                            "data.task.chat_template=true"])


@pytest.mark.parametrize("text, reads_as", [("1:30", "base-60 number (90)"), ("017", "octal number (15)"),
                                            ("1:30.5", "base-60 number (90.5)")])
def test_yaml_11_octal_and_base_60_numbers_are_refused_not_read(tmp_path, text, reads_as):
    """Found by a probe: ``max_steps=1:30`` silently became 90 (YAML 1.1 base 60), ``017`` 15 (octal)."""
    with pytest.raises(ConfigError, match=rf"max_steps={text}'.*'{text}' is a YAML 1.1 {re.escape(reads_as)}"):
        resolve_config([], [f"max_steps={text}"])
    preset = tmp_path / "p.yaml"
    preset.write_text(f"max_steps: {text}\n")
    with pytest.raises(ConfigError, match=rf"p\.yaml.*{re.escape(reads_as)}: write it in decimal"):
        resolve_config([preset])
    # quoted it is text; plain decimals, 0, underscores and hex still read as before
    assert resolve_config([], [f"report.wandb.run_name='{text}'"]).report.wandb.run_name == text
    assert [resolve_config([], [f"max_steps={v}"]).max_steps for v in ("90", "0x10", "1_000")] == [90, 16, 1000]


def test_yaml_merge_keys_work_and_may_be_overridden(tmp_path):
    """Found by a probe: ``<<: *anchor`` was refused as invalid YAML by the duplicate-key check."""
    preset = tmp_path / "merge.yaml"
    preset.write_text("_base: &eng {type: vllm, kv_cache_gib: 0.5, enforce_eager: true}\n"
                      "rollout:\n  engine:\n    <<: *eng\n    kv_cache_gib: 0.25\n")
    data = read_preset(preset)
    assert data["rollout"]["engine"] == {"type": "vllm", "kv_cache_gib": 0.25, "enforce_eager": True}


@pytest.mark.parametrize("override, field", [
    ("weight_sync={type: collective, timeout_s: 8.0e9}", "weight_sync.timeout_s"),
    ("weight_sync={type: collective, timeout_s: 1.0e-9}", "weight_sync.timeout_s"),  # passed, then a C++ crash
    ("weight_sync={type: delta, timeout_s: 0.0009}", "weight_sync.timeout_s"),
    ("rollout.worker_timeout_s=1e11", "rollout.worker_timeout_s"),
    ("report.wandb.init_timeout_s=1e7", "report.wandb.init_timeout_s"),
    ("rollout.engine.kv_cache_gib=1e-300", "rollout.engine.kv_cache_gib"),
    ("rollout.engine.kv_cache_gib=1e300", "rollout.engine.kv_cache_gib"),
    ("ray.object_store_gib=0.01", "ray.object_store_gib"),
])
def test_timeouts_and_memory_sizes_have_bounds(override, field):
    """Found by a probe: ``weight_sync.timeout_s`` from ~8e9 s made a broadcast spin forever or fail at
    once (torch's store counts milliseconds), 9e13 overflowed ``timedelta``; absurd sizes reached vLLM."""
    with pytest.raises(ConfigError, match=rf"{re.escape(field)}: Input should be (less|greater) than or equal"):
        resolve_config([], [override])
    assert resolve_config([], ["weight_sync={type: collective, timeout_s: 1.0e6}"]).weight_sync.timeout_s == 1e6
