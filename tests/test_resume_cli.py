"""``aisrl train`` at the command line: ``--resume``, ``--overwrite`` and ``--dry-run`` (found by a
bad-input probe and reviews, 2026-11-27): the directory name is a path, not YAML; a config written
before a field existed resumes; a dry run refuses what the run itself would refuse; what a resume
may and may not change."""

import json
import subprocess
import sys

import pytest
from test_run_state import make_checkpoint
from typer.testing import CliRunner

from actors.cli import app
from system.config import ConfigError, RunConfig, dump_config, resolve_config


@pytest.fixture(autouse=True)
def _plain_console(monkeypatch):
    monkeypatch.setenv("AISRL_VERBOSE", "1")


def _run_dir(parent, name: str, max_steps: int = 3, **fields):
    run = parent / name
    run.mkdir()
    cfg = json.loads(dump_config(RunConfig.model_validate({"output_dir": str(run), "max_steps": max_steps, **fields})))
    (run / "config.json").write_text(json.dumps(cfg))
    make_checkpoint(run, 2)
    return run, cfg


def _train(*args, cwd=None, monkeypatch=None):
    if cwd is not None:
        monkeypatch.chdir(cwd)
    result = CliRunner().invoke(app, ["train", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("name", ["2024-01-01", "123", "exp: 1", "[a]", "'q'", "q "])
def test_the_resumed_directory_is_the_one_named_whatever_its_name(tmp_path, monkeypatch, name):
    """``--resume 2024-01-01`` used to become the override ``output_dir=2024-01-01``, which YAML reads as
    a date (refused, pointing at an override nobody typed); ``'q'`` and ``q `` resolved to ``q``."""
    _run_dir(tmp_path, name)
    rc, out = _train("--dry-run", "--resume", name, "max_steps=9", cwd=tmp_path, monkeypatch=monkeypatch)
    assert rc == 0, out
    printed = json.loads(CliRunner().invoke(app, ["train", "--dry-run", "--resume", name, "max_steps=9"]).stdout)
    assert printed["config"]["output_dir"] == str(tmp_path / name)  # made absolute where the command ran


def test_a_config_written_before_a_field_existed_resumes(tmp_path, monkeypatch):
    """``data.task.chat_template`` (added 2026-11-25) missing from an older run's config.json was taken
    for a change ("cannot change on a resume"): the saved parts are compared with today's defaults."""
    task = {"type": "gsm8k", "path": str(tmp_path / "train.jsonl")}
    (tmp_path / "train.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    run, cfg = _run_dir(tmp_path, "old", data={"task": task, "reward": {"type": "math-answer"}})
    del cfg["data"]["task"]["chat_template"]
    del cfg["model"]["warm_start_label_smoothing"]  # not compared: left out to show the rest still reads
    (run / "config.json").write_text(json.dumps(cfg))
    rc, out = _train("--dry-run", "--resume", str(run), "max_steps=9")
    assert rc == 0, out
    # a real change is still refused
    rc, out = _train("--dry-run", "--resume", str(run), "max_steps=9", "data.task.prompt_template='Q {question}'")
    assert rc == 2 and "data.task.prompt_template cannot change on a resume" in out, out


def test_a_dry_run_refuses_what_the_run_would(tmp_path):
    # --resume of a directory with no checkpoint: the run says "no usable checkpoint"
    run = tmp_path / "bare"
    run.mkdir()
    (run / "config.json").write_text(dump_config(RunConfig.model_validate({"output_dir": str(run)})))
    rc, out = _train("--dry-run", "--resume", str(run))
    assert rc == 2 and "no usable checkpoint under" in out, out
    # --resume past max_steps
    done, _ = _run_dir(tmp_path, "done", max_steps=2)
    rc, out = _train("--dry-run", "--resume", str(done))
    assert rc == 2 and "nothing to train" in out, out
    # .replaced/ (an interrupted --overwrite) refuses a resume and an overwrite alike
    held, _ = _run_dir(tmp_path, "held")
    (held / ".replaced").mkdir()
    for args in (("--resume", str(held), "max_steps=9"), ("--overwrite", f"output_dir={held}")):
        rc, out = _train("--dry-run", *args)
        assert rc == 2 and "holds .replaced/" in out, (args, out)
    assert (held / ".replaced").is_dir() and (held / "config.json").is_file()  # nothing moved


def test_a_saved_config_read_as_the_preset_names_the_file(tmp_path):
    """--resume reads the run's config.json as its preset: a broken one is named, field and file."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"seed": -1}')
    with pytest.raises(ConfigError, match=r"seed: Input should be greater.*bad.json"):
        resolve_config([bad])
    with pytest.raises(ConfigError, match="missing.json'?: no such file"):
        resolve_config([tmp_path / "missing.json"])
    (tmp_path / "adir.yaml").mkdir()  # a probe: said "no such file"
    with pytest.raises(ConfigError, match="adir.yaml'?: a directory"):
        resolve_config([tmp_path / "adir.yaml"])
    bad.write_text("{")
    with pytest.raises(ConfigError, match="bad.json'?: invalid JSON"):
        resolve_config([bad])
    good = tmp_path / "good.json"
    good.write_text(dump_config(RunConfig(seed=7)))
    assert resolve_config([good]).seed == 7


def test_train_refuses_conflicting_flags_and_a_dry_run_says_what_the_run_would_refuse(tmp_path):
    """Found by a review: ``--resume R output_dir=X`` silently trained in R; ``--resume --overwrite
    --dry-run`` and a dry run into a directory holding a run exited 0, though the run refuses both."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(dump_config(RunConfig.model_validate({"output_dir": str(run)})))
    make_checkpoint(run, 2)
    runner = CliRunner()

    def refused(*args: str) -> str:
        result = runner.invoke(app, ["train", *args])
        assert result.exit_code == 2, result.output
        return " ".join(result.output.split())

    assert "names another" in refused("--resume", str(run), f"output_dir={tmp_path / 'elsewhere'}")
    assert "pass one of them" in refused("--resume", str(run), "--overwrite", "--dry-run")
    assert "already holds a run" in refused("--dry-run", f"output_dir={run}")
    # the same directory named both ways is fine; a dry run with --overwrite deletes nothing
    ok = runner.invoke(app, ["train", "--dry-run", "--resume", str(run), f"output_dir={run}/"])
    assert ok.exit_code == 0, ok.output
    ok = runner.invoke(app, ["train", "--dry-run", "--overwrite", f"output_dir={run}"])
    assert ok.exit_code == 0 and (run / "config.json").is_file(), ok.output


def test_python_dash_m_actors_cli_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "actors.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "train" in done.stdout and "report" in done.stdout, done.stdout + done.stderr


def test_a_resume_that_changes_the_seed_data_or_model_is_refused_up_front(tmp_path):
    """Found by a review: a changed seed, data or model was found only after the cluster, the model build
    and the learners' load (the sampler's fingerprint). Now exit 2 before anything starts."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(dump_config(RunConfig.model_validate({"output_dir": str(run), "max_steps": 3})))
    make_checkpoint(run, 2)
    for override, named in (("seed=5", "seed"), ("data.task.num_digits=3", "data.task.num_digits"),
                            ("model.hidden_size=128", "model.hidden_size")):
        result = CliRunner().invoke(app, ["train", "--dry-run", "--resume", str(run), "max_steps=9", override])
        assert result.exit_code == 2, result.output
        assert f"{named} cannot change on a resume" in " ".join(result.output.split())
    # what the checkpoint does not depend on may change: the learner, the reward, the warm start
    for override in ("learner.lr=1e-4", "data.reward.type=math-answer", "model.warm_start_steps=10"):
        ok = CliRunner().invoke(app, ["train", "--dry-run", "--resume", str(run), "max_steps=9", override])
        assert ok.exit_code == 0, (override, ok.output)


def test_a_resume_may_fix_a_saved_value_that_a_newer_check_refuses(tmp_path):
    """Found by a review: the saved config was validated on its own first, so a value refused by a newer
    check (here the tiny model's answer length) could not be fixed by the resume's own override."""
    run = tmp_path / "run"
    run.mkdir()
    saved = json.loads(dump_config(RunConfig.model_validate({"output_dir": str(run), "max_steps": 3})))
    saved["rollout"]["max_new_tokens"] = 2  # below the 3 characters of a 2-digit sum (refused today)
    (run / "config.json").write_text(json.dumps(saved))
    make_checkpoint(run, 2)
    result = CliRunner().invoke(app, ["train", "--dry-run", "--resume", str(run), "max_steps=9",
                                      "rollout.max_new_tokens=6"])
    assert result.exit_code == 0, result.output
    # output_dir as YAML reads it: the same directory quoted is not "another"
    same = CliRunner().invoke(app, ["train", "--dry-run", "--resume", str(run), "max_steps=9",
                                    "rollout.max_new_tokens=6", f"output_dir='{run}'"])
    assert same.exit_code == 0, same.output


def test_a_resume_that_switches_a_type_says_which_saved_fields_it_reset(tmp_path):
    """The probe's case: --resume of a delta run with shared_memory false, switched to collective,
    ran with shared_memory true without a word. Now the console says so (the switch itself is allowed)."""
    run, _ = _run_dir(tmp_path, "delta", max_steps=3,
                      weight_sync={"type": "delta", "shared_memory": False, "chunk_mb": 16})
    rc, out = _train("--dry-run", "--resume", str(run), "max_steps=5", "weight_sync.type=collective")
    assert rc == 0, out
    assert "note: weight_sync.type delta -> collective (the overrides) replaces weight_sync whole, so " in out
    assert "weight_sync.shared_memory (false -> true)" in out and "weight_sync.chunk_mb (16 -> 64)" in out, out
    assert "timeout_s" not in out.partition("note:")[2].partition("{")[0]  # the saved 60.0 is the default too
    rc, out = _train("--dry-run", "--resume", str(run), "max_steps=5", "weight_sync.type=collective",
                     "weight_sync.shared_memory=false", "weight_sync.chunk_mb=16")
    assert rc == 0 and "replaces weight_sync whole" not in out, out


def test_a_resume_of_an_empty_config_json_is_refused(tmp_path):
    """A probe: a truncated (empty) config.json resumed as every default (max_steps 150, seed 0)."""
    run, _ = _run_dir(tmp_path, "emptied", max_steps=3)
    (run / "config.json").write_text("")
    rc, out = _train("--dry-run", "--resume", str(run), "max_steps=5")
    assert rc == 2 and f"{run / 'config.json'} is empty (a damaged run directory?)" in out, out
    before = (run / "config.json").read_bytes()
    rc, out = _train("--resume", str(run), "max_steps=5")
    assert rc == 2 and "is empty" in out and (run / "config.json").read_bytes() == before, out


def test_a_dry_run_resume_says_which_checkpoint_it_would_take_and_what_it_skips(tmp_path):
    """A probe: with steps 4 and 6 damaged, `--dry-run --resume` exited 0 without a word of the fall-back
    to step 2 that the run itself says."""
    run, _ = _run_dir(tmp_path, "damaged", max_steps=9)  # a checkpoint at step 2
    c4, c6 = make_checkpoint(run, 4), make_checkpoint(run, 6)
    (c6 / "controller.pkl").write_bytes(b"\x80\x04\x95")  # truncated
    shard = c4 / "learner" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:40])
    rc, out = _train("--dry-run", "--resume", str(run))
    assert rc == 0, out
    assert "warning: checkpoint step_00000006: " in out and "warning: checkpoint step_00000004: learner half" in out
    assert f"note: the run would resume from {run / 'checkpoints' / 'step_00000002'}" in out, out
