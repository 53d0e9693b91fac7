"""The correction core side by side with verl's rollout-correction helper, one process, same batches.

verl 0.9.1's real ``verl.trainer.ppo.rollout_corr_helper`` (installed by ``make bench`` into
``.venv/verl-bench`` with ``pip --target --no-deps``; it is never a dependency of aisrl):

* verl metrics: ``compute_offpolicy_metrics(proximal, behaviour, mask)`` (KL k1/k3, perplexities, chi2);
* verl full: ``compute_rollout_correction_and_rejection_mask`` configured as Seq-MIS with hi = 3:
  sequence-level IS weights truncated at 3 (``rollout_is="sequence"``) and rejection of sequences
  whose ratio exp(L) exceeds 3 (``rollout_rs="seq_sum_k1"``, bounds on exp(-L): [1/3, 1e30]), which
  also computes its metrics;

against aisrl's full path (every spec section 1 diagnostic + Seq-MIS weights + their statistics)
on the torch path and on the fused pass (``system.correction.fused``), and the read floor
(``behaviour.sum(), proximal.sum(), count_nonzero(mask)``), at ``--threads`` 1 and 2 (``torch.set_num_threads``;
the fused pass runs on the same number of OpenMP threads). Batches: ``bench_correction.make_batch`` (1024-token rows,
lengths uniform in [512, 1024], d ~ N(0, 0.05)). The shared figures (KL k1 and k3, chi2 token and
sequence) are compared value by value. Median of ``--repeats`` calls after 2 warm-up calls.

    PYTHONPATH=.venv/verl-bench .venv/bin/python benchmarks/bench_correction_vs_verl.py
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_correction import SIZES, make_batch, ours, ours_fused, read_floor  # noqa: E402
from harness import emit, int_list, positive_int, result_tag, time_median  # noqa: E402

from system.correction import compute_diagnostics, compute_log_ratios, fused  # noqa: E402

verl_helper = None
"""``verl.trainer.ppo.rollout_corr_helper``, imported by ``import_verl`` once the arguments are checked."""


def import_verl() -> None:
    global verl_helper
    try:
        from verl.trainer.ppo import rollout_corr_helper
    except ImportError as exc:  # pragma: no cover - a set-up problem, said plainly
        raise SystemExit(f"verl is not importable ({exc}); `make bench` installs it into .venv/verl-bench "
                         "(pip install --no-deps --target .venv/verl-bench verl==0.9.1 ...; see the Makefile)") from None
    verl_helper = rollout_corr_helper


def verl_metrics(behaviour, proximal, mask):
    return verl_helper.compute_offpolicy_metrics(old_log_prob=proximal, rollout_log_prob=behaviour, response_mask=mask)


def verl_full(behaviour, proximal, mask):
    return verl_helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=proximal, rollout_log_prob=behaviour, response_mask=mask, rollout_is="sequence", rollout_is_threshold=3.0,
        rollout_rs="seq_sum_k1", rollout_rs_threshold=f"{1 / 3}_1e30")


def as_float(value) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def shared_figures(behaviour, proximal, mask) -> dict:
    """Our value, verl's, and the relative difference for each figure both compute."""
    ref = compute_diagnostics(compute_log_ratios(behaviour, proximal, mask))
    theirs = verl_metrics(behaviour, proximal, mask)
    pairs = {"kl_k1": "kl", "kl_k3": "k3_kl", "chi2_token": "chi2_token", "chi2_seq": "chi2_seq"}
    out = {}
    for ours_key, verl_key in pairs.items():
        if verl_key in theirs:
            a, b = ref[ours_key], as_float(theirs[verl_key])
            out[ours_key] = {"aisrl": a, "verl": b, "rel_diff": abs(a - b) / max(abs(a), 1e-300)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=SIZES, default="1048576,4194304",
                        help="comma-separated tokens per batch, each a multiple of 1024 (whole rows)")
    parser.add_argument("--threads", type=int_list(minimum=1, what="thread count"), default="1,2",
                        help="comma-separated torch thread counts")
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--tag", type=result_tag, default="", help="suffix of the result's name (e.g. _amx)")
    parser.add_argument("--no-save", action="store_true", help="print the JSON line only")
    args = parser.parse_args()
    if not fused.available():
        raise SystemExit("the fused correction pass is not built: python -m system.correction.fused_build")
    import_verl()
    batches = {n: make_batch(n, "cpu") for n in args.sizes}
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n, batch in batches.items():
            row = {"tokens": n, "threads": threads}
            for name, fn in (("read_floor", read_floor), ("verl_metrics", verl_metrics), ("verl_full", verl_full),
                             ("aisrl_torch", ours), ("aisrl_fused", ours_fused)):
                row[f"{name}_s"] = time_median(lambda fn=fn, batch=batch: fn(*batch), args.repeats)
            row["aisrl_fused_over_read_floor"] = row["aisrl_fused_s"] / row["read_floor_s"]
            row["verl_full_over_aisrl_fused"] = row["verl_full_s"] / row["aisrl_fused_s"]
            row["verl_full_over_aisrl_torch"] = row["verl_full_s"] / row["aisrl_torch_s"]
            rows.append(row)
            print(f"{n:>8} tokens, {threads} thread(s): read floor {row['read_floor_s'] * 1e3:6.2f} ms  verl metrics "
                  f"{row['verl_metrics_s'] * 1e3:7.1f}  verl full {row['verl_full_s'] * 1e3:7.1f}  aisrl torch "
                  f"{row['aisrl_torch_s'] * 1e3:7.1f}  aisrl fused {row['aisrl_fused_s'] * 1e3:6.1f} ms "
                  f"({row['aisrl_fused_over_read_floor']:.1f}x floor; verl full / fused "
                  f"{row['verl_full_over_aisrl_fused']:.1f}x)", file=sys.stderr)
    n_small = min(batches)
    emit(f"correction_vs_verl_cpu{args.tag}", {
        "verl_version": getattr(sys.modules.get("verl"), "__version__", "unknown"),
        "verl_full_config": "rollout_is=sequence, rollout_is_threshold=3.0, rollout_rs=seq_sum_k1, "
                            "rollout_rs_threshold=1/3_1e30",
        "rows": rows, "shared_figures_at_tokens": n_small, "shared_figures": shared_figures(*batches[n_small]),
        "goal": "aisrl full <= 20x read floor and >= 3x faster than verl full, at 1M and 4M tokens",
    }, save=not args.no_save)


if __name__ == "__main__":
    main()
