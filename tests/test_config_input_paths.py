"""A run's local paths made absolute (``with_absolute_paths``) and its input files checked before it
starts (``check_input_paths``); both in ``aisrl train`` and its ``--dry-run``."""

import json

import pytest
from typer.testing import CliRunner

from actors.cli import app
from system.config import ConfigError, resolve_config
from system.config.paths import check_input_paths, looks_local, with_absolute_paths

runner = CliRunner()


def test_relative_paths_become_absolute_against_the_working_directory(tmp_path):
    """Found by a probe: on a joined cluster ``output_dir=relrun`` split the run: the driver wrote
    config.json under its own directory, the actors metrics.jsonl, checkpoints and W&B under the
    directory the raylet was started in, and the first checkpoint failed (FileNotFoundError)."""
    cfg = resolve_config([], ["output_dir=relrun", "data.task.type=gsm8k", "data.task.path=d/train.jsonl",
                              "data.reward.type=math-answer", "model.type=pretrained", "model.path=./m"])
    out = with_absolute_paths(cfg, cwd="/work/dir")
    assert (out.output_dir, out.model.path) == ("/work/dir/relrun", "/work/dir/m")
    # only the driver reads the data file: its path stays as given (a resubmitted job's copy resolves it)
    assert out.data.task.path == "d/train.jsonl"
    assert out.model_copy(update={"output_dir": "relrun", "model": cfg.model}) == cfg  # nothing else
    hub = resolve_config([], ["model.type=pretrained", "model.path=Qwen/Qwen2.5-0.5B", "output_dir=/abs/run"])
    kept = with_absolute_paths(hub, cwd="/work/dir")
    assert (kept.model.path, kept.output_dir) == ("Qwen/Qwen2.5-0.5B", "/abs/run")  # a hub id; already absolute


@pytest.mark.parametrize(("path", "local"), [("/m", True), ("./m", True), ("../m", True), ("~/m", True),
                                             (".", True), ("Qwen/Qwen2.5-0.5B", False), ("gpt2", False)])
def test_what_counts_as_a_local_model_path(path, local):
    assert looks_local(path) is local


def test_a_missing_data_file_or_local_model_is_refused_by_field(tmp_path):
    file_task = ["data.task.type=gsm8k", "data.reward.type=math-answer"]
    with pytest.raises(ConfigError, match=r"data\.task\.path: .*nope\.jsonl does not exist"):
        check_input_paths(resolve_config([], [*file_task, f"data.task.path={tmp_path / 'nope.jsonl'}"]))
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ConfigError, match=r"data\.task\.path: .*dir\.jsonl is a directory"):
        check_input_paths(resolve_config([], [*file_task, f"data.task.path={tmp_path / 'dir.jsonl'}"]))
    (tmp_path / "ok.jsonl").write_text("{}\n")
    check_input_paths(resolve_config([], [*file_task, f"data.task.path={tmp_path / 'ok.jsonl'}"]))
    with pytest.raises(ConfigError, match=r"model\.path: /nonexistent/model is not a directory .*org/name"):
        check_input_paths(resolve_config([], ["model.type=pretrained", "model.path=/nonexistent/model"]))
    check_input_paths(resolve_config([], ["model.type=pretrained", "model.path=Qwen/Qwen2.5-0.5B"]))  # not checked


