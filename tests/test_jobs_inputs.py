"""``aisrl submit`` / ``aisrl job``: input checked before anything reaches a cluster (found by a bad-input
probe, 2026-11-27): a resume that the cluster would refuse, malformed addresses, token files that are
not one line of text (never echoed), a checkout file that cannot be shipped; what is staged and shipped
(code, config, no secrets), the token lookup, and the Jobs API's failures said in one line (later
probes). No cluster is started (the cluster-side tests are in ``tests/test_jobs.py``)."""

import json
import os
import re
import shlex
import socket
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actors import jobs
from actors.cli import app
from system.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CLOSED = "http://127.0.0.1:9"  # the discard port: closed on loopback


def test_a_resume_submission_refuses_here_what_the_cluster_would_refuse(tmp_path):
    """Found by a probe: ``aisrl submit --resume`` accepted ``seed=5`` (which ``aisrl train --resume``
    refuses), so the job failed only once it reached the cluster."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"max_steps": 5, "prompts_per_step": 4}))
    ckpt = run / "checkpoints" / "step_00000002"
    (ckpt / "learner").mkdir(parents=True)
    for name in ("controller.pkl", "learner/.metadata", "learner/trainer.json"):
        (ckpt / name).write_text("")
    for override, named in (("seed=5", "seed"), ("model.hidden_size=128", "model.hidden_size"),
                            ("data.task.num_digits=3", "data.task.num_digits")):
        with pytest.raises(ConfigError, match=f"{named} cannot change on a resume"):
            jobs.resolve_resume(str(run), ["max_steps=9", override])
    cfg, _ = jobs.resolve_resume(str(run), ["max_steps=9", "learner.lr=1e-4"])  # not fixed by the checkpoint
    assert cfg.learner.lr == 1e-4 and cfg.seed == 0  # the saved config has no seed: the default, unchanged


@pytest.mark.parametrize("address, needle", [
    ("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1:abc", "Port could not be cast"),
    ("http://127.0.0.1:99999", "Port out of range"), ("http://:8265", "expected the cluster's dashboard URL"),
    ("https://h:0", "port 0"),
])
def test_a_malformed_address_is_refused_naming_the_flag(address, needle):
    """Found by a probe: these reached ``requests`` and ended in a traceback (InvalidURL, ValueError)."""
    with pytest.raises(jobs.JobError, match=rf"--address '{re.escape(address)}': .*{re.escape(needle)}"):
        jobs.check_address(address)
    assert jobs.check_address("http://[::1]:8265/") == "http://[::1]:8265"


def test_a_token_file_that_is_not_one_line_of_text_is_refused_without_showing_it(tmp_path, monkeypatch):
    """Found by a probe: a token file of two lines put the secret into requests' InvalidHeader error on
    the terminal; a file that is not UTF-8 ended in a UnicodeDecodeError traceback."""
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    path = tmp_path / "token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    path.write_text("a1b2c3d4e5f6SECRET\nsecond-line\n")
    with pytest.raises(jobs.JobError, match="one line without spaces") as info:
        jobs.find_auth_token()
    assert "SECRET" not in str(info.value)
    path.write_bytes(b"\xff\xfe secret")
    with pytest.raises(jobs.JobError, match=r"cannot read the token file \(UnicodeDecodeError: not UTF-8 text\)") as info:
        jobs.find_auth_token()
    assert "secret" not in str(info.value)
    path.write_text("  a1b2c3  \n")
    assert jobs.find_auth_token() == ("a1b2c3", f"token from {path}")


def test_a_checkout_file_that_cannot_be_copied_is_named(tmp_path):
    """Found by a probe: a FIFO in the checkout made ``aisrl submit`` end in shutil.Error's traceback."""

    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    os.mkfifo(project / "pipe")
    with pytest.raises(jobs.JobError, match=r"cannot copy the checkout .*pipe.*remove or fix that file"):
        jobs.stage_working_dir(None, tmp_path / "staging", project=project)


def test_submit_warns_when_it_has_no_token_to_send(tmp_path, monkeypatch):
    """Found by a probe: the README's local head ran with token authentication off, and ``aisrl submit``
    sent no token without a word. Now it says so (not when a token is found, or auth is off by choice).
    The address is a closed port: the submission itself fails after the warning, naming the address."""
    from typer.testing import CliRunner

    from actors.cli import app

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)

    def submit() -> str:
        result = CliRunner().invoke(app, ["submit", "--address", "http://127.0.0.1:9", "max_steps=1",
                                          f"output_dir={tmp_path / 'run'}"])
        assert result.exit_code == 2 and "cannot reach the Ray Jobs API" in " ".join(result.output.split())
        return " ".join(result.output.split())

    assert "warning: no Ray auth token found" in submit()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a1b2c3")
    assert "no Ray auth token found" not in submit()
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert "no Ray auth token found" not in submit()


