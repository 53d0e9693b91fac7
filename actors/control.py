"""The run's control board: a small named actor through which ``aisrl scale`` changes the number of
rollout workers of a running job, and which reports the job's progress.

The trainer creates it as ``aisrl-control-<run name>`` in the ``aisrl`` namespace and writes
``<run>/control.json`` (cluster address + actor name) so a second process can find it.
"""

import json
from pathlib import Path

import ray

NAMESPACE = "aisrl"


def control_name(run_dir: str | Path) -> str:
    return f"aisrl-control-{Path(run_dir).resolve().name}"


@ray.remote(num_cpus=0)
class RunControl:
    def __init__(self, num_workers: int) -> None:
        self.desired_workers = num_workers
        self.progress: dict = {}

    def set_workers(self, count: int) -> int:
        if count < 0:
            raise ValueError(f"--workers must be >= 0, got {count}")
        self.desired_workers = count
        return count

    def desired(self) -> int:
        return self.desired_workers

    def report(self, progress: dict) -> None:
        self.progress = progress

    def status(self) -> dict:
        return {"desired_workers": self.desired_workers, **self.progress}


def create_control(run_dir: Path, num_workers: int) -> ray.actor.ActorHandle:
    name = control_name(run_dir)
    handle = RunControl.options(name=name, namespace=NAMESPACE, get_if_exists=True).remote(num_workers)
    ctx = ray.get_runtime_context()
    (run_dir / "control.json").write_text(json.dumps({"gcs_address": ctx.gcs_address, "actor": name}, indent=1))
    return handle


def find_control(run_dir: str | Path, address: str | None) -> ray.actor.ActorHandle:
    """Connect to the run's cluster (``address`` or the one in ``control.json``) and get its board."""
    info_path = Path(run_dir) / "control.json"
    if not info_path.is_file():
        raise ValueError(f"{info_path}: not found; is a run using {run_dir} as output_dir running?")
    info = json.loads(info_path.read_text())
    ray.init(address=address or info["gcs_address"], namespace=NAMESPACE, log_to_driver=False)
    try:
        return ray.get_actor(info["actor"], namespace=NAMESPACE)
    except ValueError:
        raise ValueError(f"no running job owns {info['actor']} (the run has ended)") from None
