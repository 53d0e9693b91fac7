"""Correction ablation, version 2: the long-response task under two mismatch regimes, eight arms.

Every run is a real ``aisrl train configs/long_cpu.yaml`` (vLLM FP8 rollout worker, 2-rank
FSDP2 learner, correction service) in a subprocess, shortened by ``--steps`` and
``--prompts-per-step``. Regimes (the mismatch the correction has to handle):

* ``stale``: FP8 rollouts, ``async.max_lag = 4``: rollouts may run up to four versions ahead of
  the learner, so samples wait in the buffer (the lag histogram of the trained samples is
  reported: whether they really wait depends on rollout vs learner speed on the machine);
* ``drift``: FP8 rollouts plus a rollout-weight perturbation whose size grows with the policy
  version, ``sigma(v) = sigma_final * min(v / ramp, 1)`` with a fixed pattern per tensor
  (``system.rollout.perturbation``): no extra mismatch at first, a growing systematic one later.

Arms: none, token-tis, seq-tis, seq-mis (the default method), seq-mis + AIS v2, icepop, CTPO
(on seq-tis, two mini-batches, so its clip acts). Per run: the reward curve, the mean reward of
the last ``--last`` steps, ``collapsed`` (a non-finite loss, or a 10-step mean reward below
half of the best 10-step mean reached earlier) and the step it happened, the kept token /
sequence fractions, ``mismatch/ess_seq``, ``mismatch/kl_k1``, the lag histogram, the alpha
trace (AIS arm). Per (regime, arm): the mean over seeds of the last-N reward with a 95 %
Student-t interval. Writes ``benchmarks/results/<name>.{json,md,png}``; a ``.partial.json`` is
rewritten after every run, so an interrupted sweep keeps what finished (``--resume`` skips
the runs it holds).

    python benchmarks/bench_correction_ablation.py --seeds 0 1 2 3
    python benchmarks/bench_correction_ablation.py --regimes drift --arms none seq-mis --seeds 0
"""

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, SEED, emit, environment, float_range, positive_int, result_name  # noqa: E402

PRESET = Path(__file__).resolve().parents[1] / "configs" / "long_cpu.yaml"
ARMS = {
    "none": ["correction.method.type=none"],
    "token-tis": ["correction.method.type=token-tis"],
    "seq-tis": ["correction.method.type=seq-tis"],
    "seq-mis": ["correction.method.type=seq-mis"],
    "seq-mis+ais": ["correction.method.type=seq-mis", "correction.ais.enabled=true"],
    "seq-mis+ais-per-lag": ["correction.method.type=seq-mis", "correction.ais.enabled=true",
                            "correction.ais.per_lag=true"],
    "icepop": ["correction.method.type=icepop"],
    "ctpo": ["learner.loss.type=ctpo", "learner.mini_batches=2", "correction.method.type=seq-tis",
             "correction.method.c=5.0"],
}
WINDOW = 10
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Two-sided 95 % quantiles of Student's t by degrees of freedom (tables)."""


def regime_overrides(regime: str, steps: int, drift_sigma: float) -> list[str]:
    if regime == "stale":
        return ["async.max_lag=4"]
    if regime == "drift":
        return [f"rollout.perturb_std_final={drift_sigma}", f"rollout.perturb_ramp_versions={steps}"]
    raise ValueError(f"unknown regime {regime!r}")


def collapse_step(reward: np.ndarray, nonfinite_at: int | None) -> int | None:
    """First step (1-based) at which the run counts as collapsed, or None.

    A non-finite loss collapses at once; otherwise the first step whose trailing 10-step mean
    reward is below half of the best trailing 10-step mean reached before it.
    """
    if nonfinite_at is not None:
        return nonfinite_at
    if len(reward) < WINDOW:
        return None
    rolling = np.convolve(reward, np.ones(WINDOW) / WINDOW, mode="valid")  # rolling[i] ends at step i + WINDOW
    best = -np.inf
    for i, value in enumerate(rolling):
        if value < 0.5 * best:
            return i + WINDOW
        best = max(best, value)
    return None