def test_a_dashboard_port_that_never_answers_times_out_in_one_line(monkeypatch):
    """Found by probe 9: a port that accepts and never answers (a stuck head, a half-dead port-forward) hung
    `aisrl job status/logs/stop` and `aisrl submit` for ever: the Jobs SDK sends requests without a timeout."""
    from actors import ray_internals

    monkeypatch.setattr(ray_internals, "JOBS_API_TIMEOUT_S", (1.0, 1.0))
    with socket.socket() as silent:  # the kernel completes the handshake (backlog); nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(jobs.JobError, match=r"did not answer \(connect 1 s, read 1 s\)"):
            jobs.status(url, "raysubmit_x")
        assert time.monotonic() - t0 < 20


def test_an_empty_or_spaced_job_id_is_refused_before_anything_is_sent():
    """Found by probe 9: `aisrl job status ""` (an unset shell variable) reached /api/jobs/, whose job list
    crashed the SDK with a TypeError; stop and logs printed a bare 404. A negative or NaN wait was accepted."""
    for args in (["job", "status", ""], ["job", "logs", "", "--follow"], ["job", "stop", "a b"]):
        out = CliRunner().invoke(app, [*args, "--address", CLOSED])
        said = " ".join(out.output.split())
        assert out.exit_code == 2 and "a job id (raysubmit_...)" in said, said
        assert "cannot reach" not in said  # refused before the (closed) port is tried
    for bad in ("-1", "nan"):
        out = CliRunner().invoke(app, ["job", "stop", "raysubmit_x", "--timeout-s", bad, "--address", CLOSED])
        assert out.exit_code == 2 and "a finite number >= 0" in " ".join(out.output.split()), out.output


def test_wandb_mode_of_the_submitting_shell_goes_with_the_job(tmp_path, monkeypatch):
    """Found by probe 9: `WANDB_MODE=disabled aisrl submit ...` shipped report.wandb.mode=offline without a
    word (the variable never reaches the job, which runs in the cluster's environment), while `aisrl train`
    applies it. A report.wandb.mode= override still wins, as for train."""
    shipped = []
    monkeypatch.setattr(jobs, "submit", lambda address, cfg, staging, **kw: shipped.append(cfg) or jobs.Submitted(
        "raysubmit_t", "aisrl train", {}))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    url = CLOSED
    out = CliRunner().invoke(app, ["submit", "--address", url, f"output_dir={tmp_path / 'r'}"])
    assert out.exit_code == 0, out.output
    assert "WANDB_MODE=disabled here: the job gets report.wandb.mode=disabled" in " ".join(out.output.split())
    assert shipped[-1].report.wandb.mode == "disabled"
    out = CliRunner().invoke(app, ["submit", "--address", url, f"output_dir={tmp_path / 'r'}",
                                   "report.wandb.mode=offline"])
    assert out.exit_code == 0 and "WANDB_MODE" not in out.output and shipped[-1].report.wandb.mode == "offline"


