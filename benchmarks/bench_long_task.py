"""The long-response preset, measured: reward curve, steps per minute, response length, mismatch.

Runs ``aisrl train configs/long_cpu.yaml`` (plus any overrides) in a subprocess on a private
loopback Ray cluster, then reduces its ``metrics.jsonl`` like ``bench_default_run.py`` does,
adding the mean response length (trained tokens per sequence) over the first and last 10
steps and the reward every 10 steps. Wall time includes the start-up (and the model build
when it is not cached yet: about 2.5 minutes on a 2-core AMD EPYC); the rates are over the training
steps only.
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
from harness import emit, result_name  # noqa: E402

PRESET = Path(__file__).resolve().parents[1] / "configs" / "long_cpu.yaml"


def response_lengths(records: list[dict], window: int = 10) -> dict:
    per_step = [r["tokens/trained"] / r["learner/num_sequences"] for r in records]
    return {f"response_tokens_first_{window}": float(np.mean(per_step[:window])),
            f"response_tokens_last_{window}": float(np.mean(per_step[-window:])),
            "reward_every_10_steps": [round(float(np.mean([r["reward/mean"] for r in records[i:i + 10]])), 4)
                                      for i in range(0, len(records), 10)],
            # the sequence-level ESS fraction of rho_seq (spec section 1): how much a sequence-level
            # method has to work with on 74-token responses
            "ess_seq_min": float(min(r["mismatch/ess_seq"] for r in records)),
            "ess_seq_median": float(np.median([r["mismatch/ess_seq"] for r in records])),
            "ess_seq_max": float(max(r["mismatch/ess_seq"] for r in records))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the preset")
    parser.add_argument("--name", type=result_name, default="long_task_cpu")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="aisrl-bench-long-"))
    cmd = [sys.executable, "-c", "from actors.cli import app; app()", "train", str(PRESET),
           f"output_dir={out}", "report.console=false", *args.overrides]
    wall = run_train(cmd)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    emit(args.name, {"preset": "configs/long_cpu.yaml", "overrides": args.overrides,
                     "wall_seconds_incl_startup": wall, "run_dir": "(temporary)",
                     **summarise(records), **response_lengths(records)})


if __name__ == "__main__":
    main()
