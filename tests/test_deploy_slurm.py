"""``deploy/slurm/aisrl.sbatch`` up to the point it would start Ray, with SLURM's commands stubbed: a head
node whose name resolves to loopback is refused (found by a probe: other nodes would wait 10 minutes
for a head at 127.0.1.1 and fail)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "slurm" / "aisrl.sbatch"
REAL_SLEEP = shutil.which("sleep")


def _stubs(tmp_path: Path, head_ip: str, address: str | None = "auto", overrides: dict | None = None) -> dict:
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv" / "bin"
    bin_dir.mkdir()
    venv.mkdir(parents=True)
    dry_run = json.dumps({"config": {"ray": {"address": address}}, "placement": []})
    stubs = {
        "aisrl": f"echo '{dry_run}'",  # the config check (--dry-run) passes, with this ray.address
        "scontrol": "printf 'node1\\nnode2\\nnode3\\n'",
        # `ray start --block` steps run until TERMed, as the real ones do; other steps return at once
        # (`hostname --ip-address` on the head prints head_ip)
        "srun": f'echo "$@" >> {tmp_path}/srun.log; if [[ "$*" == *"ray start"* ]]; then exec {REAL_SLEEP} 30; fi; '
                f'echo {head_ip}',
        "sleep": "exit 0",
        # the token is stubbed; the script's reading of the dry run's JSON runs the real interpreter; the
        # probe (`python - NODES`) finds every node up once each node's `ray start` step is running
        "python": f'if [ "$1" = -c ] && [[ "$2" == *json* ]]; then exec {sys.executable} "$@"; fi; '
                  f'if [ "$1" = - ]; then for _ in $(seq 400); do '
                  f'[ "$(grep -c "ray start" {tmp_path}/srun.log)" -ge "$2" ] && {{ echo "ray nodes up: $2/$2"; exit 0; }}; '
                  f'{REAL_SLEEP} 0.05; done; echo "ray nodes up: 0/$2"; echo "stub: no ray start steps"; exit 1; fi; '
                  'echo token',
    } | (overrides or {})
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (venv / "activate").write_text(f"export PATH={bin_dir}:$PATH\n")
    return {**os.environ, "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NODELIST": "node[1-3]",
            "SLURM_JOB_ID": "42", "AISRL_VENV": str(tmp_path / "venv"), "AISRL_TOKEN_DIR": str(tmp_path / "tok"),
            "HOME": str(tmp_path)}


@pytest.mark.parametrize("head_ip", ["127.0.1.1", "127.0.0.1"])
def test_a_head_that_resolves_to_loopback_is_refused_before_ray_starts(tmp_path, head_ip):
    env = _stubs(tmp_path, head_ip)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"resolves to '{head_ip}', which other nodes cannot reach; set AISRL_HEAD_IP" in proc.stderr
    assert not (tmp_path / "tok").exists()  # nothing made on the nodes' shared storage yet


def test_aisrl_head_ip_overrides_the_lookup(tmp_path):
    """With the address given, the head's Ray starts on it (stubbed: the Ray steps block until TERMed,
    the probe finds every node up at once, training returns at once)."""
    env = {**_stubs(tmp_path, "127.0.1.1"), "AISRL_HEAD_IP": "10.0.0.5"}
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and "cannot reach" not in proc.stderr, proc.stderr
    steps = (tmp_path / "srun.log").read_text()
    assert "ray start --head --node-ip-address=10.0.0.5 --port=6379 --dashboard-host=127.0.0.1" in steps
    assert "hostname --ip-address" not in steps  # not looked up
    assert not (tmp_path / "tok" / "ray_token_42").exists()  # its token removed at the end


def run_script(env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_a_config_without_ray_address_is_refused_before_ray_starts(tmp_path):
    """Found by a probe: ``sbatch aisrl.sbatch configs/gpu_qwen25_1p5b_gsm8k.yaml`` without multinode.yaml
    trained on a private cluster on the head node while the other nodes sat idle."""
    proc = run_script({**_stubs(tmp_path, "10.0.0.5", address=None)}, tmp_path)
    assert proc.returncode == 2
    assert "the config sets no ray.address, so the run would start a private Ray cluster" in proc.stderr
    assert not (tmp_path / "srun.log").exists() and not (tmp_path / "tok").exists()  # nothing started


@pytest.mark.parametrize(("name", "value"), [("ROLLOUT_NODES", "abc"), ("ROLLOUT_NODES", "0"),
                                             ("GPUS_PER_NODE", "-1"), ("RAY_PORT", "63 79")])
def test_a_setting_that_is_not_a_positive_whole_number_is_refused(tmp_path, name, value):
    """Found by a probe: ``ROLLOUT_NODES=abc`` printed ``integer expression expected`` twice and went on
    with every node a learner node (the rollout workers would wait for ever)."""
    proc = run_script({**_stubs(tmp_path, "10.0.0.5"), name: value}, tmp_path)
    assert proc.returncode == 2 and f"error: {name}='{value}' is not a positive whole number" in proc.stderr
    assert not (tmp_path / "srun.log").exists()


def test_every_step_gets_the_jobs_cpus_the_driver_too(tmp_path):
    """Steps do not inherit --cpus-per-task on Slurm 22.05-23.02; the driver's step lacked it (one core)."""
    env = {**_stubs(tmp_path, "10.0.0.5"), "SLURM_CPUS_PER_TASK": "32"}
    proc = run_script(env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in (tmp_path / "srun.log").read_text().splitlines() if "--nodelist" in line]
    launched = [line for line in steps if "ray start" in line or "aisrl train" in line]
    assert len(launched) == 4  # 3 nodes + the driver
    assert all("--cpus-per-task=32" in line for line in launched), launched