def summarise(records: list[dict], last: int) -> dict:
    reward = np.array([r["reward/mean"] for r in records], dtype=np.float64)
    losses = [r.get("learner/loss") for r in records]
    bad = [i + 1 for i, v in enumerate(losses) if v is None or not math.isfinite(v)]
    lag_hist: dict[str, int] = {}
    for r in records:
        for key, n in r.items():
            if key.startswith("staleness/sequences_lag_"):
                lag = key.rsplit("_", 1)[1]
                lag_hist[lag] = lag_hist.get(lag, 0) + int(n)
    at = collapse_step(reward, bad[0] if bad else None)
    return {
        "steps": len(records),
        "reward_curve": [round(float(x), 4) for x in reward],
        "reward_first": float(reward[:WINDOW].mean()),
        "reward_last": float(reward[-last:].mean()),
        "collapsed": at is not None,
        "collapse_step": at,
        "keep_token_frac_mean": _mean(records, "correction/keep_token_frac"),
        "keep_seq_frac_mean": _mean(records, "correction/keep_seq_frac"),
        "ess_seq_mean": _mean(records, "mismatch/ess_seq"),
        "kl_k1_first": _mean(records[:WINDOW], "mismatch/kl_k1"),
        "kl_k1_last": _mean(records[-WINDOW:], "mismatch/kl_k1"),
        "kl_k1_curve": [round(float(r["mismatch/kl_k1"]), 5) for r in records if r.get("mismatch/kl_k1") is not None],
        "alpha_curve": [round(float(r["ais/alpha"]), 4) for r in records if r.get("ais/alpha") is not None],
        "clip_frac_last_update_mean": _mean(records, "learner/last/loss/clip_frac"),
        "lag_histogram": dict(sorted(lag_hist.items(), key=lambda kv: int(kv[0]))),
        "seconds_per_step": _mean(records, "time/step"),
    }


def _mean(records: list[dict], key: str) -> float | None:
    vals = [float(r[key]) for r in records if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def interval95(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % Student-t interval); half-width nan for one value."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    t = T_975.get(len(x) - 1, 1.96)
    return float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(len(x)))


def train(overrides: list[str], log_path: Path) -> tuple[list[dict], float]:
    out = Path(tempfile.mkdtemp(prefix="aisrl-ablation-"))
    cmd = [sys.executable, "-c", "from actors.cli import app; app()", "train", str(PRESET), f"output_dir={out}",
           "report.console=false", "report.dump_every=0", "checkpoint_every=0", *overrides]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:  # say why, not only CalledProcessError: the run's log is kept at log_path
        shutil.rmtree(out, ignore_errors=True)
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        sys.exit(f"aisrl train {' '.join(overrides)} failed (exit {proc.returncode}); the last lines of "
                 f"{log_path}:\n" + "\n".join(tail))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)  # a run directory (checkpoint included) per run otherwise stays
    return records, wall


def grouped(runs: dict) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for key, r in runs.items():
        regime, arm, _ = key.split("/")
        groups.setdefault((regime, arm), []).append(r)
    return groups


