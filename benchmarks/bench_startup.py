"""Start-up time of a real run, this checkout against an earlier commit, alternating, in one run.

Each round runs a one-step ``aisrl train`` (the tiny CPU default made small: one rollout worker, one
learner rank, 4 prompts x 4 samples, no dumps or checkpoints, W&B offline) from the working tree and
from a git worktree of ``--base``, in turn, and takes the wall seconds of each: Ray start, the
model (cached after the first round), the learner ranks, the vLLM rollout worker and its FP8 kernel
probe, one step, the report and the shutdown. Alternating spreads a load that comes and goes over
both. The model cache is shared (both build the same model; the first, untimed, round builds it).

    .venv/bin/python benchmarks/bench_startup.py --base fda7817 --rounds 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import emit, environment, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ONE_STEP = ["max_steps=1", "prompts_per_step=4", "rollout.group_size=4", "rollout.prompts_per_call=2",
            "learner.num_ranks=1", "model.warm_start_steps=20", "report.dump_every=0", "checkpoint_every=0"]


def one_run(checkout: Path, cache: Path, out: Path) -> tuple[float, str | None]:
    """Wall seconds of a one-step ``aisrl train`` whose code is ``checkout``'s (first on the path of the
    driver and of every Ray worker it starts), and the FP8 kernel its worker chose (its probe runs
    beside the start of the learner rank); exits with its stderr's end if it fails."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "AISRL_CACHE_DIR": str(cache), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-c", "import actors.cli; actors.cli.app()", "train", *ONE_STEP, f"output_dir={out}",
           "--overwrite"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"aisrl train from {checkout} failed (exit status {proc.returncode}):\n{proc.stderr[-3000:]}")
    kernels = json.loads((out / "rollout_workers.json").read_text()).get("fp8_kernel", {})
    return wall, next((k.get("kernel") for k in kernels.values()), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit to compare with (any git revision)")
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args()
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True)
    if base.returncode != 0:
        parser.error(f"--base {args.base}: not a revision of this repository ({base.stderr.strip()})")
    with tempfile.TemporaryDirectory(prefix="aisrl-startup-") as tmp:
        tmp = Path(tmp)
        worktree = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), args.base], cwd=ROOT, check=True)
        try:
            checkouts = {"base": worktree, "head": ROOT}
            one_run(ROOT, tmp / "cache", tmp / "warm-up")  # builds the model, warms the page cache
            times: dict[str, list[float]] = {"base": [], "head": []}
            kernels: dict[str, list[str | None]] = {"base": [], "head": []}
            for _ in range(args.rounds):
                for name, checkout in checkouts.items():
                    wall, kernel = one_run(checkout, tmp / "cache", tmp / name)
                    times[name].append(round(wall, 2))
                    kernels[name].append(kernel)
                    print(name, times[name][-1], kernel, file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    medians = {name: statistics.median(t) for name, t in times.items()}
    emit("startup_cpu", {"benchmark": "startup_cpu", **environment(), "base": base.stdout.strip(),
                         "overrides": ONE_STEP, "seconds": times, "fp8_kernels": kernels,
                         "median_seconds": medians, "head_over_base": medians["head"] / medians["base"]})


if __name__ == "__main__":
    main()
