"""The embedded default run, measured: steps per minute, tokens per second, time split, reward gain.

Runs ``aisrl train`` (the tiny CPU default, or with extra overrides) in a subprocess on a
private loopback Ray cluster, then reduces its ``metrics.jsonl``. Wall time includes the
start-up (Ray, model build if not cached, vLLM engine, FSDP2 ranks); the rates below are over
the training steps only.
"""

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import emit, result_name  # noqa: E402

SPLIT = ("time/wait_rollout", "time/proximal", "time/correction", "time/update", "time/sync")
STDERR_LINES = 40
"""How much of a failed run's stderr is shown."""


def run_train(cmd: list[str]) -> float:
    """Run ``cmd`` (an ``aisrl train``) with its output discarded; its wall seconds. When it fails: its exit
    status and the last lines of its stderr, then exit 1 (nothing is written to ``results/``)."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            err.seek(0)
            tail = collections.deque(err, maxlen=STDERR_LINES)
            print(f"aisrl train failed (exit status {proc.returncode}); the last {len(tail)} lines of its stderr:",
                  file=sys.stderr)
            sys.stderr.writelines(tail)
            sys.exit(1)
    return wall


def summarise(records: list[dict], window: int = 10) -> dict:
    steps = np.array([r["step"] for r in records])
    step_s = np.array([r["time/step"] for r in records])
    tokens = np.array([r["tokens/trained"] for r in records])
    reward = np.array([r["reward/mean"] for r in records])
    train_s = float(step_s.sum())
    return {
        "steps": int(steps[-1]),
        "train_seconds": train_s,
        "steps_per_minute": 60.0 * len(records) / train_s,
        "learner_tokens_per_s": float(tokens.sum() / train_s),
        "rollout_tokens_per_s_median": float(np.median([r["throughput/rollout_tokens_per_s"] for r in records[1:]])),
        "time_split_s_per_step": {k.split("/")[1]: float(np.mean([r[k] for r in records])) for k in SPLIT},
        f"reward_first_{window}": float(reward[:window].mean()),
        f"reward_last_{window}": float(reward[-window:].mean()),
        "kl_k1_median": float(np.median([r["mismatch/kl_k1"] for r in records])),
        "keep_seq_frac_mean": float(np.mean([r["correction/keep_seq_frac"] for r in records])),
        "lag_mean": float(np.mean([r["staleness/lag_mean"] for r in records])),
        **ais_summary(records),
    }


def ais_summary(records: list[dict]) -> dict:
    """With AIS on: the alpha trace and whether mixing ever changed what the method kept."""
    if not records or not records[0].get("ais/enabled"):
        return {}
    alpha = np.array([r["ais/alpha"] for r in records])
    return {
        "ais_alpha_median": float(np.median(alpha)), "ais_alpha_max": float(alpha.max()),
        "ais_steps_alpha_above_0.1": int((alpha > 0.1).sum()),
        "ais_alpha_every_10": [round(float(a), 3) for a in alpha[9::10]],
        "ais_keep_unchanged_by_mixing": bool(all(
            r["correction/keep_seq_frac"] == r["method_before_ais/keep_seq_frac"]
            and r["correction/keep_token_frac"] == r["method_before_ais/keep_token_frac"] for r in records)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the default")
    parser.add_argument("--name", type=result_name, default="default_run_cpu")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="aisrl-bench-"))
    cmd = [sys.executable, "-c", "from actors.cli import app; app()", "train", f"output_dir={out}",
           "report.console=false", *args.overrides]
    wall = run_train(cmd)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    emit(args.name, {"overrides": args.overrides, "wall_seconds_incl_startup": wall,
                     "run_dir": "(temporary)", **summarise(records)})


if __name__ == "__main__":
    main()
