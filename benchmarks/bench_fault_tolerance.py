"""Fault tolerance, measured: replacement, time to error, soak, exact resume.

Scenarios (each on its own private loopback Ray cluster, in this process):

* ``worker_replacement``: the real stack (vLLM FP8 worker, 2-rank FSDP2 learner); the only
  rollout worker is killed after step 2. Seconds until the replacement serves (a new vLLM
  engine with the current weights), seconds from the kill to the next completed step, ledger.
* ``learner_rank_lost``: the real stack; learner rank 1 is killed after step 2. Seconds from
  the kill to the run's error, and the error.
* ``all_rollout_nodes_lost``: simulated engines on ``ray.cluster_utils`` nodes; the only node
  offering ``rollout`` is removed. Seconds to the run's error with the default
  ``rollout.worker_timeout_s``.
* ``soak``: simulated engines, 4 workers; a random worker killed every 2 s for 60 s (when all
  four are replacements still starting, as on a loaded machine, the kill waits for the first up,
  at most 60 s, and the soak lasts that much longer). Kills, losses handled, prompts lost, trained
  twice, fewest steps in a 10 s window of wall time, replacement seconds, seconds waited.
* ``resume_equality``: the real stack, synchronous, AIS on. A run of 6 steps against a run
  stopped after 3 and resumed to 6: the largest absolute difference of any compared metric
  over steps 4-6 (0.0 = bit-identical).

    python benchmarks/bench_fault_tolerance.py [--only soak resume_equality ...]

``--only`` re-measures the named scenarios and keeps the others' last results (each
scenario records the commit it was measured on).
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the simulated actors
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fault_scenarios import COMPARED, RESUME, SIM, in_thread, local_ray, soak  # noqa: E402
from harness import RESULTS, emit, environment  # noqa: E402
from sim_actors import SimulatedRolloutWorker  # noqa: E402
from sim_learner import SimulatedLearnerRank  # noqa: E402

from actors.cluster import use_loopback_only  # noqa: E402
from actors.trainer import Trainer  # noqa: E402
from system.config.loading import resolve_config  # noqa: E402

SMALL = ["prompts_per_step=4", "rollout.group_size=4", "rollout.prompts_per_call=2", "model.warm_start_steps=20",
         "report.dump_every=0", "checkpoint_every=0", "report.console=false", "report.wandb.mode=disabled"]


def wait_for(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("scenario timed out")
        time.sleep(0.02)


def worker_replacement(tmp: Path) -> dict:
    local_ray()
    trainer = Trainer(resolve_config([], [f"output_dir={tmp / 'run'}", "max_steps=8", "rollout.num_workers=1", *SMALL]))
    try:
        thread, _ = in_thread(trainer)
        wait_for(lambda: trainer.step >= 2, 600)
        killed_at, step = time.monotonic(), trainer.step
        ray.kill(next(iter(trainer.pool.slots.values())).handle, no_restart=True)
        wait_for(lambda: trainer.step > step + 1, 600)  # the step in progress may finish from the buffer
        next_step_s = time.monotonic() - killed_at
        thread.join(timeout=600)
        counts = trainer.sampler.counts()
    finally:
        trainer.shutdown()
        ray.shutdown()
    return {"replacement_serving_s": trainer.pool.replacement_seconds[0], "kill_to_second_next_step_s": next_step_s,
            "steps": trainer.step, "ledger": counts}


def learner_rank_lost(tmp: Path) -> dict:
    local_ray()
    trainer = Trainer(resolve_config([], [f"output_dir={tmp / 'run'}", "max_steps=50", *SMALL]))
    try:
        thread, outcome = in_thread(trainer)
        wait_for(lambda: trainer.step >= 2, 600)
        killed_at = time.monotonic()
        ray.kill(trainer.learners.ranks[1], no_restart=True)
        thread.join(timeout=300)
    finally:
        trainer.shutdown()
        ray.shutdown()
    return {"time_to_error_s": outcome["t"] - killed_at, "error": f"{type(outcome['error']).__name__}: "
            f"{str(outcome['error']).splitlines()[0][:200]}"}


def all_rollout_nodes_lost(tmp: Path) -> dict:
    use_loopback_only()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False,
                                                            "resources": {"learner": 1}})
    node = cluster.add_node(num_cpus=2, resources={"rollout": 1})
    cfg = resolve_config([], [f"output_dir={tmp / 'run'}", "max_steps=100000", f"ray.address={cluster.address}",
                              "learner.num_ranks=1", "rollout.prompts_per_call=4", *SIM])
    trainer = Trainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(seconds_per_call=0.1),
                      learner_cls=SimulatedLearnerRank.actor_class(train_seconds=0.05, payload_params=10_000))
    try:
        thread, outcome = in_thread(trainer)
        wait_for(lambda: trainer.step >= 2, 300)
        lost_at = time.monotonic()
        cluster.remove_node(node)
        thread.join(timeout=cfg.rollout.worker_timeout_s + 120)
    finally:
        trainer.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return {"worker_timeout_s": cfg.rollout.worker_timeout_s, "time_to_error_s": outcome["t"] - lost_at,
            "error": str(outcome["error"]).splitlines()[0][:300]}


def resume_equality(tmp: Path) -> dict:
    def train(run: Path, steps: int, resume: bool = False) -> list[dict]:
        trainer = Trainer(resolve_config(overrides=[f"output_dir={run}", f"max_steps={steps}", *RESUME]), resume=resume)
        try:
            trainer.run()
        finally:
            trainer.shutdown()
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    local_ray()
    try:
        t0 = time.perf_counter()
        full = train(tmp / "a", 6)
        train(tmp / "b", 3)
        resumed = train(tmp / "b", 6, resume=True)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    diffs = [abs((a[k] or 0.0) - (b[k] or 0.0)) for a, b in zip(full[3:], resumed[3:], strict=True) for k in COMPARED]
    return {"stopped_at": 3, "compared_steps": [4, 5, 6], "compared_metrics": list(COMPARED),
            "max_abs_difference": max(diffs), "bit_identical": max(diffs) == 0.0,
            "loss_uninterrupted": [r["learner/loss"] for r in full[3:]],
            "loss_resumed": [r["learner/loss"] for r in resumed[3:]], "wall_seconds_three_runs": wall}


SCENARIOS = {"worker_replacement": worker_replacement, "learner_rank_lost": learner_rank_lost,
             "all_rollout_nodes_lost": all_rollout_nodes_lost, "soak": soak, "resume_equality": resume_equality}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    args = parser.parse_args()
    previous = RESULTS / "fault_tolerance_cpu.json"
    kept = json.loads(previous.read_text())["scenarios"] if previous.is_file() else {}
    results = {k: v for k, v in kept.items() if k not in args.only}  # --only re-measures those, keeps the rest
    for name in args.only:
        tmp = Path(tempfile.mkdtemp(prefix=f"aisrl-ft-{name}-"))
        t0 = time.perf_counter()
        results[name] = {**SCENARIOS[name](tmp), "scenario_wall_s": time.perf_counter() - t0,
                         "commit": environment()["commit"]}
        shutil.rmtree(tmp, ignore_errors=True)
        print(name, json.dumps(results[name])[:400], file=sys.stderr, flush=True)
    emit("fault_tolerance_cpu", {"scenarios": results})


if __name__ == "__main__":
    main()
