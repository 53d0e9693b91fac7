"""Orchestration efficiency with simulated compute: async vs sync, rollout scaling, weight sync.

The real ``Trainer`` (controller loops, trajectory buffer, sampler, correction service with
real math and real JSONL sink, object-store weight path) runs on a private loopback Ray
cluster with the simulated actors of ``sim_actors.py`` in the two compute roles, so every
second beyond the simulated compute is orchestration overhead.

1. Async vs sync. One simulated worker, one generate call per step
   (``rollout.prompts_per_call = prompts_per_step``) taking R seconds; ``train_step`` takes L.
   Ideal seconds per step: ``max(R, L)`` with ``async.max_lag=1``, ``R + L`` with
   ``async.max_lag=0``. Achieved = wall time from the end of the warm-up steps (2 + max_lag) to the end
   of the last step, per step (the driver stamps the end of every ``train_one_step``).
   Efficiency = ideal / achieved.
2. Scaling. N simulated workers, each call ``prompts_per_call`` prompts in R seconds, the step
   batch one call per worker (``prompts_per_step = N * prompts_per_call``), L small so the
   rollout side is the bottleneck. Trained samples per second against N times the 1-worker rate.
4. Timeline (``--parts timeline``). R = L at ``async.max_lag=1`` with every process stamping its
   events into one file (wall clock, one machine): the simulated actors (``offer``, ``gen_call``,
   ``gen_start``, ``gen_end``, ``step_call``, ``step_end``) and the driver (``publish``, ``push``,
   ``accept``, ``taken``, ``submitted``). Reported: the median latency of each hop of the two links
   of the critical cycle, step end -> the next generate call samples with its weights, and a
   generate call's end -> the step that trains its groups starts.
3. Weight sync (``orchestration_weights.py``). The object-store path of ``ObjectStoreTransport`` with a simulated rank 0
   exporting a bf16 payload of P parameters and a simulated worker copying every array into
   its own buffers (as an engine's load does), against ``np.copyto`` of the same bytes.

Each part prints one JSON line and keeps it under ``benchmarks/results/`` (``harness.emit``);
a summary line comes last. ``--quick`` runs a reduced grid (results named ``*_quick``).

    .venv/bin/python benchmarks/bench_orchestration.py            # 10-13 minutes on a 2-core AMD EPYC
    .venv/bin/python benchmarks/bench_orchestration.py --quick    # 3-4 minutes
"""

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the simulated actors
from harness import choice_list, emit, positive_float, result_tag  # noqa: E402
from orchestration_timeline import stamp_driver, timeline_hops, timeline_links  # noqa: E402
from orchestration_weights import bench_weight_sync  # noqa: E402
from sim_actors import SimulatedRolloutWorker  # noqa: E402
from sim_learner import SimulatedLearnerRank  # noqa: E402

from actors.cluster import use_loopback_only  # noqa: E402
from actors.ray_internals import LOOPBACK_NODE  # noqa: E402
from actors.trainer import Trainer  # noqa: E402
from system.config.loading import resolve_config  # noqa: E402
from system.models.model_dir import resolve_model_dir  # noqa: E402

GB = 1e9
SPLIT = ("time/wait_rollout", "time/proximal", "time/correction", "time/correction_service", "time/update", "time/sync",
         "time/step")
BASE = ["model.warm_start_steps=0", "report.wandb.mode=disabled", "report.console=false",
        "report.dump_every=0", "checkpoint_every=0", "async.queue_ahead=true"]
PROCESS_GB = 0.45
"""Memory budgeted per simulated actor process (Ray worker + torch import)."""
PARTS = ("async", "lag", "timeline", "scaling", "weights")
"""What ``--parts`` may name."""


class TimedTrainer(Trainer):
    """The real trainer; the driver stamps the end of every step (record written included)."""

    def train_one_step(self) -> dict:
        record = super().train_one_step()
        self.stamps.append(time.perf_counter())
        return record