def test_submitting_into_a_directory_that_holds_a_run_is_refused_here(tmp_path):
    """Found by probe 9: the job was sent, and refused on the cluster with "continue it with 'aisrl train
    --resume ...'"; a run directory readable here is now refused before anything is sent, naming submit."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    cfg = jobs.resolve_for_cluster([], [f"output_dir={run}"])
    url = CLOSED  # contacted only with --overwrite
    with pytest.raises(jobs.JobError, match=rf"output_dir {run} already holds a run .*pass --overwrite"):
        jobs.submit(url, cfg, tmp_path / "staging")
    with pytest.raises(jobs.JobError, match="cannot reach the Ray Jobs API"):  # --overwrite: it goes on to the cluster
        (tmp_path / "staging2").mkdir()
        jobs.submit(url, cfg, tmp_path / "staging2", overwrite=True)


def test_sigterm_during_a_submission_removes_the_staged_checkout(tmp_path, monkeypatch):
    """Found by probe 9: `aisrl submit` killed by SIGTERM while it talked to the cluster left its staging copy
    of the checkout (/tmp/aisrl-submit-*, 4 MB) behind; Ctrl-C cleaned up. Now SIGTERM unwinds the same way."""
    import signal

    staged = []

    def terminated_while_sending(address, cfg, staging, **kw):
        (staging / "copy").write_text("x")
        staged.append(staging)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode: this sleep is interrupted
        raise AssertionError("SIGTERM did not end the submission")

    monkeypatch.setattr(jobs, "submit", terminated_while_sending)

    def ours(*_):  # without the CLI's own handler this one runs: the test fails cleanly, the process lives
        pass

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        out = CliRunner().invoke(app, ["submit", "--address", CLOSED, f"output_dir={tmp_path / 'r'}"])
        assert signal.getsignal(signal.SIGTERM) is ours  # the CLI put back the handler it found
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert out.exit_code == 143, (out.exit_code, out.output, out.exception)
    assert staged and not staged[0].exists()


def test_bad_address_is_rejected():
    with pytest.raises(jobs.JobError, match="dashboard URL"):
        jobs.check_address("127.0.0.1:8265")


def test_staging_ships_the_code_and_config_but_no_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-0123456789")
    cfg = jobs.resolve_for_cluster([str(ROOT / "configs/gpu_qwen25_1p5b_gsm8k.yaml"), str(ROOT / "configs/multinode.yaml")], [])
    staging = jobs.stage_working_dir(cfg, tmp_path / "stage")
    env = jobs.build_runtime_env(staging, stop_wait_s=90)

    # the libraries' warnings and progress bars off in the job's processes, as on a private cluster
    assert env["env_vars"] == {"RAY_JOB_STOP_WAIT_TIME_S": "90", "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1",
                               "TORCH_CPP_LOG_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error",
                               "VLLM_LOGGING_LEVEL": "ERROR"}
    assert jobs.build_runtime_env(staging, stop_wait_s=90, verbose=True)["env_vars"] == {"RAY_JOB_STOP_WAIT_TIME_S": "90"}
    shipped = (staging / jobs.SHIPPED_CONFIG).read_text()
    assert json.loads(shipped)["ray"]["address"] == "auto" and "wandb-secret" not in shipped
    assert (staging / "actors" / "jobs.py").is_file() and (staging / "pyproject.toml").is_file()
    for name in (".venv", ".git", "runs", "wandb"):
        assert not (staging / name).exists(), name
    assert not list(staging.rglob("__pycache__")) and not list(staging.rglob("*.pyc"))
    assert jobs.entrypoint() == f"aisrl train {jobs.SHIPPED_CONFIG}"
    assert jobs.entrypoint(dry_run=True) == f"aisrl train --dry-run {jobs.SHIPPED_CONFIG}"
    # a run that died before its first checkpoint: resubmitted over its output_dir (found missing by a review)
    assert jobs.entrypoint(overwrite=True) == f"aisrl train --overwrite {jobs.SHIPPED_CONFIG}"
    assert jobs.entrypoint(verbose=True) == f"aisrl train --verbose {jobs.SHIPPED_CONFIG}"
    assert jobs.entrypoint(resume="/r", verbose=True) == "aisrl train --verbose --resume /r"
    assert "output_dir 'runs/qwen25-1p5b-gsm8k' is relative" in jobs.placement_warnings(cfg)[0]


def test_secrets_in_env_vars_or_config_are_refused(tmp_path, monkeypatch):
    with pytest.raises(jobs.JobError, match="env_vars.WANDB_API_KEY"):
        jobs.check_no_secrets({"env_vars": {"WANDB_API_KEY": "x"}}, "{}")
    with pytest.raises(jobs.JobError, match="HF_TOKEN"):
        jobs.check_no_secrets({"env_vars": {"HF_TOKEN": "x"}}, "{}")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-0123456789")
    cfg = jobs.resolve_for_cluster([], ["report.wandb.run_name=wandb-secret-0123456789"])
    staging = jobs.stage_working_dir(cfg, tmp_path / "stage")
    with pytest.raises(jobs.JobError, match="WANDB_API_KEY"):
        jobs.build_runtime_env(staging, stop_wait_s=10)


def test_token_lookup_follows_rays_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert jobs.find_auth_token()[0] is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-home\n")
    assert jobs.find_auth_token()[0] == "from-home"
    (tmp_path / "tok").write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "tok"))
    assert jobs.find_auth_token()[0] == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert jobs.find_auth_token()[0] == "from-env"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert jobs.find_auth_token()[0] is None
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    with pytest.raises(jobs.JobError, match="RAY_AUTH_TOKEN_PATH"):
        jobs.find_auth_token()


def test_resume_submission_is_validated_here_when_the_run_is_readable(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"max_steps": 5, "prompts_per_step": 4}))
    with pytest.raises(jobs.JobError, match="no complete checkpoint"):
        jobs.resolve_resume(str(run), ["max_steps=9"])
    ckpt = run / "checkpoints" / "step_00000002"
    (ckpt / "learner").mkdir(parents=True)
    for name in ("controller.pkl", "learner/.metadata", "learner/trainer.json"):
        (ckpt / name).write_text("")
    cfg, overrides = jobs.resolve_resume(str(run), ["max_steps=9"])
    assert cfg.max_steps == 9 and cfg.prompts_per_step == 4 and cfg.output_dir == str(run)
    assert overrides == ["max_steps=9", "ray.address=auto"]  # the job joins the cluster it runs on
    with pytest.raises(ConfigError, match="max_step"):
        jobs.resolve_resume(str(run), ["max_step=9"])
    cfg, overrides = jobs.resolve_resume("/cluster/only/run", ["max_steps=9", "ray.address=ray://h:10001"])
    assert cfg is None and overrides == ["max_steps=9", "ray.address=ray://h:10001"]
    with pytest.raises(ConfigError, match="learner.lr"):
        jobs.resolve_resume("/cluster/only/run", ["learner.lr=fast"])
    with pytest.raises(jobs.JobError, match="absolute path"):
        jobs.resolve_resume("runs/try1", [])
    with pytest.raises(jobs.JobError, match="drop the output_dir"):
        jobs.resolve_resume(str(run), ["output_dir=/elsewhere"])
    command = jobs.entrypoint(resume="/runs/my run", overrides=["output_note=a b"])
    assert shlex.split(command) == ["aisrl", "train", "--resume", "/runs/my run", "output_note=a b"]


def test_a_relative_data_path_is_flagged_with_where_it_would_be_read(tmp_path):
    """Found by a review: the documented submit example read data/gsm8k/train.jsonl relative to the
    job's working directory (a staged copy of the checkout), never the cluster's /app/data volume."""
    preset = [str(ROOT / "configs/gpu_qwen25_1p5b_gsm8k.yaml")]
    cfg = jobs.resolve_for_cluster(preset, ["output_dir=/app/runs/q"])
    [missing] = jobs.placement_warnings(cfg, project=tmp_path)  # a checkout without the file
    assert "data.task.path 'data/gsm8k/train.jsonl' is relative" in missing and "will fail to find it" in missing
    assert "data.task.path=/app/data/gsm8k/train.jsonl" in missing
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "train.jsonl").write_text("{}\n")
    [shipped] = jobs.placement_warnings(cfg, project=tmp_path)
    assert "uploaded with the job" in shipped
    # probe 9: a file under an excluded folder (runs/) or matched by .gitignore (Ray's upload follows it)
    # was said to be "uploaded with the job", and the job failed to find it
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("data/\n")
    [ignored] = jobs.placement_warnings(cfg, project=tmp_path)
    assert "will fail to find it" in ignored, ignored
    (tmp_path / ".gitignore").write_text("")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "train.jsonl").write_text("{}\n")
    in_runs = jobs.resolve_for_cluster(preset, ["output_dir=/app/runs/q", "data.task.path=runs/train.jsonl"])
    [excluded] = jobs.placement_warnings(in_runs, project=tmp_path)
    assert "will fail to find it" in excluded, excluded
    assert "uploaded with the job" in jobs.placement_warnings(cfg, project=tmp_path)[0]  # .gitignore emptied
    absolute = jobs.resolve_for_cluster(preset, ["output_dir=/app/runs/q", "data.task.path=/app/data/gsm8k/train.jsonl"])
    assert jobs.placement_warnings(absolute) == []



def test_a_path_under_this_machines_home_is_said_before_it_ships(tmp_path, monkeypatch):
    """Found by a review: ``output_dir=~/runs/x`` is expanded here, at validation, and the job got this
    machine's ``/root/runs/x`` with no word said. A path under the home directory is now named; one
    elsewhere (shared storage) is not."""
    from system.config import resolve_config

    home = tmp_path / "home" / "me"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    cfg = resolve_config([], ["output_dir=~/runs/x", "data.task.type=gsm8k", "data.task.path=~/data/train.jsonl",
                              "data.reward.type=math-answer"])
    assert cfg.output_dir == str(home / "runs" / "x")
    said = jobs.home_path_warnings(cfg, home=home)
    assert [s.split(" is under")[0] for s in said] == [f"output_dir {str(home / 'runs' / 'x')!r}",
                                                        f"data.task.path {str(home / 'data' / 'train.jsonl')!r}"]
    shared = resolve_config([], [f"output_dir={tmp_path / 'shared' / 'runs'}"])
    assert jobs.home_path_warnings(shared, home=home) == []
    assert jobs.home_path_warnings(cfg, home=Path("/")) == []  # a home at the root would flag everything
