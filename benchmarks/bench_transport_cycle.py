"""The R = L cycle with each weight transport, side by side in one run.

The orchestration benchmark's timeline set-up (R = L, ``async.max_lag`` 1, one 64-prompt call per
batch, one worker, a 2 MB payload), but with the REAL rollout worker shell (its mailbox and
broadcast receiver) around a simulated core that sleeps R per call, and the simulated learner
(``tests/sim_learner.py``; rank 0 broadcasts with ``weight_sync.type=collective``). Rows, alternated
``--rounds`` times:

* ``object_store``: the default transport;
* ``collective``: the shared-segment broadcast; a worker's offer exists when its broadcast arrives
  or its object-store copy does, whichever is first (``BroadcastReceiver.exists``);
* ``collective_store_readiness``: the same, the offer existing only once the object store has it
  (how the worker shell waited before that change: an ablation, named as such).

Per row: ms per step above L (after ``--warmup`` steps), and how the worker loaded its versions.
Writes ``benchmarks/results/transport_cycle_cpu[TAG].json``.

    python benchmarks/bench_transport_cycle.py --tag _amx
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import emit, positive_float, positive_int, result_tag  # noqa: E402

ROWS = ("object_store", "collective", "collective_store_readiness")
BASE = ["model.warm_start_steps=0", "report.wandb.mode=disabled", "report.console=false", "report.dump_every=0",
        "checkpoint_every=0", "async.queue_ahead=true", "prompts_per_step=64", "rollout.prompts_per_call=64",
        "rollout.num_workers=1", "async.max_lag=1",
        "correction.method.type=token-tis"]  # keeps the simulated samples (Seq-MIS would reject them all)


def worker_class(row: str, seconds_per_call: float):
    """The real rollout worker actor around a simulated core whose calls take ``seconds_per_call``."""
    from sim_actors import SimulatedCore

    from actors.runtime import weights_exist

    if row != "collective_store_readiness":
        return SimulatedCore.worker_class(seconds_per_call)
    return SimulatedCore.worker_class(  # the ablation: an offer exists only once the object store has it
        seconds_per_call, _exists=lambda self, offer, timeout_s: weights_exist(offer.holder, timeout_s))


def run_row(row: str, train_s: float, steps: int, warmup: int) -> dict:
    import ray
    from sim_learner import SimulatedLearnerRank

    from actors.trainer import Trainer
    from system.config import resolve_config

    out = Path(tempfile.mkdtemp(prefix="aisrl-transport-"))
    transport = "object_store" if row == "object_store" else "collective"
    cfg = resolve_config(overrides=[*BASE, f"output_dir={out}", f"max_steps={steps}", f"weight_sync.type={transport}"])
    trainer = Trainer(cfg, rollout_cls=worker_class(row, train_s),
                      learner_cls=SimulatedLearnerRank.actor_class(train_seconds=train_s, payload_params=1_000_000))
    ends = []
    inner = trainer.train_one_step

    def stamped():
        record = inner()
        ends.append(time.perf_counter())
        return record
    trainer.train_one_step = stamped
    try:
        trainer.run()
        sources = ray.get(next(iter(trainer.pool.slots.values())).handle.stats.remote())
    finally:
        trainer.shutdown()
        ray.kill(trainer.service, no_restart=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    per_step = (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)
    return {"row": row, "overhead_ms_per_step": round(1e3 * (per_step - train_s), 2),
            "weights_via_broadcast": sources.get("weights_via_broadcast", 0),
            "weights_via_object_store": sources.get("weights_via_object_store", 0),
            "broadcast_receivers_max": max(r.get("weight_sync/broadcast_receivers", 0) for r in records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--train-seconds", type=positive_float, default=0.5, help="R = L")
    parser.add_argument("--steps", type=positive_int, default=22)
    parser.add_argument("--warmup", type=positive_int, default=4)
    parser.add_argument("--tag", type=result_tag, default="")
    args = parser.parse_args()
    if args.warmup >= args.steps:
        parser.error(f"--warmup ({args.warmup}) must be below --steps ({args.steps})")
    import ray

    from actors.cluster import use_loopback_only
    from actors.ray_internals import LOOPBACK_NODE
    from system.config import resolve_config
    from system.models.model_dir import resolve_model_dir

    resolve_model_dir(resolve_config(overrides=BASE))  # the tiny model's directory (the vocabulary), once
    use_loopback_only()
    ray.init(address="local", num_cpus=24, include_dashboard=False, object_store_memory=2**30,
             log_to_driver=False, **LOOPBACK_NODE)
    runs = []
    try:
        for round_ in range(args.rounds):
            for row in ROWS:
                runs.append({"round": round_, **run_row(row, args.train_seconds, args.steps, args.warmup)})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    rows = [{"row": row, "overhead_ms_per_step": [r["overhead_ms_per_step"] for r in runs if r["row"] == row],
             "median_ms": statistics.median(r["overhead_ms_per_step"] for r in runs if r["row"] == row)}
            for row in ROWS]
    emit(f"transport_cycle_cpu{args.tag}", {"train_seconds": args.train_seconds, "steps": args.steps,
                                            "warmup": args.warmup, "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