def table(runs: dict, last: int) -> str:
    rows = [f"| regime | arm | seeds | reward first 10 | reward last {last} (95 % CI) | collapsed (steps) | "
            "kept tokens | kept seqs | ESS seq | kl_k1 first / last 10 | lag histogram | alpha last 10 |",
            "|" + "---|" * 12]
    for (regime, arm), rs in grouped(runs).items():
        mean, half = interval95([r["reward_last"] for r in rs])
        first = np.mean([r["reward_first"] for r in rs])
        steps = [str(r["collapse_step"]) for r in rs if r["collapsed"]]
        cells = [f"{first:.3f}", f"{mean:.3f} ± {half:.3f}",
                 f"{len(steps)}/{len(rs)}" + (f" ({', '.join(steps)})" if steps else "")]
        for k in ("keep_token_frac_mean", "keep_seq_frac_mean", "ess_seq_mean"):
            vals = [r[k] for r in rs if r[k] is not None]
            cells.append(f"{np.mean(vals):.1%}" if vals else "n/a")
        kl = [(r["kl_k1_first"], r["kl_k1_last"]) for r in rs if r["kl_k1_first"] is not None]
        cells.append(f"{np.mean([a for a, _ in kl]):.3f} / {np.mean([b for _, b in kl]):.3f}" if kl else "n/a")
        hist: dict[str, int] = {}
        for r in rs:
            for lag, n in r["lag_histogram"].items():
                hist[lag] = hist.get(lag, 0) + n
        total = max(sum(hist.values()), 1)
        cells.append(" ".join(f"{lag}:{n / total:.0%}" for lag, n in sorted(hist.items(), key=lambda kv: int(kv[0]))))
        alphas = [np.mean(r["alpha_curve"][-WINDOW:]) for r in rs if r["alpha_curve"]]
        cells.append(f"{np.mean(alphas):.2f}" if alphas else "")
        rows.append(f"| {regime} | {arm} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def plot(runs: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = sorted({k.split("/")[0] for k in runs})
    fig, axes = plt.subplots(2, len(regimes), figsize=(6.5 * len(regimes), 8), squeeze=False)
    for col, regime in enumerate(regimes):
        ax, low = axes[0][col], axes[1][col]
        for (reg, arm), rs in grouped(runs).items():
            if reg != regime:
                continue
            n = min(len(r["reward_curve"]) for r in rs)
            mean = np.mean([r["reward_curve"][:n] for r in rs], axis=0)
            smooth = np.convolve(mean, np.ones(5) / 5, mode="valid")
            ax.plot(np.arange(len(smooth)) + 3, smooth, label=f"{arm} ({len(rs)})")
            kls = [r["kl_k1_curve"] for r in rs if r["kl_k1_curve"]]
            if arm == "seq-mis+ais":
                m = min(len(r["alpha_curve"]) for r in rs)
                low.plot(np.arange(m) + 1, np.mean([r["alpha_curve"][:m] for r in rs], axis=0), color="k",
                         label="AIS alpha (seq-mis+ais)")
            if arm == "none" and kls:
                m = min(len(c) for c in kls)
                twin = low.twinx()
                twin.plot(np.arange(m) + 1, np.mean([c[:m] for c in kls], axis=0), color="tab:red", alpha=0.6)
                twin.set_ylabel("kl_k1 (arm none)", color="tab:red")
        ax.set_title(f"{regime}: mean reward over seeds (5-step moving average)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        low.set_xlabel("step")
        low.set_ylabel("alpha")
        low.set_ylim(0, 1)
        low.grid(alpha=0.3)
        low.legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=positive_int, default=60)
    parser.add_argument("--prompts-per-step", type=positive_int, default=16)
    parser.add_argument("--seeds", type=SEED, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--regimes", nargs="+", default=["stale", "drift"], choices=["stale", "drift"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--drift-sigma", type=float_range(0.0, 1.0), default=0.3,
                        help="final sigma of the drift regime's perturbation (rollout.perturb_std_final: 0 to 1)")
    parser.add_argument("--last", type=positive_int, default=10, help="the reward of the last N steps")
    parser.add_argument("--name", type=result_name, default="correction_ablation_v2_cpu")
    parser.add_argument("--resume", action="store_true", help="keep the runs of an existing .partial.json")
    args = parser.parse_args()
    base = [f"max_steps={args.steps}", f"prompts_per_step={args.prompts_per_step}"]
    partial = RESULTS / f"{args.name}.partial.json"
    runs: dict[str, dict] = json.loads(partial.read_text())["runs"] if args.resume and partial.exists() else {}
    wanted = {f"{reg}/{arm}/seed{seed}" for seed in args.seeds for reg in args.regimes for arm in args.arms}
    runs = {k: v for k, v in runs.items() if k in wanted}  # --resume --seeds 0 1: report those seeds only
    logs = Path(tempfile.mkdtemp(prefix="aisrl-ablation-logs-"))
    started = time.perf_counter()
    for seed in args.seeds:  # seed-major: an interrupted sweep has every arm at the seeds it finished
        for regime in args.regimes:
            for arm in args.arms:
                key = f"{regime}/{arm}/seed{seed}"
                if key in runs:
                    continue
                overrides = [*base, f"seed={seed}", *regime_overrides(regime, args.steps, args.drift_sigma), *ARMS[arm]]
                records, wall = train(overrides, logs / f"{key.replace('/', '_')}.log")
                runs[key] = {"overrides": overrides, "wall_seconds": wall, **summarise(records, args.last)}
                r = runs[key]
                print(f"{key:28s} reward {r['reward_first']:.3f} -> {r['reward_last']:.3f} "
                      f"kl_k1 {r['kl_k1_first']:.3f}->{r['kl_k1_last']:.3f} lags {r['lag_histogram']} "
                      f"collapsed {r['collapse_step']} ({wall:.0f} s)", file=sys.stderr, flush=True)
                partial.write_text(json.dumps({**environment(), "runs": runs}, indent=1))
    title = (f"long task (73-token answers), {args.steps} steps x {args.prompts_per_step} prompts, "
             f"stale: max_lag 4; drift: perturbation 0 -> {args.drift_sigma}")
    (RESULTS / f"{args.name}.md").write_text(
        f"Correction ablation v2 on CPU ({environment()['processor']}): {title}; seeds {args.seeds}; "
        f"reward last {args.last} = mean of the last {args.last} steps, mean over seeds with a 95 % t interval.\n\n"
        + table(runs, args.last))
    plot(runs, RESULTS / f"{args.name}.png", title)
    partial.unlink(missing_ok=True)
    emit(args.name, {"steps": args.steps, "prompts_per_step": args.prompts_per_step, "seeds": args.seeds,
                     "drift_sigma": args.drift_sigma, "last": args.last,
                     "total_wall_seconds": time.perf_counter() - started, "runs": runs})


if __name__ == "__main__":
    main()
