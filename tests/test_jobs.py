"""``aisrl submit`` and ``aisrl job status|stop|logs`` against a real Ray head with token auth on.

The head is this module's own: ``ray start --head --block`` in a new process group, every port
on 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), its own ``--temp-dir`` and a random
token (``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN``, which takes precedence over
``~/.ray/auth_token``: that file is neither read nor written). Teardown signals only that
process group (then, by pid, any process still running in the temp dir) and removes the temp
dir; never ``ray stop``.

The job that must reach SUCCEEDED is a real one-step ``aisrl train`` (1 rollout worker, 1
learner rank on the head's 2 CPUs): about 35 s on an idle 2-core machine, 50-70 s when it is
shared; the whole file about 75 s idle.

The CLI runs as a subprocess, so its token lookup sees exactly the environment a test gives it.
The tests without the ``ray`` mark need no cluster (staging, secrets, local validation).
"""

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from actors import jobs
from system.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# One real training step on the head's 2 CPUs: 1 rollout worker + 1 learner rank.
ONE_STEP = ["max_steps=1", "prompts_per_step=4", "rollout.group_size=4", "rollout.prompts_per_call=2",
            "learner.num_ranks=1", "model.warm_start_steps=20", "report.console=false",
            "report.dump_every=0", "checkpoint_every=0"]


@dataclass(frozen=True)
class Head:
    url: str
    token: str
    tmp: Path
    gcs: str  # host:port of the head's GCS, the address a job's ray.address=auto joins


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def head_env(token: str, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "AISRL_CACHE_DIR": str(tmp / "models"),
            "WANDB_MODE": "offline"}


