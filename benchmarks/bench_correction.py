"""Correction core throughput: all section 1 diagnostics + the default method (seq-mis) per batch.

Side by side in one run, per batch size (64k to 4M tokens): the memory floor (reading the
three input arrays once: ``behaviour.sum(), proximal.sum(), mask.sum()``, the issue's definition; and
the "read floor", the same with ``count_nonzero(mask)``, which allocates nothing), aisrl's
core, and a straightforward per-metric implementation (``naive_diagnostics``), each timed as
the median of ``--repeats`` calls after 2 warm-up calls (``harness.time_median``), on
``--threads`` torch threads (the fused pass splits its rows among as many, ``fused.pass_threads``):
default 1, which times steadily on a shared machine; results of more threads are kept as
``correction_core_cpu_<n>threads.json``. Reports tokens/s and the ratios.
Run: ``make bench``; see ``benchmarks/README.md``.
"""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import emit, int_list, positive_int, result_tag, time_median  # noqa: E402
from naive_diagnostics import all_metrics  # noqa: E402

from system.config.correction import SeqMIS  # noqa: E402
from system.correction import (  # noqa: E402
    compute_diagnostics,
    compute_log_ratios,
    compute_weights,
    fused,  # noqa: E402
    method_statistics,
)

SEQ_LEN = 1024
SIZES = int_list(minimum=SEQ_LEN, multiple=SEQ_LEN, what="size (tokens)")
"""``--sizes``: a batch is ``tokens // SEQ_LEN`` whole rows, so below one row it is empty (nothing to time, and
every ratio divides by zero) and between multiples the rows hold fewer tokens than the reported ``tokens``."""


def make_batch(num_tokens: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = num_tokens // SEQ_LEN
    behaviour = -torch.empty(b, SEQ_LEN).exponential_(1.0, generator=g)
    proximal = behaviour + 0.05 * torch.randn(b, SEQ_LEN, generator=g)
    lengths = torch.randint(SEQ_LEN // 2, SEQ_LEN + 1, (b,), generator=g)
    mask = torch.arange(SEQ_LEN)[None, :] < lengths[:, None]
    return behaviour.to(device), proximal.to(device), mask.to(device)


def ours(behaviour, proximal, mask):
    ratios = compute_log_ratios(behaviour, proximal, mask)
    diag = compute_diagnostics(ratios)
    w = compute_weights(ratios, SeqMIS())
    return diag, method_statistics(ratios, w)


def ours_fused(behaviour, proximal, mask):
    """The same outputs from the fused pass (``system.correction.fused``; CPU only)."""
    return fused.full_path(behaviour, proximal, mask, SeqMIS())


def floor(behaviour, proximal, mask):
    return behaviour.sum(), proximal.sum(), mask.sum()


def read_floor(behaviour, proximal, mask):
    """The floor without ``mask.sum()``'s int64 temporary (page faults past glibc's mmap threshold)."""
    return behaviour.sum(), proximal.sum(), torch.count_nonzero(mask)


def time_floors_and_ours(batch, repeats: int, sync) -> dict:
    """Median seconds of the two floors and of ours on one batch."""
    # Default arguments bind this batch, not the loop variable at call time (B023).
    paths = [("floor", floor), ("read_floor", read_floor), ("ours", ours)]
    if batch[0].device.type == "cpu" and fused.available():
        paths.append(("fused", ours_fused))
    return {
        f"{name}_s": time_median(lambda fn=fn, batch=batch: fn(*batch), repeats, sync=sync)
        for name, fn in paths
    }


def with_ratios(n: int, batch, row: dict) -> dict:
    out = {
        "tokens": n, "valid_tokens": int(batch[2].sum()), **row,
        "ours_tokens_per_s": n / row["ours_s"], "ours_over_floor": row["ours_s"] / row["floor_s"],
        "ours_over_read_floor": row["ours_s"] / row["read_floor_s"],
        "naive_over_ours": row["naive_s"] / row["ours_s"],
    }  # fmt: skip
    if "fused_s" in row:
        out.update(fused_over_floor=row["fused_s"] / row["floor_s"],
                   fused_over_read_floor=row["fused_s"] / row["read_floor_s"], ours_over_fused=row["ours_s"] / row["fused_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=SIZES, default="65536,262144,1048576,4194304",
                        help=f"comma-separated tokens per batch, each a multiple of {SEQ_LEN} (whole rows)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=positive_int, default=9)
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch.set_num_threads (the fused pass follows it: fused.pass_threads)")
    parser.add_argument("--tag", type=result_tag, default="", help="suffix of the result's name (e.g. _amx)")
    parser.add_argument("--no-save", action="store_true", help="print the JSON line only")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, but sees no GPU"
        parser.error(f"argument --device: CUDA is not available (torch {torch.__version__} is {why})")
    torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    batches = {n: make_batch(n, args.device) for n in args.sizes}
    timings = {n: time_floors_and_ours(batch, args.repeats, sync) for n, batch in batches.items()}
    # The naive version last: its gigabytes of temporaries leave the allocator in a state
    # where the floor's mask.sum() temporary costs 3x more.
    for n, batch in batches.items():
        naive_calls = max(2, args.repeats // 2)
        timings[n]["naive_s"] = time_median(
            lambda batch=batch: all_metrics(*batch), naive_calls, sync=sync
        )
    rows = [with_ratios(n, batches[n], timings[n]) for n in batches]
    for row in rows:
        print(
            f"{row['tokens']:>8} tokens: floor {row['floor_s'] * 1e3:7.2f} ms "
            f"(read {row['read_floor_s'] * 1e3:6.2f})  ours {row['ours_s'] * 1e3:8.2f} ms "
            f"({row['ours_over_floor']:5.1f}x floor, {row['ours_over_read_floor']:5.1f}x read)  "
            f"naive {row['naive_s'] * 1e3:8.2f} ms ({row['naive_over_ours']:4.1f}x ours)"
            + (f"  fused {row['fused_s'] * 1e3:7.2f} ms ({row['fused_over_floor']:5.1f}x floor, "
               f"{row['fused_over_read_floor']:5.1f}x read)" if "fused_s" in row else ""),
            file=sys.stderr,
        )
    # one thread: correction_core_<device>.json; more: correction_core_<device>_<n>threads.json
    emit(f"correction_core_{args.device}" + (f"_{args.threads}threads" if args.threads != 1 else "") + args.tag, {
        "device": args.device, "seq_len": SEQ_LEN, "threads": args.threads,
        "load_average": os.getloadavg(),
        "timing": "median wall time of --repeats calls after 2 warm-up calls (naive: half as many)",
        "fused_available": fused.available(),
        "rows": rows, "goal": "fused (or ours) over floor <= 20, naive_over_ours several x",
    }, save=not args.no_save)  # fmt: skip


if __name__ == "__main__":
    main()