@pytest.mark.parametrize(("settings", "message"), [
    ({"RAY_PORT": "99999"}, "error: RAY_PORT=99999 is not a TCP port (1-65535)"),
    ({"DASHBOARD_PORT": "65536"}, "error: DASHBOARD_PORT=65536 is not a TCP port (1-65535)"),
    ({"RAY_PORT": "8265"}, "error: DASHBOARD_PORT=8265 is also RAY_PORT's port: the ports must differ"),
    ({"RAY_PORT": "7000", "DASHBOARD_PORT": "7000"}, "error: DASHBOARD_PORT=7000 is also RAY_PORT's port"),
    ({"RAY_PORT": "10001"}, "error: RAY_PORT=10001 is also the Ray client server's (Ray's default on the head) port"),
    ({"DASHBOARD_PORT": "52365"}, "error: DASHBOARD_PORT=52365 is also the Ray dashboard agent's"),
    ({"GPUS_PER_NODE": "010"}, "error: GPUS_PER_NODE='010' has a leading zero: write it as a plain decimal number"),
    ({"ROLLOUT_NODES": "00"}, "error: ROLLOUT_NODES='00' has a leading zero"),
    ({"RAY_PORT": "06379"}, "error: RAY_PORT='06379' has a leading zero"),
    ({"GPUS_PER_NODE": "99999999999999999999"}, "error: GPUS_PER_NODE='99999999999999999999' is too large"),
    ({"AISRL_JOIN_POLL_S": "1.5"}, "error: AISRL_JOIN_POLL_S='1.5' is not a positive whole number"),
    ({"AISRL_JOIN_TIMEOUT_S": "0"}, "error: AISRL_JOIN_TIMEOUT_S='0' is not a positive whole number"),
])
def test_a_port_out_of_range_or_used_twice_or_a_number_with_a_leading_zero_is_refused(tmp_path, settings, message):
    """Found by a probe: ``RAY_PORT=99999`` and ``RAY_PORT`` = ``DASHBOARD_PORT`` passed the checks and failed
    in ``ray start``; ``GPUS_PER_NODE=010`` passed and gave ``--resources={"rollout": 010}``, which is not JSON."""
    proc = run_script({**_stubs(tmp_path, "10.0.0.5"), **settings}, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr  # one line
    assert not (tmp_path / "srun.log").exists() and not (tmp_path / "tok").exists()  # nothing started


def test_resources_are_json_for_a_two_digit_gpu_count(tmp_path):
    proc = run_script({**_stubs(tmp_path, "10.0.0.5"), "GPUS_PER_NODE": "10", "RAY_PORT": "6380"}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    starts = sorted((re.search(r"--nodelist=(\S+)", line).group(1), line)  # background steps log in any order
                    for line in (tmp_path / "srun.log").read_text().splitlines() if "ray start" in line)
    starts = [line for _, line in starts]
    assert len(starts) == 3 and "ray start --head" in starts[0] and "--port=6380" in starts[0]
    roles = [json.loads(re.search(r"--resources=(\{.*?\})", line).group(1)) for line in starts]
    assert roles == [{"rollout": 10}, {"learner": 10}, {"learner": 10}]



def _cluster_stubs(tmp_path: Path, failing: dict[str, int], probe: str, head_answers: bool = True) -> dict:
    """``ray start`` steps that block like ``--block`` does (until TERMed), except on the nodes in ``failing``,
    whose step says ``port in use`` and exits at once with the given status; ``probe`` is the body of the
    shim run for the script's probe of every node (``python - 3``); the probe of the head alone
    (``python - 1``, before the workers start) says it is up when ``head_answers``, else runs ``probe``
    too. Sleeps are short."""
    if head_answers:
        probe = f'if [ "$2" = 1 ]; then echo "ray nodes up: 1/1"; exit 0; fi; {probe}'

    fail = "".join(f'if [[ "$*" == *--nodelist={node}\\ *"ray start"* ]]; then echo "{node}: port in use" >&2; '
                   f'exit {status}; fi; ' for node, status in failing.items())
    srun = f'echo "$@" >> {tmp_path}/srun.log; {fail}if [[ "$*" == *"ray start"* ]]; then exec {REAL_SLEEP} 30; fi; '
    srun += "echo 10.0.0.5"  # `hostname --ip-address` on the head
    python = (f'if [ "$1" = -c ] && [[ "$2" == *json* ]]; then exec {sys.executable} "$@"; fi; '
              f'if [ "$1" = - ]; then {probe}; fi; echo token')
    env = _stubs(tmp_path, "10.0.0.5", overrides={"srun": srun, "python": python,
                                                  "sleep": f"exec {REAL_SLEEP} 0.05"})
    return {**env, "AISRL_JOIN_POLL_S": "1", "AISRL_JOIN_TIMEOUT_S": "30"}


NOT_UP = 'echo "ray nodes up: 0/$2"; echo "ConnectionError: GCS at 10.0.0.5:6379 unreachable"; exit 1'


@pytest.mark.parametrize(("failing", "named"), [({"node1": 3}, "node1 (the head) ended, exit status 3"),
                                                ({"node3": 5}, "node3 (a worker) ended, exit status 5")])
def test_a_ray_start_step_that_ends_stops_the_wait_at_once_naming_its_node(tmp_path, failing, named):
    """Found by a probe: with every ``ray start`` step gone at once (a port in use) the script printed
    ``ray nodes up: 0/3`` every 10 s for 10 minutes, and the probe swallowed why it could not connect."""
    started = time.monotonic()
    proc = run_script(_cluster_stubs(tmp_path, failing, NOT_UP), tmp_path)
    assert time.monotonic() - started < 20  # not the 30 s join timeout
    assert proc.returncode == 1, proc.stderr
    assert f"error: the `ray start` step on {named}, before every node had joined" in proc.stderr
    assert "port in use" in proc.stderr  # the step's own output is in the log
    assert "did not come up" not in proc.stderr
    assert "aisrl train" not in (tmp_path / "srun.log").read_text()  # no training on a broken cluster
    if "node3" in failing or "ray nodes up" in proc.stdout:  # (a dead head is mostly caught before the probe)
        assert "ray nodes up: 0/3 (cannot connect yet: ConnectionError: GCS at 10.0.0.5:6379 unreachable)" \
            in proc.stdout, proc.stdout  # the probe's reason is shown
    assert not (tmp_path / "tok" / "ray_token_42").exists()  # the other steps were TERMed, the token removed


def test_the_probes_reason_is_shown_when_it_changes_then_the_run_starts(tmp_path):
    count = tmp_path / "probes"
    probe = (f'echo x >> {count}; n=$(wc -l < {count}); '
             'if [ "$n" -ge 4 ]; then echo "ray nodes up: 3/3"; exit 0; fi; echo "ray nodes up: 0/$2"; '
             'if [ "$n" -le 2 ]; then echo "ConnectionError: no GCS yet"; else echo "TimeoutError: slow"; fi; exit 1')
    env = {**_cluster_stubs(tmp_path, {}, probe), "AISRL_JOIN_POLL_S": "1"}
    proc = run_script(env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ray nodes up")]
    assert lines == ["ray nodes up: 1/1",  # the head answers; then the workers start
                     "ray nodes up: 0/3 (cannot connect yet: ConnectionError: no GCS yet)", "ray nodes up: 0/3",
                     "ray nodes up: 0/3 (cannot connect yet: TimeoutError: slow)", "ray nodes up: 3/3"], proc.stdout
    assert "aisrl train" in (tmp_path / "srun.log").read_text()


@pytest.mark.parametrize(("probe", "reason"), [
    (NOT_UP, "ConnectionError: GCS at 10.0.0.5:6379 unreachable"),
    ("exit 137", "no answer from the cluster in 120 s"),  # ray.init hung, killed by the probe's timeout
])
def test_the_join_wait_times_out_with_the_last_reason(tmp_path, probe, reason):
    env = {**_cluster_stubs(tmp_path, {}, probe), "AISRL_JOIN_TIMEOUT_S": "1"}
    proc = run_script(env, tmp_path)
    assert proc.returncode == 1
    assert f"error: the Ray cluster did not come up in 1 s (last: {reason})" in proc.stderr
    assert f"ray nodes up: 0/3 (cannot connect yet: {reason})" in proc.stdout
    assert not (tmp_path / "tok" / "ray_token_42").exists()


def test_the_workers_start_only_once_the_head_answers(tmp_path):
    """Found by a review: the workers were started a fixed 10 s after the head, and a worker gives up on a
    GCS that is not there after ~20 s, so a head slow to start (Ray imported from a shared file system)
    failed the job. The script now waits for the head itself: a head that never answers times out with
    the probe's reason, and no worker's ``ray start`` was run."""
    env = {**_cluster_stubs(tmp_path, {}, NOT_UP, head_answers=False), "AISRL_JOIN_TIMEOUT_S": "1"}
    proc = run_script(env, tmp_path)
    assert proc.returncode == 1
    assert "ray nodes up: 0/1 (cannot connect yet: ConnectionError: GCS at 10.0.0.5:6379 unreachable)" in proc.stdout
    assert "error: the Ray cluster did not come up in 1 s" in proc.stderr
    starts = [line for line in (tmp_path / "srun.log").read_text().splitlines() if "ray start" in line]
    assert len(starts) == 1 and "--head" in starts[0], starts  # the head's only
    assert not (tmp_path / "tok" / "ray_token_42").exists()
