"""``aisrl submit`` / ``aisrl job``: input checked before anything reaches a cluster (found by a bad-input
probe, 2026-11-27): a resume that the cluster would refuse, malformed addresses, token files that are
not one line of text (never echoed), a checkout file that cannot be shipped. No cluster is started."""

import json
import os
import re
import socket
import time

import pytest
from typer.testing import CliRunner

from actors import jobs
from actors.cli import app
from system.config import ConfigError

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
