"""``deploy/slurm/aisrl.sbatch`` up to the point it would start Ray, with SLURM's commands stubbed: a head
node whose name resolves to loopback is refused (found by a probe: other nodes would wait 10 minutes
for a head at 127.0.1.1 and fail)."""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "slurm" / "aisrl.sbatch"


def _stubs(tmp_path: Path, head_ip: str) -> dict:
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv" / "bin"
    bin_dir.mkdir()
    venv.mkdir(parents=True)
    stubs = {
        "aisrl": "exit 0",  # the config check (--dry-run) passes
        "scontrol": "printf 'node1\\nnode2\\nnode3\\n'",
        "srun": f'echo "$@" >> {tmp_path}/srun.log; echo {head_ip}',  # `hostname --ip-address` on the head
        "sleep": "exit 0",
        "python": "echo token",
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
