"""The default run with each weight transport, same seeds: does a lossy ``delta`` cost reward or mismatch?

Runs ``aisrl train`` (the tiny CPU default plus any overrides) once per transport and seed
(``object_store``, ``collective``, ``delta``; ``delta_float16`` on request) in subprocesses, and reduces each run's
``metrics.jsonl`` like ``bench_default_run.py``, adding per run: the broadcast bytes per step
against the full payload (delta steps only, and over all steps), the compression ratio, the
versions the workers received by broadcast, and ``kl_k1`` over the last 50 steps (the delta's
reconstruction error shows up there, on top of FP8's). Writes
``benchmarks/results/weight_sync_run_cpu.json``.

    python benchmarks/bench_weight_sync_run.py --seeds 0 1

``--split`` runs ``object_store`` and ``delta``, each synchronous (``async.max_lag=0``: every
trained sample at lag 0) and asynchronous (``max_lag`` 1), and splits the mismatch (median over
steps of ``mismatch_by_lag/<lag>/kl_k1``) into its parts: FP8 (and kernels) = the lag-0 kl with
the object store; the codec = the lag-0 kl with ``delta`` minus that; staleness = the lag-1 kl of
the asynchronous object-store run minus the FP8 part. Writes ``weight_sync_split_cpu.json``.

    python benchmarks/bench_weight_sync_run.py --split --seeds 0 1
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_default_run import run_train, summarise  # noqa: E402
from harness import SEED, emit, result_name  # noqa: E402

ARMS = {"object_store": ["weight_sync.type=object_store"], "collective": ["weight_sync.type=collective"],
        "delta": ["weight_sync.type=delta"],  # int8 factors, the default
        "delta_float16": ["weight_sync.type=delta", "weight_sync.factors=float16"]}
"""Each arm's overrides: the transports, and ``delta`` with the float16 factors it sent before
``weight_sync.factors`` (int8 by default) existed, for a side-by-side run."""
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
    if any("weight_sync/codec_rel_error" in r for r in records):
        codec = [r["weight_sync/codec_rel_error"] for r in records if "weight_sync/codec_rel_error" in r]
        out["codec_rel_error_median"], out["codec_rel_error_max"] = float(np.median(codec)), float(np.max(codec))
        out["full_versions"] = int((reached & full).sum())
        out["full_for_error_steps"] = int(sum(r.get("weight_sync/full_for_error", 0) for r in records))
    return out


def by_lag_median(records: list[dict], lag: int, key: str = "kl_k1") -> float | None:
    """Median over steps of ``mismatch_by_lag/<lag>/<key>`` (steps with samples at that lag only)."""
    values = [r[f"mismatch_by_lag/{lag}/{key}"] for r in records
              if r.get(f"mismatch_by_lag/{lag}/{key}") is not None]
    return float(np.median(values)) if values else None


def run_once(seed: int, overrides: list[str]) -> tuple[list[dict], float]:
    out = Path(tempfile.mkdtemp(prefix="aisrl-bench-sync-"))
    cmd = [sys.executable, "-c", "from actors.cli import app; app()", "train", f"output_dir={out}",
           "report.console=false", f"seed={seed}", *overrides]
    wall = run_train(cmd)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    return records, wall


def split_parts(runs: dict) -> dict:
    """The parts from the four runs of one seed (keys ``<transport>/max_lag<0|1>``): across runs
    (synchronous lag-0 kl as the FP8 part) and, for staleness, also within the asynchronous run
    (its lag-1 minus its lag-0 kl: the same policy trajectory, so the cleaner of the two)."""
    def kl(run: str, lag: int) -> float:
        value = runs[run][f"kl_k1_lag{lag}_median"]
        return float("nan") if value is None else value

    fp8 = kl("object_store/max_lag0", 0)
    return {
        "fp8": fp8,
        "codec": kl("delta/max_lag0", 0) - fp8,
        "staleness": kl("object_store/max_lag1", 1) - fp8,
        "staleness_within_async_run": kl("object_store/max_lag1", 1) - kl("object_store/max_lag1", 0),
        "codec_within_async_runs_lag1": kl("delta/max_lag1", 1) - kl("object_store/max_lag1", 1),
        "delta_async_lag1_total": kl("delta/max_lag1", 1),
    }


def split(seeds: list[int], overrides: list[str]) -> dict:
    """The mismatch split into FP8, codec and staleness parts (see the module docstring)."""
    runs, parts = {}, {}
    for seed in seeds:
        for transport in ("object_store", "delta"):
            for lag in (0, 1):
                records, wall = run_once(seed, [f"weight_sync.type={transport}", f"async.max_lag={lag}", *overrides])
                codec = [r["weight_sync/codec_rel_error"] for r in records if "weight_sync/codec_rel_error" in r]
                runs[f"{transport}/max_lag{lag}/seed{seed}"] = r = {
                    "wall_seconds_incl_startup": wall, **summarise(records),
                    "kl_k1_lag0_median": by_lag_median(records, 0), "kl_k1_lag1_median": by_lag_median(records, 1),
                    "codec_rel_error_median": float(np.median(codec)) if codec else None}
                print(f"seed {seed} {transport:12s} max_lag {lag}: kl_k1 lag 0 {r['kl_k1_lag0_median']}, lag 1 "
                      f"{r['kl_k1_lag1_median']}, codec error {r['codec_rel_error_median']}, reward "
                      f"{r['reward_first_10']:.3f} -> {r['reward_last_10']:.3f}", file=sys.stderr, flush=True)
        parts[f"seed{seed}"] = split_parts({k.split("/seed")[0]: v for k, v in runs.items() if k.endswith(f"/seed{seed}")})
    return {"overrides": overrides, "seeds": seeds, "metric": "median over steps of mismatch_by_lag/<lag>/kl_k1",
            "split": parts, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the default")
    parser.add_argument("--seeds", type=SEED, nargs="+", default=[0])
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=list(ARMS))
    parser.add_argument("--name", type=result_name, default="weight_sync_run_cpu")
    parser.add_argument("--split", action="store_true", help="the FP8 / codec / staleness split of the mismatch")
    args = parser.parse_args()
    if args.split:
        emit("weight_sync_split_cpu", split(args.seeds, args.overrides))
        return
    runs = {}
    for seed in args.seeds:
        for transport in args.transports:
            records, wall = run_once(seed, [*ARMS[transport], *args.overrides])
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