def run_trainer(overrides: list[str], rollout: dict, learner: dict, steps: int, warmup: int,
                on_built=None) -> dict:
    """Run ``steps`` steps of the real trainer with simulated actors; per-step wall and time split.
    ``on_built(trainer)``: called once the trainer is built, before it runs."""
    out = Path(tempfile.mkdtemp(prefix="aisrl-orch-"))
    cfg = resolve_config(overrides=[*BASE, f"output_dir={out}", f"max_steps={steps}", *overrides])
    started = time.perf_counter()
    trainer = TimedTrainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(**rollout),
                           learner_cls=SimulatedLearnerRank.actor_class(**learner))
    if on_built is not None:
        on_built(trainer)
    startup = time.perf_counter() - started
    load_before = os.getloadavg()[0]
    try:
        trainer.stamps = [time.perf_counter()]
        trainer.run()
        stamps = trainer.stamps
        worker_stats = ray.get([s.handle.stats.remote() for s in trainer.pool.slots.values()])
    finally:
        trainer.shutdown()
        ray.kill(trainer.service, no_restart=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ledger = json.loads((out / "ledger.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    walls = np.diff(stamps)
    measured = records[warmup:]
    per_step = (stamps[-1] - stamps[warmup]) / (steps - warmup)
    split = {k.split("/")[1]: float(np.mean([r[k] for r in measured])) for k in SPLIT}
    split["outside_step"] = float(np.mean(walls[warmup:])) - split["step"]
    return {
        "startup_s": round(startup, 2), "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "achieved_s_per_step": per_step, "median_s_per_step": float(np.median(walls[warmup:])),
        "step_walls_s": [round(float(w), 4) for w in walls], "time_split_s": split,
        "lag_max": [r["staleness/lag_max"] for r in records], "ledger": ledger,
        "samples_per_step": cfg.sequences_per_step,
        "weight_updates_per_worker": [s["num_weight_updates"] for s in worker_stats],
    }


def bench_async_vs_sync(ratios: list[float], train_s: float, max_steps: int, measure_s: float, warmup: int,
                        payload_params: int) -> dict:
    """Measured: enough steps for ``measure_s`` s of ideal time, 5 to ``max_steps``, after ``warmup + max_lag``
    steps: up to ``max_lag`` batches are generated while the ranks load, and with R > L the steps using that
    lead ran faster than R (R/L = 2 read efficiency 1.012 after a 2-step warm-up)."""
    rows = []
    for ratio in ratios:
        rollout_s = ratio * train_s
        for lag in (1, 0):
            ideal = max(rollout_s, train_s) if lag else rollout_s + train_s
            skip = warmup + lag
            steps = min(max_steps + lag, skip + max(5, math.ceil(measure_s / ideal)))
            res = run_trainer(["prompts_per_step=64", "rollout.prompts_per_call=64", "rollout.num_workers=1",
                               f"async.max_lag={lag}"],
                              {"seconds_per_call": rollout_s, "weight_load": "copy"},
                              {"train_seconds": train_s, "payload_params": payload_params}, steps, skip)
            row = {"mode": "async" if lag else "sync", "max_lag": lag, "R_over_L": ratio, "R_s": rollout_s,
                   "L_s": train_s, "steps": steps, "warmup_steps_excluded": skip, "ideal_s_per_step": ideal,
                   "efficiency": ideal / res["achieved_s_per_step"],
                   "efficiency_median_step": ideal / res["median_s_per_step"],
                   "overhead_s_per_step": res["achieved_s_per_step"] - ideal, **res}
            rows.append(row)
            log(f"{row['mode']:5s} R/L={ratio:<5} ideal {ideal:.3f}s achieved {res['achieved_s_per_step']:.3f}s "
                f"(median {res['median_s_per_step']:.3f}) eff {row['efficiency']:.3f} lag_max {max(res['lag_max'])} "
                f"split {fmt(res['time_split_s'])} load {res['loadavg_1m']}")
    return {"train_seconds_L": train_s, "warmup_steps_excluded": f"{warmup} + max_lag",
            "samples_per_step": 64 * 8, "payload_params": payload_params,
            "goal": ">= 0.95 of ideal", "rows": rows,
            "min_efficiency": {m: min(r["efficiency"] for r in rows if r["mode"] == m) for m in ("async", "sync")}}


def bench_lag_at_balance(train_s: float, steps: int, warmup: int, repeats: int, payload_params: int) -> dict:
    """R = L (one worker, one call per step) at ``max_lag`` 1 and 2, alternating, ``repeats`` runs each.

    At ``max_lag`` 1 the call feeding step k+2 needs version k+1, so it starts only once step k has
    ended: every two steps form one cycle of L + R plus the latency around it (step end -> publish
    -> offer / dispatch -> adopt, and the call's return -> buffer -> collate -> put -> the ranks).
    At ``max_lag`` 2 that call may use version k, and the cycle's latency has slack to hide in."""
    rows = []
    for rep in range(repeats):
        for lag in (1, 2):
            res = run_trainer(["prompts_per_step=64", "rollout.prompts_per_call=64", "rollout.num_workers=1",
                               f"async.max_lag={lag}"], {"seconds_per_call": train_s, "weight_load": "copy"},
                              {"train_seconds": train_s, "payload_params": payload_params}, steps, warmup)
            row = {"max_lag": lag, "repeat": rep, "R_s": train_s, "L_s": train_s, "steps": steps,
                   "efficiency": train_s / res["achieved_s_per_step"],
                   "overhead_s_per_step": res["achieved_s_per_step"] - train_s, **res}
            rows.append(row)
            log(f"R=L={train_s}s max_lag={lag} eff {row['efficiency']:.3f} overhead "
                f"{row['overhead_s_per_step'] * 1000:.1f} ms lag_max {max(res['lag_max'])}")
    summary = {str(lag): {"overhead_ms": [round(r["overhead_s_per_step"] * 1000, 2) for r in rows if r["max_lag"] == lag],
                          "efficiency": [round(r["efficiency"], 4) for r in rows if r["max_lag"] == lag]}
               for lag in (1, 2)}
    return {"train_seconds_L": train_s, "warmup_steps_excluded": warmup, "payload_params": payload_params,
            "rows": rows, "by_max_lag": summary}


def bench_timeline(train_s: float, steps: int, warmup: int, payload_params: int) -> dict:
    """R = L at ``max_lag`` 1, every hand-off stamped: where the critical cycle's latency goes."""
    path = tempfile.mktemp(prefix="aisrl-timeline-", suffix=".jsonl")
    restore = []
    try:
        res = run_trainer(["prompts_per_step=64", "rollout.prompts_per_call=64", "rollout.num_workers=1",
                           "async.max_lag=1"], {"seconds_per_call": train_s, "weight_load": "copy", "timeline": path},
                          {"train_seconds": train_s, "payload_params": payload_params, "timeline": path}, steps, warmup,
                          on_built=lambda trainer: restore.append(stamp_driver(trainer, path)))
        events = [json.loads(line) for line in Path(path).read_text().splitlines()]
    finally:
        for undo in restore:
            undo()
        Path(path).unlink(missing_ok=True)
    links, hops = timeline_links(events, first_step=warmup + 1), timeline_hops(events, first_step=warmup + 1)
    log(f"timeline R=L={train_s}s: overhead {(res['achieved_s_per_step'] - train_s) * 1000:.1f} ms/step; "
        f"step end -> generate {links['step_end_to_generate']}; generate end -> step {links['generate_end_to_step']}")
    log(f"timeline hops: {hops}")
    return {"train_seconds_L": train_s, "rollout_seconds_R": train_s, "max_lag": 1, "steps": steps,
            "warmup_steps_excluded": warmup, "payload_params": payload_params,
            "overhead_ms_per_step": round((res["achieved_s_per_step"] - train_s) * 1000, 2),
            "links_median_ms": links, "hops": hops, "time_split_s": res["time_split_s"], "loadavg_1m": res["loadavg_1m"]}


def bench_scaling(workers: list[int], rollout_s: float, train_s: float, prompts_per_call: int, steps: int,
                  warmup: int, payload_params: int) -> dict:
    rows, skipped = [], []
    for n in workers:
        need = (n + 3) * PROCESS_GB + 2.0
        if psutil.virtual_memory().available / 2**30 < need:
            skipped.append({"workers": n, "reason": f"needs ~{need:.1f} GiB available"})
            log(f"scaling: skip {n} workers (needs ~{need:.1f} GiB)")
            continue
        res = run_trainer([f"prompts_per_step={n * prompts_per_call}", f"rollout.prompts_per_call={prompts_per_call}",
                           f"rollout.num_workers={n}", "async.max_lag=1"],
                          {"seconds_per_call": rollout_s, "weight_load": "copy"},
                          {"train_seconds": train_s, "payload_params": payload_params}, steps, warmup)
        sps = res["samples_per_step"] / res["achieved_s_per_step"]
        ideal = n * prompts_per_call * 8 / rollout_s
        rows.append({"workers": n, "samples_per_s": sps, "ideal_samples_per_s": ideal, "efficiency_vs_ideal": sps / ideal,
                     **res})
        log(f"scaling: {n:2d} workers {sps:7.1f} samples/s (ideal {ideal:.1f}) achieved "
            f"{res['achieved_s_per_step']:.3f}s/step split {fmt(res['time_split_s'])} startup {res['startup_s']}s "
            f"load {res['loadavg_1m']}")
    base = next((r["samples_per_s"] for r in rows if r["workers"] == 1), None)
    for r in rows:
        r["efficiency_vs_linear"] = r["samples_per_s"] / (r["workers"] * base) if base else None
    return {"rollout_seconds_per_call_R": rollout_s, "train_seconds_L": train_s, "prompts_per_call": prompts_per_call,
            "group_size": 8, "steps": steps, "warmup_steps_excluded": warmup, "payload_params": payload_params,
            "goal": ">= 0.90 of linear at 8 workers", "rows": rows, "skipped": skipped}


def fmt(split: dict) -> str:
    return " ".join(f"{k}={v * 1000:.0f}ms" for k, v in split.items())


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced grid, fewer steps (3-4 minutes)")
    parser.add_argument("--parts", type=choice_list(PARTS), default="async,scaling,weights",
                        help="comma-separated subset of async, lag (R = L at max_lag 1 and 2), timeline, scaling, weights")
    parser.add_argument("--train-seconds", type=positive_float, default=0.5, help="L of part 1")
    parser.add_argument("--tag", type=result_tag, default="", help="suffix of the result names (e.g. _L0.5)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    parts = set(args.parts)
    logging.getLogger("actors.trainer").setLevel(logging.ERROR)
    suffix = ("_quick" if args.quick else "") + args.tag
    payload = 1_000_000
    shm_free = shutil.disk_usage("/dev/shm").free
    # Weight sync needs two live versions of the largest payload (3 GB at 1.5 B parameters).
    store = int(min(7.0 * 2**30, 0.8 * shm_free)) if "weights" in parts else int(1 * 2**30)
    t_start = time.perf_counter()
    # Build (or find cached) the tiny model directory once: the correction service loads its tokenizer.
    resolve_model_dir(resolve_config(overrides=BASE))
    use_loopback_only()  # every server of the private cluster on 127.0.0.1
    ray.init(address="local", num_cpus=24, include_dashboard=False, object_store_memory=store,
             **LOOPBACK_NODE, log_to_driver=False)
    results = {}
    kept = Path(__file__).resolve().parent / "results" / f"orchestration_async_vs_sync_cpu{suffix}.json"
    previous = json.loads(kept.read_text()) if kept.is_file() else None
    node_ip = ray.util.get_node_ip_address()
    try:
        if "async" in parts:
            ratios = [0.5, 1.0, 2.0] if args.quick else [0.25, 0.5, 1.0, 2.0, 4.0]
            res = bench_async_vs_sync(ratios, args.train_seconds, max_steps=8 if args.quick else 14,
                                      measure_s=4.0 if args.quick else 10.0, warmup=2, payload_params=payload)
            emit(f"orchestration_async_vs_sync_cpu{suffix}", res, save=not args.no_save)
            results["async"] = res
        if "lag" in parts:
            res = bench_lag_at_balance(args.train_seconds, steps=22, warmup=2, repeats=3, payload_params=payload)
            emit(f"orchestration_lag_at_balance_cpu{suffix}", res, save=not args.no_save)
            results["lag"] = res
        if "timeline" in parts:
            res = bench_timeline(args.train_seconds, steps=22, warmup=2, payload_params=payload)
            emit(f"orchestration_timeline_cpu{suffix}", res, save=not args.no_save)
            results["timeline"] = res
        if "scaling" in parts:
            workers = [1, 2, 4] if args.quick else [1, 2, 4, 8, 16]
            res = bench_scaling(workers, rollout_s=1.0, train_s=0.1, prompts_per_call=8,
                                steps=7 if args.quick else 10, warmup=2, payload_params=payload)
            emit(f"orchestration_scaling_cpu{suffix}", res, save=not args.no_save)
            results["scaling"] = res
        if "weights" in parts:
            params = [0.1e9, 0.5e9] if args.quick else [0.1e9, 0.5e9, 1.5e9]
            res = bench_weight_sync(params, repeats=7, warmup=3, object_store_bytes=store, base=BASE, log=log)
            res["object_store_bytes"], res["dev_shm_free_bytes"] = store, shm_free
            emit(f"orchestration_weight_sync_cpu{suffix}", res, save=not args.no_save)
            results["weights"] = res
    finally:
        ray.shutdown()
    summary = {"wall_seconds": time.perf_counter() - t_start, "quick": args.quick, "parts": sorted(parts),
               "ray_node_ip": node_ip}
    if "async" in results:
        summary["train_seconds_L"] = args.train_seconds
        summary["async_vs_sync_efficiency"] = {f"{r['mode']}@R/L={r['R_over_L']}": round(r["efficiency"], 4)
                                               for r in results["async"]["rows"]}
        summary["overhead_ms_per_step"] = {f"{r['mode']}@R/L={r['R_over_L']}": round(1e3 * r["overhead_s_per_step"], 1)
                                           for r in results["async"]["rows"]}
        if previous is not None:  # the kept result this run replaces, for the side-by-side reading
            summary["previous"] = {"commit": previous.get("commit"), "efficiency": {
                f"{r['mode']}@R/L={r['R_over_L']}": round(r["efficiency"], 4) for r in previous["rows"]},
                "overhead_ms_per_step": {f"{r['mode']}@R/L={r['R_over_L']}": round(1e3 * r["overhead_s_per_step"], 1)
                                         for r in previous["rows"]}}
    if "scaling" in results:
        summary["scaling_efficiency_vs_linear"] = {r["workers"]: round(r["efficiency_vs_linear"], 4)
                                                   for r in results["scaling"]["rows"]}
    if "weights" in results:
        summary["weight_sync"] = {f"{r['params'] / 1e9:g}B": {"s": round(r["total_s"], 3),
                                  "GB_per_s": round(r["total_GB_per_s"], 2), "over_memcpy": round(r["total_over_copyto"], 2)}
                                  for r in results["weights"]["rows"]}
    if "timeline" in results:
        summary["timeline_overhead_ms_per_step"] = results["timeline"]["overhead_ms_per_step"]
    # the kept summary is the async table's: a run of other parts only prints its own
    emit(f"orchestration_cpu{suffix}", summary, save=not args.no_save and "async" in results)


if __name__ == "__main__":
    main()