def test_the_dry_run_refuses_a_missing_data_file_and_prints_an_absolute_output_dir(tmp_path, monkeypatch):
    """Found by a probe: ``--dry-run`` of the GPU preset away from the checkout passed; the run then
    failed on ``data.task.path`` after starting its cluster (and the SLURM script relies on the dry run)."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["train", "--dry-run", "data.task.type=gsm8k", "data.reward.type=math-answer",
                                 "data.task.path=data/train.jsonl"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "data.task.path: data/train.jsonl does not exist" in said
    assert f"a relative path is read from the directory aisrl runs in, {tmp_path}" in said
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    result = runner.invoke(app, ["train", "--dry-run", "data.task.type=gsm8k", "data.reward.type=math-answer",
                                 "data.task.path=data/train.jsonl", "output_dir=r"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    assert (config["output_dir"], config["data"]["task"]["path"]) == (f"{tmp_path}/r", "data/train.jsonl")


def test_the_dry_run_refuses_gpus_a_private_cluster_here_does_not_have(tmp_path, monkeypatch):
    """Found by a probe: ``--dry-run ray.rollout_gpus=1 ray.learner_gpus=1`` passed on a machine without
    a GPU; the run refused it once its cluster was up."""
    import actors.placement

    monkeypatch.setattr(actors.placement, "local_gpus", lambda cfg: 0)
    result = runner.invoke(app, ["train", "--dry-run", "ray.rollout_gpus=1", "ray.learner_gpus=1",
                                 f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2
    assert ("the 2 learner rank(s) and 1 rollout worker(s) reserve 3 GPU but this machine's private cluster "
            "has 0") in " ".join(result.output.split())
    monkeypatch.setattr(actors.placement, "local_gpus", lambda cfg: 4)
    result = runner.invoke(app, ["train", "--dry-run", "ray.rollout_gpus=1", "ray.learner_gpus=1",
                                 f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 0, result.output
    # a cluster joined at run time decides for itself: not refused here
    result = runner.invoke(app, ["train", "--dry-run", "ray.rollout_gpus=1", "ray.learner_gpus=1", "ray.address=auto",
                                 f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 0, result.output


def test_a_pretrained_model_that_cannot_be_loaded_here_is_one_line_naming_model_path(tmp_path):
    """Found by a probe: a hub id that could not be fetched (offline) failed in the dataset's context
    check with a 400-line traceback. A directory without config.json stands in for it here (no network
    in tests); one with a config.json and no tokenizer is refused too."""
    from system.models.model_dir import resolve_model_dir

    empty = tmp_path / "empty-model"
    empty.mkdir()
    cfg = resolve_config([], ["model.type=pretrained", f"model.path={empty}"])
    with pytest.raises(ConfigError, match=rf"model\.path {empty}: cannot be loaded here \((OSError|ValueError): .*config\.json"):
        resolve_model_dir(cfg)
    (empty / "config.json").write_text('{"model_type": "qwen2"}')
    # probe 10: no tokenizer files (transformers makes an empty one) failed only once the cluster was up
    with pytest.raises(ConfigError, match=rf"model\.path {empty}: no tokenizer there"):
        resolve_model_dir(cfg)


def test_a_pretrained_models_tokenizer_must_fit_its_embeddings(tmp_path, tiny_tokenizer):
    """Found by probe 10: a tokenizer of 15 tokens on a model of 10 embedding rows passed the start; vLLM
    sampled on and the learner's first step raised "IndexError: index out of range in self"."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from system.models.model_dir import resolve_model_dir

    assert len(tiny_tokenizer) == 15
    for rows, ok in ((10, False), (15, True), (64, True)):  # more rows than tokens is common (padded tables)
        path = tmp_path / f"rows{rows}"
        Qwen2ForCausalLM(Qwen2Config(vocab_size=rows, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)).save_pretrained(path)
        tiny_tokenizer.save_pretrained(path)
        cfg = resolve_config([], ["model.type=pretrained", f"model.path={path}"])
        if ok:
            assert resolve_model_dir(cfg) == str(path)
        else:
            with pytest.raises(ConfigError, match=rf"model\.path {path}: its tokenizer has 15 tokens, the model's "
                                                  r"embeddings 10 rows"):
                resolve_model_dir(cfg)
    # probe 10: a head size vLLM's CPU attention cannot run failed inside the engine after start-up
    path = tmp_path / "head16"
    Qwen2ForCausalLM(Qwen2Config(vocab_size=15, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=1)).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    with pytest.raises(ConfigError, match=rf"model\.path {path}: head size 16, which vLLM's CPU attention cannot run"):
        resolve_model_dir(resolve_config([], ["model.type=pretrained", f"model.path={path}"]))
    on_gpus = resolve_config([], ["model.type=pretrained", f"model.path={path}", "ray.rollout_gpus=1"])
    assert resolve_model_dir(on_gpus) == str(path)  # GPU backends run it


