"""W&B's helper process killed mid-run: training goes on and every step stays in ``metrics.jsonl``.

The real ``Trainer`` and correction service (which owns the W&B run, offline) with the
simulated compute actors of ``tests/sim_actors.py``, on a private loopback Ray cluster.
After step 3 the test kills the ``wandb-core`` process that the service started (found as a
child of the service actor's process, killed by its pid). Each JSONL record carries
``report/wandb_live``: 1 while W&B takes the metrics, 0 after it failed.
"""

import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray
from sim_actors import SimulatedRolloutWorker
from sim_learner import SimulatedLearnerRank

from actors.trainer import Trainer
from system.config.loading import resolve_config

pytestmark = pytest.mark.ray

STEPS, KILL_AFTER = 14, 3


def complete_records(metrics: Path) -> int:
    return metrics.read_text().count("\n") if metrics.exists() else 0


def kill_wandb_helper(trainer: Trainer, metrics: Path, killed: list) -> None:
    """Once KILL_AFTER records are complete in ``metrics``, SIGKILL the wandb-core children of the
    service; ``killed`` gets (pid, steps done at the kill)."""
    while complete_records(metrics) < KILL_AFTER:
        time.sleep(0.05)
    pid = ray.get(trainer.service.__ray_call__.remote(lambda self: os.getpid()))
    for child in psutil.Process(pid).children(recursive=True):
        if "wandb" in child.name():
            child.kill()
            killed.append((child.pid, trainer.step))


def test_training_goes_on_when_the_wandb_helper_dies(loopback_ray, tmp_path):
    run = tmp_path / "run"
    cfg = resolve_config(overrides=[
        f"output_dir={run}", f"max_steps={STEPS}", "prompts_per_step=8", "rollout.group_size=4",
        "rollout.prompts_per_call=8", "model.warm_start_steps=0", "report.wandb.mode=offline",
        "report.console=false", "report.dump_every=2", "checkpoint_every=0",
    ])
    trainer = Trainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(seconds_per_call=0.3),
                      learner_cls=SimulatedLearnerRank.actor_class(train_seconds=0.3, payload_params=10_000))
    killed: list[int] = []
    killer = threading.Thread(target=kill_wandb_helper, args=(trainer, run / "metrics.jsonl", killed), daemon=True)
    killer.start()
    try:
        trainer.run()
    finally:
        trainer.shutdown()
    killer.join(timeout=5)
    assert killed, "no wandb-core process was found under the correction service"
    assert killed[0][1] <= STEPS - 4, f"the kill landed too late to show anything (after step {killed[0][1]})"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    live = [r["report/wandb_live"] for r in records]
    assert live[:KILL_AFTER] == [1] * KILL_AFTER and live[-3:] == [0, 0, 0]
    assert live == sorted(live, reverse=True)  # once failed, stays failed (and said once)
    assert all("learner/loss" in r and "mismatch/kl_k1" in r for r in records[KILL_AFTER:])
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))  # what W&B took before is kept
    assert (run / "report" / "report.html").is_file() and (run / "ledger.json").is_file()
