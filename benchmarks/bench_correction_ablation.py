"""Correction ablation: does the correction matter when the rollout policy is clearly off?

The tiny default task, trained with a deliberately mismatched rollout policy: FP8 rollout
weights plus a fixed relative perturbation (``rollout.perturb_std``, see
``system.rollout.perturbation``), which puts the mismatch in the ``kl_k1 > 0.1`` regime
(about 0.13 at sigma 0.2 and 0.19 at 0.25 on the initial model, against 0.0007 for FP8
alone). Two sweeps, each run with the same seeds:

* methods at the default staleness (``async.max_lag = 1``): none, token-tis, icepop,
  seq-mis (the default), seq-mis + AIS, CTPO (on seq-tis, the reference recipe);
* staleness ``async.max_lag`` 0, 1, 2, 4 with the default correction (seq-mis).

Every run is a real ``aisrl train`` (vLLM FP8 rollout worker, 2-rank FSDP2 learner,
correction service) in a subprocess. Per run: the reward curve, the first / last / best
10-step mean reward, the median ``kl_k1``, the kept fractions, and ``collapsed``: a
non-finite loss, or a last-10 mean reward below half the best 10-step mean reached earlier.
Writes ``benchmarks/results/correction_ablation_cpu.{json,md,png}``; the JSON is rewritten
after every run, so an interrupted sweep keeps what finished.

    python benchmarks/bench_correction_ablation.py                 # both sweeps, seed 0
    python benchmarks/bench_correction_ablation.py --seeds 0 1 --steps 100
    python benchmarks/bench_correction_ablation.py --perturb-std 0.5 --sweeps method \
        --methods none token-tis seq-mis --name correction_ablation_strong_cpu
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, emit, environment  # noqa: E402

METHODS = {
    "none": ["correction.method.type=none"],
    "token-tis": ["correction.method.type=token-tis"],
    "icepop": ["correction.method.type=icepop"],
    "seq-mis": [],
    "seq-mis+ais": ["correction.ais.enabled=true"],
    "ctpo": ["learner.loss.type=ctpo", "correction.method.type=seq-tis", "correction.method.c=5.0"],
}
LAGS = (0, 1, 2, 4)
WINDOW = 10


def run_key(sweep: str, variant: str, seed: int) -> str:
    return f"{sweep}/{variant}/seed{seed}"


def summarise(records: list[dict]) -> dict:
    """Reward curve and the run's figures (see the module docstring for ``collapsed``)."""
    reward = np.array([r["reward/mean"] for r in records], dtype=np.float64)
    rolling = np.convolve(reward, np.ones(WINDOW) / WINDOW, mode="valid") if len(reward) >= WINDOW else reward
    losses = [r.get("learner/loss") for r in records]
    nonfinite = any(v is None or not math.isfinite(v) for v in losses)
    last = float(reward[-WINDOW:].mean())
    best = float(rolling.max())
    return {
        "steps": len(records),
        "reward_curve": [round(float(x), 4) for x in reward],
        "reward_first": float(reward[:WINDOW].mean()),
        "reward_last": last,
        "reward_best": best,
        "kl_k1_median": float(np.median([r["mismatch/kl_k1"] for r in records])),
        "keep_token_frac_mean": _mean(records, "correction/keep_token_frac"),
        "keep_seq_frac_mean": _mean(records, "correction/keep_seq_frac"),
        "lag_mean": _mean(records, "staleness/lag_mean"),
        "nonfinite_loss": nonfinite,
        "collapsed": bool(nonfinite or last < 0.5 * best),
    }


def _mean(records: list[dict], key: str) -> float | None:
    vals = [r[key] for r in records if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def train(overrides: list[str], log_path: Path) -> tuple[list[dict], float]:
    out = Path(tempfile.mkdtemp(prefix="aisrl-ablation-"))
    cmd = [sys.executable, "-c", "from actors.cli import app; app()", "train", f"output_dir={out}",
           "report.console=false", "checkpoint_every=0", *overrides]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], wall


def _seed_mean(rs: list[dict], key: str, fmt: str) -> str:
    vals = [r[key] for r in rs if r[key] is not None]
    return fmt.format(np.mean(vals)) if vals else "n/a"


