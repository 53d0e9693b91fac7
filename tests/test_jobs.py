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
The tests without the ``ray`` mark need no cluster (local validation); the other local checks
(staging, secrets, token lookup, timeouts) are in ``tests/test_jobs_inputs.py``.
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

pytestmark = pytest.mark.own_cluster  # the head and the CLI are subprocesses: a cluster of its own

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
    # the console holds aisrl's lines and the job's, not Ray's INFO lines (package upload, the job
    # supervisor's "Runtime env is setting up.", "WebSocket closed")
    assert not re.search(r"\bINFO \S+\.py:\d+ --", out.stdout + out.stderr), out.stdout[-3000:] + out.stderr[-3000:]

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
