"""A private cluster started by aisrl listens on loopback only, even when ``ray`` was imported first,
its GCS keeps a bounded number of task events (it grew ~25 KB a step without levelling off), and it
starts no idle workers that no actor could use."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray

PROBE = """
import ray  # imported before aisrl on purpose: the local-only switch must still take effect
import time

import psutil
from actors.cluster import connect
from system.config.cluster import RayConfig

connect(RayConfig(object_store_gib=0.2), num_cpus=1)
time.sleep(3)  # with Ray's default, one idle worker (num_cpus=1) is up by now (seen at 3 s, 2-core AMD EPYC VM)
print("IDLE_WORKERS", sum(p.name() == "ray::IDLE" for p in psutil.Process().children(recursive=True)))

@ray.remote
def node_ip():
    return ray.util.get_node_ip_address()

print("GCS", ray.get_runtime_context().gcs_address)
print("WORKER", ray.get(node_ip.remote()))
for proc in psutil.Process().children(recursive=True):
    try:
        conns = proc.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        continue
    for c in conns:
        if c.status == psutil.CONN_LISTEN:
            print("LISTEN", proc.name(), c.laddr.ip)
    if proc.name() == "gcs_server":
        print("GCS_TASK_EVENTS", proc.environ().get("RAY_task_events_max_num_task_in_gcs"))
    if proc.name() == "raylet":
        print("RAYLET_PRESTART", proc.environ().get("RAY_prestart_worker_first_driver"))
ray.shutdown()
"""


def test_private_cluster_binds_to_loopback_only():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    gcs = next(line.split()[1] for line in lines if line.startswith("GCS"))
    worker = next(line.split()[1] for line in lines if line.startswith("WORKER"))
    listening = [line.split() for line in lines if line.startswith("LISTEN")]
    assert gcs.startswith("127.0.0.1:") and worker == "127.0.0.1"
    assert listening, "no listening socket found among the cluster's processes"
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _, _, ip in listening), listening
    assert [line.split()[1] for line in lines if line.startswith("GCS_TASK_EVENTS")] == ["10000"]
    # no idle workers started for nothing: every aisrl actor has a runtime_env of its own
    assert [line.split()[1] for line in lines if line.startswith("RAYLET_PRESTART")] == ["0"]
    assert [line.split()[1] for line in lines if line.startswith("IDLE_WORKERS")] == ["0"]
