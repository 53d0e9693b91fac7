"""The orchestration benchmark's weight-sync part (``bench_orchestration.py --parts weights``): the
object-store path of ``ObjectStoreTransport`` with a simulated rank 0 exporting a bf16 payload and a
simulated worker copying every array into its own buffers, against ``np.copyto`` of the same bytes."""

import gc
import statistics
import time

import numpy as np
import psutil
import ray
from sim_actors import SimulatedRolloutWorker
from sim_learner import SimulatedLearnerRank

from actors.learner_worker import LearnerGroup
from actors.placement import RoleOptions
from actors.weight_sync import ObjectStoreTransport
from system.config.loading import resolve_config
from system.models.model_dir import resolve_model_dir

GB = 1e9


def memcpy_seconds(nbytes: int, repeats: int) -> tuple[float, float]:
    """(np.copyto into a pre-faulted buffer, arr.copy() into a fresh one): median seconds."""
    src = np.full(nbytes // 2, 7, dtype=np.int16)
    dst = np.zeros_like(src)
    copyto, fresh = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copyto.append(time.perf_counter() - t0)
    del dst
    for _ in range(repeats):
        t0 = time.perf_counter()
        c = src.copy()
        fresh.append(time.perf_counter() - t0)
        del c
    del src
    gc.collect()
    return statistics.median(copyto), statistics.median(fresh)


def bench_weight_sync(params: list[float], repeats: int, warmup: int, object_store_bytes: int, base: list[str],
                      log) -> dict:
    """Part 3 (see ``bench_orchestration.py``): ``base`` is its overrides, ``log`` its console line."""
    cfg = resolve_config(overrides=[*base, "learner.num_ranks=1"])
    model_dir = str(resolve_model_dir(cfg))
    transport = ObjectStoreTransport()
    rows, skipped = [], []
    for p in params:
        nbytes = int(p) * 2
        avail = psutil.virtual_memory().available
        # Learner arrays + up to two versions in the object store + the worker's buffers
        # (the in-process baseline, 2x, runs alone before them).
        need = 4 * nbytes + 1.5 * 2**30
        if avail < need or object_store_bytes < 2.1 * nbytes:
            skipped.append({"params": p, "bytes": nbytes, "reason": f"needs {need / GB:.1f} GB RAM and "
                            f"{2.1 * nbytes / GB:.1f} GB object store (two versions live); {avail / GB:.1f} GB available, "
                            f"store {object_store_bytes / GB:.1f} GB"})
            log(f"weight sync: skip {p / 1e9:g}B ({skipped[-1]['reason']})")
            continue
        copyto_s, fresh_s = memcpy_seconds(nbytes, repeats)
        learners = LearnerGroup(cfg, model_dir, RoleOptions("learner_rank", 1, 1.0, 0.0, {}),
                                SimulatedLearnerRank.actor_class(payload_params=int(p)))
        worker = SimulatedRolloutWorker.actor_class(weight_load="copy").options(num_cpus=1).remote(
            cfg, model_dir, "rollout-weight-sync")
        ray.get(worker.ready.remote())
        export, load, total = [], [], []
        try:
            # The first rounds fault in fresh object-store pages and the worker's buffers (cold);
            # a training run re-exports every step, so the warm rounds are the steady state.
            for i in range(warmup + repeats):
                t0 = time.perf_counter()
                ref = transport.publish(learners, i)
                t1 = time.perf_counter()
                ray.get(transport.push(worker, ref, i + 1))  # an idle worker loads an offer at once
                t2 = time.perf_counter()
                del ref
                export.append(t1 - t0), load.append(t2 - t1), total.append(t2 - t0)
            stats = ray.get(worker.stats.remote())
        finally:
            learners.shutdown()
            ray.kill(worker, no_restart=True)
        exact = stats["weight_bytes"]
        t_export, t_load, t_total = (statistics.median(x[warmup:]) for x in (export, load, total))
        best = min(total[warmup:])
        rows.append({
            "params": p, "bytes": exact, "export_to_store_s": t_export, "worker_load_s": t_load,
            "total_s": t_total, "total_GB_per_s": exact / t_total / GB, "best_total_s": best,
            "best_total_over_copyto": best / copyto_s,
            "memcpy_copyto_s": copyto_s, "memcpy_copyto_GB_per_s": exact / copyto_s / GB,
            "memcpy_fresh_copy_s": fresh_s, "total_over_copyto": t_total / copyto_s,
            "export_over_copyto": t_export / copyto_s, "load_over_copyto": t_load / copyto_s,
            "total_over_fresh_copy": t_total / fresh_s, "repeats": repeats, "warmup_rounds": warmup,
            "cold_first_round_s": {"export": export[0], "load": load[0], "total": total[0]},
            "all_rounds_total_s": [round(t, 4) for t in total],
        })
        log(f"weight sync {p / 1e9:g}B ({exact / GB:.2f} GB): export {t_export:.3f}s + load {t_load:.3f}s = "
            f"{t_total:.3f}s ({exact / t_total / GB:.2f} GB/s); np.copyto {copyto_s:.3f}s "
            f"({exact / copyto_s / GB:.2f} GB/s) -> {t_total / copyto_s:.2f}x; cold round {total[0]:.3f}s")
        gc.collect()
    return {"transport": transport.name, "worker_load": "copy into worker-owned buffers",
            "rows": rows, "skipped": skipped}