def test_a_preset_whose_path_holds_an_equals_sign_is_a_preset(tmp_path, monkeypatch):
    """Found by a probe: ``cfg=dir/icepop.yaml`` was read as the override ``cfg``: "Extra inputs are
    not permitted"."""
    preset = tmp_path / "lr=3e-4" / "icepop.yaml"
    preset.parent.mkdir()
    preset.write_text("correction:\n  method:\n    type: icepop\n")
    result = runner.invoke(app, ["train", "--dry-run", str(preset), f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["correction"]["method"]["type"] == "icepop"
    # an override whose value names a .json file that does not exist stays an override
    from actors.cli import split_args

    assert split_args(["data.task.path=train.json"]) == ([], ["data.task.path=train.json"])


def test_a_tilde_in_a_path_argument_is_the_home_directory(tmp_path, monkeypatch):
    """Found by a probe: ``aisrl demo-dump "~/x.npz"`` and ``--out=~/x`` (the shell expands neither)
    made a literal ``./~`` directory; ``--resume=~/run`` said "no config.json there"."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["demo-dump", "~/d.npz", "--sequences", "4"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "home" / "d.npz").is_file() and not (tmp_path / "~").exists()
    result = runner.invoke(app, ["report", "~/d.npz", "--out=~/rep"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "home" / "rep" / "report.html").is_file() and not (tmp_path / "~").exists()


def test_a_tilde_with_an_empty_home_is_refused_not_the_root_directory(tmp_path, monkeypatch):
    """A review's finding: with ``HOME=''`` (an unset variable exported empty) Python expands ``~/runs/x``
    to ``/runs/x``: a run, a dump or a report would have been written under the root directory."""
    monkeypatch.setenv("HOME", "")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'~/runs/x': HOME is set but empty"):
        resolve_config([], ["output_dir=~/runs/x"])
    result = runner.invoke(app, ["demo-dump", "~/d.npz", "--sequences", "4"])
    assert result.exit_code == 2 and "HOME is set but empty" in result.output, result.output
    result = runner.invoke(app, ["report", str(tmp_path / "none.npz"), "--out=~/rep"])
    assert result.exit_code == 2 and "HOME is set but empty" in result.output, result.output
    assert not (tmp_path / "~").exists()
    # a path without a tilde is untouched by an empty HOME
    assert resolve_config([], [f"output_dir={tmp_path / 'r'}"]).output_dir == str(tmp_path / "r")


def test_an_override_that_is_not_yaml_is_one_line_printed_as_typed():
    """Found this session: ``rollout.stop=[a`` printed PyYAML's five-line message, and the CLI's console
    read ``[a': ... ']`` as rich markup and dropped it ("override 'rollout.stop=', but got ...")."""
    result = runner.invoke(app, ["train", "--dry-run", "rollout.stop=[a"])
    said = result.output.strip()
    assert result.exit_code == 2 and len(said.splitlines()) == 1
    assert said.startswith("error: override 'rollout.stop=[a': value is not valid YAML (expected ',' or ']'")
    assert said.endswith("goes in quotes: \"rollout.stop='...'\"")
    assert "but got '<stream end>' at character 3 of the value)" in said
    # a path with brackets in any message stays whole
    result = runner.invoke(app, ["train", "--dry-run", "data.task.type=gsm8k", "data.reward.type=math-answer",
                                 "data.task.path=/nope/[red]x[/red].jsonl"])
    assert result.exit_code == 2 and "/nope/[red]x[/red].jsonl does not exist" in " ".join(result.output.split())


def test_a_checkpoint_whose_head_does_not_generate_is_refused_before_the_cluster(tmp_path, tiny_tokenizer):
    """A BERT masked-LM checkpoint (with a fitting tokenizer) was refused only by the vLLM engine, after
    the cluster and the learner had started; now at the config, naming model.path and the architecture.
    A causal model of the same files passes."""
    from transformers import BertConfig, BertForMaskedLM, Qwen2Config, Qwen2ForCausalLM

    from system.models.model_dir import resolve_model_dir

    bert, qwen = tmp_path / "bert", tmp_path / "qwen"
    BertForMaskedLM(BertConfig(vocab_size=32, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(bert)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(qwen)
    for path in (bert, qwen):
        tiny_tokenizer.save_pretrained(path)
    with pytest.raises(ConfigError, match=rf"model.path {bert}: a BertForMaskedLM checkpoint, whose head does not "):
        resolve_model_dir(resolve_config([], ["model.type=pretrained", f"model.path={bert}"]))
    assert resolve_model_dir(resolve_config([], ["model.type=pretrained", f"model.path={qwen}"])) == str(qwen)
