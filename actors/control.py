"""The run's control board: a small named actor through which ``aisrl scale`` changes the number of
rollout workers of a running job, and which reports the job's progress.

The trainer creates it as ``aisrl-control-<run name>-<path hash>`` in the ``aisrl`` namespace and writes
``<run>/control.json`` (cluster address + actor name) so a second process can find it.
"""

import hashlib
import json
import logging
import os
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.cluster import join, reachable
from actors.placement import RoleOptions, actor_needs
from actors.ray_internals import reload_config
from system import run_state
from system.config import RunConfig
from system.config.rollout import MAX_ROLLOUT_WORKERS

log = logging.getLogger(__name__)

NAMESPACE = "aisrl"


def control_name(run_dir: str | Path) -> str:
    """The board's actor name: the run directory's name and a hash of its whole path (two runs in
    directories with the same name, ``/a/try1`` and ``/b/try1``, must not share one board)."""
    resolved = Path(run_dir).resolve()
    return f"aisrl-control-{resolved.name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"


@ray.remote(num_cpus=0)
class RunControl:
    def __init__(self, num_workers: int, ceiling: int = MAX_ROLLOUT_WORKERS, facts: dict | None = None) -> None:
        self.desired_workers = num_workers
        self.ceiling = ceiling
        """The most workers ``aisrl scale`` may ask for: ``rollout.max_workers``, else ``MAX_ROLLOUT_WORKERS``."""
        self.facts = dict(facts or {})
        """What stays true for the run: ``private_cluster``, ``worker_needs`` (one rollout worker's reservation)."""
        self.progress: dict = {}

    def set_workers(self, count: int) -> int:
        if not 0 <= count <= self.ceiling:
            raise ValueError(f"--workers must be in 0 .. {self.ceiling} (rollout.max_workers, or at most "
                             f"{MAX_ROLLOUT_WORKERS}), got {count}")
        self.desired_workers = count
        return count

    def desired(self) -> int:
        return self.desired_workers

    def report(self, progress: dict) -> None:
        self.progress = progress

    def status(self) -> dict:
        return {"desired_workers": self.desired_workers, **self.facts, **self.progress}


def create_control(run_dir: Path, cfg: RunConfig, worker: RoleOptions) -> ray.actor.ActorHandle:
    """The run's board (``rollout.num_workers`` at first, at most ``rollout.max_workers``), knowing what
    one rollout worker (``worker``) reserves and whether the cluster is private (for ``aisrl scale``)."""
    num_workers, ceiling = cfg.rollout.num_workers, cfg.rollout.max_workers or MAX_ROLLOUT_WORKERS
    facts = {"private_cluster": cfg.ray.address is None, "worker_needs": actor_needs(worker)}
    name = control_name(run_dir)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    handle = RunControl.options(name=name, namespace=NAMESPACE, get_if_exists=True,
                                scheduling_strategy=here).remote(num_workers, ceiling, facts)  # dies only with the driver's node
    ctx = ray.get_runtime_context()
    info = {"gcs_address": ctx.gcs_address, "actor": name, "auth_mode": os.environ.get("RAY_AUTH_MODE", "disabled")}
    # whole or absent: `aisrl scale` may read it at any moment
    run_state.write_text_whole(run_dir / "control.json", json.dumps(info, indent=1))
    return handle


def read_control_file(path: Path) -> dict:
    """``control.json``'s ``gcs_address`` and ``actor``; a file that is not one is refused naming it."""
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not readable as a run's control file ({exc})") from None
    bad = [k for k in ("gcs_address", "actor") if not isinstance(info, dict) or not isinstance(info.get(k), str)
           or not info[k]]
    if not bad and not isinstance(info.get("auth_mode", ""), str):
        bad = ["auth_mode"]
    if bad:
        raise ValueError(f"{path}: not a run's control file ({', '.join(bad)} missing or not text); the run's "
                         "driver writes it when its cluster is up")
    return info


def remove_control_file(run_dir: Path) -> None:
    """Remove ``control.json``; a run directory that became unwritable (or was removed) is said, not
    raised: this runs while the run's parts are stopped, and the stops after it must still run."""
    try:
        (run_dir / "control.json").unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not remove %s (%s): `aisrl scale` reads it; remove it by hand",
                    run_dir / "control.json", exc)


def find_control(run_dir: str | Path, address: str | None) -> ray.actor.ActorHandle:
    """Connect to the run's cluster (``address`` or the one in ``control.json``) and get its board."""
    info_path = Path(run_dir) / "control.json"
    if not info_path.is_file():
        raise ValueError(f"{info_path}: not found; is a run using {run_dir} as output_dir running?")
    info = read_control_file(info_path)
    if address and address.split("://")[0].lower() in ("http", "https"):
        raise ValueError(f"--address {address}: a dashboard (Jobs API) URL, which `aisrl submit` and `aisrl job` "
                         "take; `aisrl scale` joins the cluster itself: its GCS address (host:port, as in "
                         "control.json), or leave --address out")
    target = address or info["gcs_address"]
    what = "--address" if address else f"{info_path}'s gcs_address"
    if not reachable(target):
        raise ValueError(f"{what} {target}: nothing answers there (a Ray cluster's GCS address, host:port, as "
                         f"in control.json)" if address else
                         f"cannot reach the run's cluster at {target}: the run has ended (or pass --address)")
    # The token itself is never written here: Ray's client reads it the way the cluster did
    # ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token).
    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = info.get("auth_mode", "disabled")
        reload_config()  # Ray caches its config at import; refresh it (as ray.init does)
    join(target, what, namespace=NAMESPACE)  # Ray's INFO lines only with --verbose (actors.cluster.join)
    try:
        return ray.get_actor(info["actor"], namespace=NAMESPACE)
    except ValueError:
        raise ValueError(f"no running job owns {info['actor']} (the run has ended)") from None
