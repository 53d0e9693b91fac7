"""Correction core throughput: all section 1 diagnostics + the default method (seq-mis) per batch.

Side by side in one run, per batch size (64k to 4M tokens): the memory floor (reading the
three input arrays once), aisrl's core, and a straightforward per-metric implementation
(``naive_diagnostics``). Reports tokens/s and the two ratios. Run: ``make bench``.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import emit, time_median  # noqa: E402
from naive_diagnostics import all_metrics  # noqa: E402

from system.config.correction import SeqMIS  # noqa: E402
from system.correction import compute_diagnostics, compute_log_ratios, compute_weights, method_statistics  # noqa: E402

SEQ_LEN = 1024


def make_batch(num_tokens: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = num_tokens // SEQ_LEN
    mu = -torch.empty(b, SEQ_LEN).exponential_(1.0, generator=g)
    old = mu + 0.05 * torch.randn(b, SEQ_LEN, generator=g)
    lengths = torch.randint(SEQ_LEN // 2, SEQ_LEN + 1, (b,), generator=g)
    mask = torch.arange(SEQ_LEN)[None, :] < lengths[:, None]
    return mu.to(device), old.to(device), mask.to(device)


def ours(mu, old, mask):
    ratios = compute_log_ratios(mu, old, mask)
    diag = compute_diagnostics(ratios)
    w = compute_weights(ratios, SeqMIS())
    return diag, method_statistics(ratios, w)


def floor(mu, old, mask):
    return mu.sum(), old.sum(), mask.sum()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="65536,262144,1048576,4194304")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    rows = []
    for n in map(int, args.sizes.split(",")):
        mu, old, mask = make_batch(n, args.device)
        valid = int(mask.sum())
        t_floor = time_median(lambda: floor(mu, old, mask), args.repeats, sync=sync)
        t_ours = time_median(lambda: ours(mu, old, mask), args.repeats, sync=sync)
        t_naive = time_median(lambda: all_metrics(mu, old, mask), max(2, args.repeats // 2), sync=sync)
        rows.append({
            "tokens": n, "valid_tokens": valid, "floor_s": t_floor, "ours_s": t_ours, "naive_s": t_naive,
            "ours_tokens_per_s": n / t_ours, "ours_over_floor": t_ours / t_floor,
            "naive_over_ours": t_naive / t_ours,
        })
        print(f"{n:>8} tokens: floor {t_floor*1e3:7.2f} ms  ours {t_ours*1e3:8.2f} ms "
              f"({t_ours/t_floor:5.1f}x floor)  naive {t_naive*1e3:8.2f} ms ({t_naive/t_ours:4.1f}x ours)",
              file=sys.stderr)
    emit(f"correction_core_{args.device}", {"device": args.device, "seq_len": SEQ_LEN, "rows": rows,
                                             "goal": "ours_over_floor < 20, naive_over_ours several x"})


if __name__ == "__main__":
    main()