def table(runs: dict) -> str:
    """Markdown table: one row per (sweep, variant), figures averaged over seeds."""
    rows = ["| sweep | variant | seeds | reward first 10 | reward last 10 | best 10 | kl_k1 median | "
            "kept tokens | kept seqs | collapsed |", "|" + "---|" * 10]
    groups: dict[tuple[str, str], list[dict]] = {}
    for key, r in runs.items():
        sweep, variant, _ = key.split("/")
        groups.setdefault((sweep, variant), []).append(r)
    for (sweep, variant), rs in groups.items():
        cells = [_seed_mean(rs, k, "{:.3f}") for k in ("reward_first", "reward_last", "reward_best", "kl_k1_median")]
        cells += [_seed_mean(rs, k, "{:.1%}") for k in ("keep_token_frac_mean", "keep_seq_frac_mean")]
        rows.append(f"| {sweep} | {variant} | {len(rs)} | {' | '.join(cells)} | "
                    f"{sum(r['collapsed'] for r in rs)}/{len(rs)} |")
    return "\n".join(rows) + "\n"


def plot(runs: dict, path: Path, sigma: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [(s, t) for s, t in (("method", "correction method (max_lag 1)"), ("max_lag", "staleness (seq-mis)"))
              if any(k.startswith(s + "/") for k in runs)]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, (sweep, title) in zip(axes, sweeps, strict=True):
        curves: dict[str, list[list[float]]] = {}
        for key, r in runs.items():
            s, variant, _ = key.split("/")
            if s == sweep:
                curves.setdefault(variant, []).append(r["reward_curve"])
        for variant, cs in curves.items():
            n = min(len(c) for c in cs)
            mean = np.mean([c[:n] for c in cs], axis=0)
            smooth = np.convolve(mean, np.ones(5) / 5, mode="valid")
            ax.plot(np.arange(len(smooth)) + 3, smooth, label=f"{variant} ({len(cs)} seed{'s' * (len(cs) > 1)})")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("mean reward (5-step moving average)")
    fig.suptitle(f"tiny task, FP8 rollout + perturbed rollout weights (perturb_std {sigma}, kl_k1 > 0.1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--perturb-std", type=float, default=0.25)
    parser.add_argument("--sweeps", nargs="+", default=["method", "max_lag"], choices=["method", "max_lag"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lags", type=int, nargs="+", default=list(LAGS))
    parser.add_argument("--name", default="correction_ablation_cpu")
    args = parser.parse_args()
    base = [f"max_steps={args.steps}", f"rollout.perturb_std={args.perturb_std}"]
    plan: list[tuple[str, str, int, list[str]]] = []
    for seed in args.seeds:
        if "method" in args.sweeps:
            plan += [("method", m, seed, METHODS[m]) for m in args.methods]
        if "max_lag" in args.sweeps:
            plan += [("max_lag", str(lag), seed, [f"async.max_lag={lag}"]) for lag in args.lags]
    partial = RESULTS / f"{args.name}.partial.json"
    runs: dict[str, dict] = {}
    logs = Path(tempfile.mkdtemp(prefix="aisrl-ablation-logs-"))
    started = time.perf_counter()
    for sweep, variant, seed, overrides in plan:
        key = run_key(sweep, variant, seed)
        shared = run_key("method", "seq-mis", seed)
        if sweep == "max_lag" and variant == "1" and shared in runs:  # the same run as the default method
            runs[key] = runs[shared]
            continue
        records, wall = train([*base, f"seed={seed}", *overrides], logs / f"{key.replace('/', '_')}.log")
        runs[key] = {"overrides": overrides, "wall_seconds": wall, **summarise(records)}
        r = runs[key]
        print(f"{key:28s} reward {r['reward_first']:.3f} -> {r['reward_last']:.3f} kl_k1 {r['kl_k1_median']:.3f} "
              f"kept seqs {r['keep_seq_frac_mean'] or float('nan'):.2f} collapsed {r['collapsed']} ({wall:.0f} s)",
              file=sys.stderr, flush=True)
        partial.write_text(json.dumps({**environment(), "runs": runs}, indent=1))
    (RESULTS / f"{args.name}.md").write_text(
        f"Correction ablation on CPU: {args.steps} steps, rollout.perturb_std {args.perturb_std}, "
        f"seeds {args.seeds}; figures averaged over seeds.\n\n" + table(runs))
    plot(runs, RESULTS / f"{args.name}.png", args.perturb_std)
    partial.unlink(missing_ok=True)
    emit(args.name, {"steps": args.steps, "perturb_std": args.perturb_std, "seeds": args.seeds,
                     "total_wall_seconds": time.perf_counter() - started, "runs": runs})


if __name__ == "__main__":
    main()
