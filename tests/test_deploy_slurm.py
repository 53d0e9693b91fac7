"""``deploy/slurm/aisrl.sbatch`` up to the point it would start Ray, with SLURM's commands stubbed: a head
node whose name resolves to loopback is refused (found by a probe: other nodes would wait 10 minutes
for a head at 127.0.1.1 and fail)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "slurm" / "aisrl.sbatch"


def _stubs(tmp_path: Path, head_ip: str, address: str | None = "auto") -> dict:
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv" / "bin"
    bin_dir.mkdir()
    venv.mkdir(parents=True)
    dry_run = json.dumps({"config": {"ray": {"address": address}}, "placement": []})
    stubs = {
        "aisrl": f"echo '{dry_run}'",  # the config check (--dry-run) passes, with this ray.address
        "scontrol": "printf 'node1\\nnode2\\nnode3\\n'",
        "srun": f'echo "$@" >> {tmp_path}/srun.log; echo {head_ip}',  # `hostname --ip-address` on the head
        "sleep": "exit 0",
        # the token is stubbed; the script's reading of the dry run's JSON runs the real interpreter
        "python": f'if [ "$1" = -c ] && [[ "$2" == *json* ]]; then exec {sys.executable} "$@"; fi; echo token',
    }
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
    """With the address given, the head's Ray starts on it (stubbed: every step returns at once)."""
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
