"""The default run with each weight transport, same seeds: does a lossy ``delta`` cost reward or mismatch?

Runs ``aisrl train`` (the tiny CPU default plus any overrides) once per transport and seed
(``object_store``, ``collective``, ``delta``) in subprocesses, and reduces each run's
``metrics.jsonl`` like ``bench_default_run.py``, adding per run: the broadcast bytes per step
against the full payload (delta steps only, and over all steps), the compression ratio, the
versions the workers received by broadcast, and ``kl_k1`` over the last 50 steps (the delta's
reconstruction error shows up there, on top of FP8's). Writes
``benchmarks/results/weight_sync_run_cpu.json``.

    python benchmarks/bench_weight_sync_run.py --seeds 0 1
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_default_run import summarise  # noqa: E402
from harness import emit  # noqa: E402

TRANSPORTS = ("object_store", "collective", "delta")


def sync_summary(records: list[dict]) -> dict:
    payload = np.array([r["weight_sync/payload_bytes"] for r in records], dtype=np.float64)
    sent = np.array([r.get("weight_sync/broadcast_bytes", 0) for r in records], dtype=np.float64)
    receivers = np.array([r.get("weight_sync/broadcast_receivers", 0) for r in records], dtype=np.float64)
    full = np.array([r.get("weight_sync/full_version", 1) for r in records], dtype=bool)
    reached = receivers > 0
    delta_steps = reached & ~full
    out = {
        "payload_bytes": float(payload[0]),
        "steps_broadcast": int(reached.sum()),
        "broadcast_seconds_mean": float(np.mean([r.get("weight_sync/broadcast_seconds", 0.0) for r in records])),
        "kl_k1_last_50_mean": float(np.mean([r["mismatch/kl_k1"] for r in records[-50:]])),
    }
    if reached.any():
        per_receiver = sent[reached] / receivers[reached]
        out["bytes_per_step_over_full_all_broadcast_steps"] = float(per_receiver.sum() / payload[reached].sum())
    if delta_steps.any():
        out["bytes_per_step_over_full_delta_steps"] = float(
            (sent[delta_steps] / receivers[delta_steps]).mean() / payload[0])
        out["compression_ratio_median"] = float(np.median([r["weight_sync/compression_ratio"]
                                                           for r, d in zip(records, delta_steps, strict=True) if d]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the default")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--name", default="weight_sync_run_cpu")
    args = parser.parse_args()
    runs = {}
    for seed in args.seeds:
        for transport in args.transports:
            out = Path(tempfile.mkdtemp(prefix="aisrl-bench-sync-"))
            cmd = [sys.executable, "-c", "from actors.cli import app; app()", "train", f"output_dir={out}",
                   "report.console=false", f"seed={seed}", f"weight_sync.type={transport}", *args.overrides]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            key = f"{transport}/seed{seed}"
            runs[key] = {"wall_seconds_incl_startup": wall, **summarise(records), **sync_summary(records)}
            r = runs[key]
            print(f"{key:24s} reward {r['reward_first_10']:.3f} -> {r['reward_last_10']:.3f}  kl_k1 median "
                  f"{r['kl_k1_median']:.4f} last-50 {r['kl_k1_last_50_mean']:.4f}  bytes/full "
                  f"{r.get('bytes_per_step_over_full_all_broadcast_steps', float('nan')):.3f}", file=sys.stderr,
                  flush=True)
    emit(args.name, {"overrides": args.overrides, "seeds": args.seeds, "runs": runs})


if __name__ == "__main__":
    main()