def start_head(tmp: Path, token: str) -> tuple[subprocess.Popen, str, str]:
    gcs, dash, client, agent = free_ports(4)
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs}",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
           f"--dashboard-agent-listen-port={agent}", "--num-cpus=2", "--disable-usage-stats",
           f"--temp-dir={tmp / 'ray'}"]
    log = open(tmp / "head.log", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(cmd, env=head_env(token, tmp), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, f"http://127.0.0.1:{dash}", f"127.0.0.1:{gcs}"


def wait_ready(proc: subprocess.Popen, url: str, token: str, tmp: Path, timeout_s: float = 90) -> None:
    request = urllib.request.Request(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "ray start exited:\n" + (tmp / "head.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(request, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("the head's Jobs API did not come up:\n" + (tmp / "head.log").read_text()[-3000:])


def stop_head(proc: subprocess.Popen, tmp: Path) -> None:
    """SIGTERM our process group, SIGKILL it after 15 s, then any leftover running in our temp dir."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    for p in psutil.process_iter(["pid", "cwd", "cmdline"]):
        inside = (p.info["cwd"] or "").startswith(str(tmp)) or str(tmp) in " ".join(p.info["cmdline"] or [])
        if inside and p.pid != os.getpid():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def head():
    tmp = Path(tempfile.mkdtemp(prefix="aisrl-ray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    token = secrets.token_hex(16)
    proc, url, gcs = start_head(tmp, token)
    try:
        wait_ready(proc, url, token, tmp)
        yield Head(url, token, tmp, gcs)
    finally:
        stop_head(proc, tmp)


def aisrl(*args: str, token: str | None, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI in a subprocess whose only token source is ``token`` (HOME is an empty dir).
    ``stderr`` comes back with its whitespace collapsed (rich wraps long messages)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "WANDB_API"))}
    env["HOME"] = str(home)
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    out = subprocess.run([str(BIN / "aisrl"), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out.stderr = " ".join(out.stderr.split())
    return out


def job_ids(out: str) -> list[str]:
    return re.findall(r"^(raysubmit_\w+)$", out, flags=re.M)


# -- on the cluster ----------------------------------------------------------------------------

@pytest.mark.ray
@pytest.mark.slow
def test_submit_runs_the_validated_config_to_success(head, tmp_path):
    run = tmp_path / "run"
    t0 = time.monotonic()
    try:
        out = aisrl("submit", "--address", head.url, *ONE_STEP, f"output_dir={run}", "--follow",
                    token=head.token, home=tmp_path, timeout=180)
    except subprocess.TimeoutExpired as exc:
        streamed = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail("the job did not end within 180 s; the end of its logs:\n" + streamed[-3000:])
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [job_id] = job_ids(out.stdout)
    print(f"submit -> SUCCEEDED in {elapsed:.1f} s")
    assert "done: 1 steps" in out.stdout + out.stderr  # streamed by --follow

    status = aisrl("job", "status", job_id, "--address", head.url, token=head.token, home=tmp_path)
    assert status.returncode == 0 and status.stdout.startswith(f"{job_id} SUCCEEDED"), status.stdout + status.stderr
    logs = aisrl("job", "logs", job_id, "--address", head.url, token=head.token, home=tmp_path).stdout
    assert f"aisrl train {jobs.SHIPPED_CONFIG}" in logs and "done: 1 steps" in logs
    assert f"joined the Ray cluster at {head.gcs}" in logs  # ray.address=auto: it joined this head
    # without --verbose the log has no library noise (before: progress bars of the driver's model write
    # and of the rank's weight load, vLLM's FutureWarnings, torch's NUMA binding warning)
    for noise in ("it/s]", "FutureWarning", "NUMA binding"):
        assert noise not in logs, logs[-3000:]

    shipped = jobs.resolve_for_cluster([], [*ONE_STEP, f"output_dir={run}"])
    assert json.loads((run / "config.json").read_text()) == shipped.model_dump(mode="json", by_alias=True)
    assert [json.loads(r)["step"] for r in (run / "metrics.jsonl").read_text().splitlines()] == [1]

    # --resume: the run continues on the cluster from its checkpoint, with its own config.json
    out = aisrl("submit", "--address", head.url, "--resume", str(run), "max_steps=2", "--follow",
                token=head.token, home=tmp_path, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "done: 2 steps" in out.stdout + out.stderr
    resumed = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2] and resumed[1]["policy_version"] == 2
    ledger = json.loads((run / "ledger.json").read_text())
    assert ledger["trained"] == 2 * 4 and ledger["duplicates"] == 0  # prompts_per_step 4, none twice
    assert json.loads((run / "config.json").read_text())["max_steps"] == 2


@pytest.mark.ray
@pytest.mark.slow
def test_job_stop_ends_a_long_job_with_sigterm_first(head, tmp_path):
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.url, headers={"Authorization": f"Bearer {head.token}"})
    script = ("import signal, sys, time\n"
              "def bye(*_):\n    print('SIGTERM: clean exit', flush=True); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye); print('long job started', flush=True); time.sleep(600)\n")
    job_id = client.submit_job(entrypoint=f"python -c {shlex.quote(script)}",
                               runtime_env={"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "30"}})
    deadline = time.monotonic() + 60
    while not re.search(r"^long job started$", client.get_job_logs(job_id), flags=re.M):
        assert time.monotonic() < deadline and client.get_job_status(job_id) in ("PENDING", "RUNNING")
        time.sleep(0.5)

    out = aisrl("job", "stop", job_id, "--address", head.url, token=head.token, home=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"{job_id} STOPPED", out.stdout + out.stderr
    # ended on SIGTERM (the job's own line says so), not by the SIGKILL 30 s later
    assert re.search(r"^SIGTERM: clean exit$", client.get_job_logs(job_id), flags=re.M)


@pytest.mark.ray
@pytest.mark.slow
def test_submission_without_the_token_is_refused(head, tmp_path):
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.url, headers={"Authorization": f"Bearer {head.token}"})
    before = {j.submission_id for j in client.list_jobs()}
    missing = aisrl("submit", "--address", head.url, "--dry-run", token=None, home=tmp_path)
    assert missing.returncode == 2
    assert "authentication failed (no token found" in missing.stderr and "Unauthorized" in missing.stderr, missing.stderr
    wrong = aisrl("submit", "--address", head.url, "--dry-run", token="not-the-token", home=tmp_path)
    assert wrong.returncode == 2 and "Invalid authentication token" in wrong.stderr, wrong.stderr
    assert {j.submission_id for j in client.list_jobs()} == before  # nothing was submitted


@pytest.mark.ray
@pytest.mark.slow
def test_unknown_job_id_is_a_clear_error(head, tmp_path):
    out = aisrl("job", "status", "raysubmit_doesnotexist", "--address", head.url, token=head.token, home=tmp_path)
    assert out.returncode == 2 and "raysubmit_doesnotexist" in out.stderr, out.stderr
    # --follow too (probe 9: a traceback of the refused websocket, WSServerHandshakeError 404)
    out = aisrl("job", "logs", "raysubmit_doesnotexist", "--follow", "--address", head.url, token=head.token,
                home=tmp_path)
    assert out.returncode == 2 and "raysubmit_doesnotexist" in out.stderr and "does not exist" in out.stderr, out.stderr
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_scale_without_the_token_says_so_in_one_line(head, tmp_path):
    """Found by probe 9: `aisrl scale` in the README's second terminal (no RAY_AUTH_TOKEN there) ended in a
    traceback (AuthenticationError); with the token it reaches the cluster and finds no such run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "control.json").write_text(json.dumps({"gcs_address": head.gcs, "actor": "aisrl-control-none",
                                                  "auth_mode": "token"}))
    missing = aisrl("scale", str(run), "--workers", "1", token=None, home=tmp_path, timeout=120)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "authentication failed" in missing.stderr and "RAY_AUTH_TOKEN" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stdout + missing.stderr
    assert f"control.json's gcs_address={head.gcs}" in missing.stderr  # where the address came from
    held = aisrl("scale", str(run), "--workers", "1", token=head.token, home=tmp_path, timeout=120)
    assert held.returncode == 2 and "no running job owns aisrl-control-none" in held.stderr, held.stderr
    dashboard = aisrl("scale", str(run), "--workers", "1", "--address", head.url, token=head.token, home=tmp_path)
    assert dashboard.returncode == 2 and "a dashboard (Jobs API) URL" in dashboard.stderr, dashboard.stderr


# -- local: nothing is sent ----------------------------------------------------------------------

def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"


def test_invalid_config_is_reported_without_contacting_the_cluster(tmp_path):
    url = closed_port_url()
    bad = aisrl("submit", "--address", url, "learner.num_ranks=3", token="t", home=tmp_path, timeout=120)
    assert bad.returncode == 2 and "invalid config" in bad.stderr and "num_ranks" in bad.stderr, bad.stderr
    assert "cannot reach" not in bad.stderr
    unknown = aisrl("submit", "--address", url, "rollout.no_such_key=1", token="t", home=tmp_path, timeout=120)
    assert unknown.returncode == 2 and "rollout.no_such_key" in unknown.stderr, unknown.stderr
    # The same command with a valid config does try the (closed) port: the check above ran first.
    good = aisrl("submit", "--address", url, "--dry-run", token="t", home=tmp_path, timeout=120)
    assert good.returncode == 2 and "cannot reach the Ray Jobs API" in good.stderr, good.stderr


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

