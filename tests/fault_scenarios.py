"""Fault scenarios that a test and ``benchmarks/bench_fault_tolerance.py`` share: the exact-resume
settings and the metrics compared, and the soak (simulated engines, a random worker killed every
``every`` seconds). The benchmark measures them; ``tests/test_resume_exact.py`` and
``tests/test_soak_sim.py`` assert on them."""

import random
import threading
import time
from pathlib import Path

import numpy as np
import ray
from sim_actors import SimulatedRolloutWorker
from sim_learner import SimulatedLearnerRank

from actors.cluster import private_cluster_environment
from actors.ray_internals import LOOPBACK_NODE
from actors.trainer import Trainer
from system.config.loading import resolve_config

SIM = ["prompts_per_step=8", "rollout.group_size=4", "model.warm_start_steps=0", "report.wandb.mode=disabled",
       "report.console=false", "report.dump_every=0", "checkpoint_every=0"]
RESUME = ["seed=3", "async.max_lag=0", "rollout.num_workers=1", "prompts_per_step=8", "rollout.group_size=4",
          "rollout.prompts_per_call=4", "model.warm_start_steps=20", "learner.warmup_steps=8", "learner.lr=3e-3",
          "correction.method.type=token-tis", "correction.ais.enabled=true",
          "report.wandb.mode=disabled", "report.console=false", "report.dump_every=0", "checkpoint_every=2",
          # one FP8 kernel for every run compared: two separate runs each probe this CPU, and a probe near the
          # kernel threshold may choose differently (a resume keeps its own run's choice, not another run's)
          "rollout.fp8_kernel=upcast"]
COMPARED = ("learner/loss", "learner/entropy", "learner/weight_mean", "learner/lr", "learner/grad_norm",
            "reward/mean", "reward/std", "mismatch/kl_k1", "mismatch/ess_seq", "correction/keep_token_frac",
            "ais/alpha", "ais/alpha_raw", "ais/bias", "ais/severity", "tokens/trained")
"""What a resumed run must reproduce (``tests/test_resume_exact.py`` uses the same settings and metrics)."""


def local_ray() -> None:
    private_cluster_environment()
    ray.init(address="local", num_cpus=12, include_dashboard=False, object_store_memory=256 * 2**20,
             **LOOPBACK_NODE, log_to_driver=False)


def in_thread(trainer: Trainer) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            trainer.run()
        except BaseException as exc:  # noqa: BLE001 - the outcome is what is measured
            outcome["error"], outcome["t"] = exc, time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def soak(tmp: Path, seconds: float = 60.0, every: float = 2.0) -> dict:
    """Kill a random ready rollout worker every ``every`` seconds, ``seconds / every`` times, never the
    last one serving: when fewer than two are ready (the others replacements still starting) the kill
    waits for a second one (up to 60 s; the wait lengthens the soak, ``waited_s``). Killing the only one
    made a stall certain wherever a start takes longer than the kills leave (a 2-core VM whose
    replacements took 9.6 s: no step in some 10 s windows), so "training never stalls" said more about
    the machine than about the trainer."""
    local_ray()
    cfg = resolve_config(overrides=[f"output_dir={tmp / 'run'}", "max_steps=100000", "rollout.prompts_per_call=2",
                                    "rollout.num_workers=4", *SIM])
    trainer = Trainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(seconds_per_call=0.2),
                      learner_cls=SimulatedLearnerRank.actor_class(train_seconds=0.05, payload_params=10_000))
    kills, waited, killed = 0, 0.0, set()
    try:
        thread, _ = in_thread(trainer)
        rng, start = random.Random(0), time.monotonic()
        marks = [(start, trainer.step)]  # (time, steps done) at each interval's end
        for _ in range(round(seconds / every)):  # one kill per interval: a wait below lengthens the soak
            time.sleep(every)
            live, wait_from = [], time.monotonic()
            while len(live := [s for s in list(trainer.pool.slots.values())
                               if s.starting is None and s.worker_id not in killed]) < 2 \
                    and time.monotonic() < wait_from + 60.0:
                time.sleep(0.05)
            waited += time.monotonic() - wait_from
            if len(live) >= 2:
                victim = rng.choice(live)
                killed.add(victim.worker_id)
                ray.kill(victim.handle, no_restart=True)
                kills += 1
            marks.append((time.monotonic(), trainer.step))
        trainer.stop_requested.set()
        thread.join(timeout=120)
        c = trainer.sampler.counts()
    finally:
        trainer.shutdown()
        ray.shutdown()
    return {"seconds": round(marks[-1][0] - start, 1), "kill_every_s": every, "waited_s": round(waited, 1),
            "kills": kills, "losses_handled": trainer.pool.failures,
            "steps": trainer.step, "trained": c["trained"], "prompts_per_step": cfg.prompts_per_step, "prompts_lost": c["issued"] - c["trained"] - c["dropped"] - c["in_flight"] - c["buffered"],
            "trained_twice": c["duplicates"], "min_steps_per_10s": min(steps_per_10s(marks)),
            "steps_per_10s": steps_per_10s(marks),
            "replacement_s_median": float(np.median(trainer.pool.replacement_seconds)),
            "replacement_s_max": float(np.max(trainer.pool.replacement_seconds))}


def steps_per_10s(marks: list[tuple[float, int]]) -> list[int]:
    """Steps done in each run of consecutive intervals lasting at least 10 s of wall time (back to back,
    from the first mark; an interval a kill waited in is longer than the kill period). ``marks``: (time,
    steps done so far), in order."""
    out, i = [], 0
    for j in range(1, len(marks)):
        if marks[j][0] - marks[i][0] >= 10.0:
            out.append(marks[j][1] - marks[i][1])
            i = j
    return out
