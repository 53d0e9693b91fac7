"""Soak: a random rollout worker is killed every 2 s for a minute while training goes on.

Real controller, buffer, sampler, correction service and weight path on a loopback Ray
cluster; the two compute roles are the simulated actors of ``benchmarks/sim_actors.py`` (fake
engines, so a replacement starts in about a second and the minute holds ~30 kills).
Checked: 0 prompts lost (the ledger balances), 0 trained twice, steps keep completing.
"""

import random
import sys
import threading
import time
from pathlib import Path

import pytest
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from sim_actors import SimulatedLearnerRank, SimulatedRolloutWorker  # noqa: E402

from actors.cluster import use_loopback_only  # noqa: E402
from actors.trainer import Trainer  # noqa: E402
from system.config.loading import resolve_config  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SOAK_S, KILL_EVERY_S = 60.0, 2.0


def test_kill_a_worker_every_two_seconds_for_a_minute(tmp_path, monkeypatch):
    monkeypatch.setenv("AISRL_CACHE_DIR", str(tmp_path / "cache"))
    use_loopback_only()
    ray.init(address="local", num_cpus=12, include_dashboard=False, object_store_memory=256 * 2**20,
             log_to_driver=False)
    cfg = resolve_config(overrides=[
        f"output_dir={tmp_path / 'run'}", "max_steps=100000", "prompts_per_step=8", "rollout.group_size=4",
        "rollout.prompts_per_call=2", "rollout.num_workers=4", "model.warm_start_steps=0",
        "report.wandb.mode=disabled", "report.console=false", "report.dump_every=0", "checkpoint_every=0",
    ])
    trainer = Trainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(seconds_per_call=0.2),
                      learner_cls=SimulatedLearnerRank.actor_class(train_seconds=0.05, payload_params=10_000))
    runner = threading.Thread(target=trainer.run, daemon=True)
    steps_per_window, kills = [], 0
    try:
        runner.start()
        rng, start = random.Random(0), time.monotonic()
        while time.monotonic() - start < SOAK_S:
            before = trainer.step
            time.sleep(KILL_EVERY_S)
            live = [s for s in list(trainer.pool.slots.values()) if s.starting is None]
            if live:
                ray.kill(rng.choice(live).handle, no_restart=True)
                kills += 1
            steps_per_window.append(trainer.step - before)
        trainer.stop_requested.set()
        runner.join(timeout=120)
        counts = trainer.sampler.counts()
    finally:
        trainer.shutdown()
        ray.shutdown()
    print(f"\nsoak: {kills} kills, {trainer.pool.failures} losses seen, {trainer.step} steps, "
          f"steps per 2 s window min {min(steps_per_window)}, replacement s median "
          f"{sorted(trainer.pool.replacement_seconds)[len(trainer.pool.replacement_seconds) // 2]:.2f}")
    assert kills >= 25 and trainer.pool.failures >= kills - 1
    assert counts["duplicates"] == 0
    assert counts["trained"] == trainer.step * 8
    assert counts["issued"] == counts["trained"] + counts["dropped"] + counts["in_flight"] + counts["buffered"]
    # Training never stalls: every 10 s (five windows) completes steps.
    assert all(sum(steps_per_window[i:i + 5]) > 0 for i in range(0, len(steps_per_window) - 4, 5))
