"""Rollout workers and the nodes that offer the rollout resource: nodes joining, leaving, all lost.

``rollout.follow_cluster``: rollout workers follow the nodes that offer the rollout resource.

Simulated nodes on one machine (``ray.cluster_utils.Cluster`` on loopback): a head without
the resource and one node with ``rollout: 1``. The real ``Trainer`` (simulated compute actors
of ``tests/sim_actors.py``) starts with one worker; a node with ``rollout: 2`` joins
mid-run, as the Ray autoscaler would add it, and the controller grows to 3 workers, all on
rollout nodes; the node is then removed and its workers are not replaced (back to 1, the
floor). The ledger shows nothing lost or trained twice.

Losing every rollout node (no replacement can be placed) fails the run once no worker has
been alive for ``rollout.worker_timeout_s``, with a message that says so and how to resume.
"""

import json
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster
from sim_actors import SimulatedRolloutWorker
from sim_learner import SimulatedLearnerRank

from actors.cluster import private_cluster_environment
from actors.placement import follow_target, rollout_capacity
from actors.trainer import Trainer
from system.config.loading import resolve_config

STEPS = 400  # an upper bound; the test stops the run once it has seen what it needs


def test_follow_target_is_capacity_above_the_floor_and_below_the_cap():
    assert follow_target(1, 3, None) == 3
    assert follow_target(4, 3, None) == 4  # the floor (num_workers / aisrl scale) wins
    assert follow_target(1, 8, 5) == 5
    assert follow_target(6, 8, 5) == 6  # the cap never takes workers below the floor
    cfg = resolve_config([], ["ray.rollout_resource=gen"])
    assert rollout_capacity({"gen": 3.0, "CPU": 8.0}, cfg) == 3 and rollout_capacity({"CPU": 8.0}, cfg) == 0


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def simulated_trainer(cluster: Cluster, run_dir: Path, *overrides: str) -> Trainer:
    cfg = resolve_config([], [
        f"output_dir={run_dir}", f"max_steps={STEPS}", f"ray.address={cluster.address}",
        "learner.num_ranks=1", "prompts_per_step=8", "rollout.group_size=4", "rollout.prompts_per_call=4",
        "model.warm_start_steps=0", "report.wandb.mode=disabled", "report.console=false",
        "report.dump_every=0", "checkpoint_every=0", *overrides,
    ])
    return Trainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(seconds_per_call=0.1),
                   learner_cls=SimulatedLearnerRank.actor_class(train_seconds=0.05, payload_params=10_000))


@pytest.mark.ray
def test_losing_every_rollout_node_fails_the_run_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("AISRL_CACHE_DIR", str(tmp_path / "cache"))
    private_cluster_environment()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False,
                                                            "resources": {"learner": 1}})
    node = cluster.add_node(num_cpus=2, resources={"rollout": 1})
    trainer = None
    try:
        trainer = simulated_trainer(cluster, tmp_path / "run", "rollout.num_workers=1", "rollout.worker_timeout_s=10")
        outcome: dict = {}

        def run():
            try:
                trainer.run()
            except BaseException as exc:  # noqa: BLE001 - the outcome under test
                outcome["error"], outcome["t"] = exc, time.monotonic()

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        wait_for(lambda: trainer.step >= 2, 120, "2 steps")
        lost_at = time.monotonic()
        cluster.remove_node(node)
        runner.join(timeout=90)
        assert not runner.is_alive(), "the run hung after losing every rollout node"
    finally:
        if trainer is not None:
            trainer.shutdown()
        ray.shutdown()
        cluster.shutdown()
    message = str(outcome["error"])
    assert "no rollout worker has been alive for 10 s" in message and "--resume" in message
    # replacements were launched but could not be placed; the run failed after the timeout, not later
    assert 9 <= outcome["t"] - lost_at < 60  # (the last sign of life can precede the removal slightly)


@pytest.mark.ray
def test_workers_follow_rollout_nodes_joining_and_leaving(tmp_path, monkeypatch):
    monkeypatch.setenv("AISRL_CACHE_DIR", str(tmp_path / "cache"))
    private_cluster_environment()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    first = cluster.add_node(num_cpus=2, resources={"rollout": 1})
    trainer = None
    try:
        trainer = simulated_trainer(cluster, tmp_path / "run", "rollout.follow_cluster=true", "rollout.num_workers=1")
        done = threading.Thread(target=trainer.run, daemon=True)
        done.start()
        ready = lambda: len(trainer.pool.ready())  # noqa: E731
        wait_for(lambda: trainer.step >= 3, 120, "3 steps")
        assert ready() == 1
        extra = cluster.add_node(num_cpus=2, resources={"rollout": 2})
        wait_for(lambda: ready() == 3, 120, "3 ready workers after a rollout node joined")
        nodes = {ray.get(s.handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
                 for s in trainer.pool.ready()}
        assert nodes == {first.node_id, extra.node_id}
        cluster.remove_node(extra)
        wait_for(lambda: len(trainer.pool.slots) == 1 and ready() == 1, 120, "back to 1 worker after the node left")
        step = trainer.step
        wait_for(lambda: trainer.step >= step + 3, 120, "3 more steps on the remaining worker")
        trainer.stop_requested.set()
        done.join(timeout=120)
        assert not done.is_alive()
    finally:
        if trainer is not None:
            trainer.shutdown()
        ray.shutdown()
        cluster.shutdown()
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["duplicates"] == 0 and ledger["trained"] == trainer.step * 8
    assert ledger["issued"] == ledger["trained"] + ledger["dropped"] + ledger["in_flight"] + ledger["buffered"]
    assert trainer.pool.failures == 2  # the two workers of the removed node were lost, not replaced
    # every worker that came up is recorded, the two that joined mid-run too (was: the first only)
    workers = json.loads((tmp_path / "run" / "rollout_workers.json").read_text())
    assert workers["running"] == {f"rollout-{i}": "simulated" for i in range(3)}
