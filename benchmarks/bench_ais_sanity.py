"""AIS version 2 applied offline to the batch dumps of real default runs (issue 11's sanity target).

For each dump (GRPO advantages as the run used them, ``advantage`` key), the v2 rule's
``bias``, ``noise`` and ``alpha_raw`` for the default method (seq-mis, hi = 3) are computed
on the lag-0 sequences and on the lag-1 sequences separately (``estimate_alpha`` with the rows
of one lag), and on the whole batch. The expectation from the issue: about 0 on lag 0 (FP8
alone behaves like noise) and high (0.76-0.87 in the issue's offline check) on lag 1 of most
steps (staleness: the update moved probability toward high-advantage answers, a bias). What
comes out is reported as it is.

    .venv/bin/python benchmarks/bench_ais_sanity.py RUN_DIR [RUN_DIR ...]

writes ``results/ais_sanity_cpu.json`` (one row per dump and a summary, JSON last line; ``--name`` for another
name). A RUN_DIR that does not exist or holds no ``dumps/step_*.npz`` is refused before anything is written.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import emit, result_name  # noqa: E402

from system.config.correction import SeqMIS  # noqa: E402
from system.correction import compute_log_ratios, compute_weights_and_keep  # noqa: E402
from system.correction.ais import estimate_alpha  # noqa: E402
from system.report.dump import load_dump  # noqa: E402


def run_with_dumps(text: str) -> Path:
    """An ``argparse`` type: a run directory holding at least one ``dumps/step_*.npz``."""
    run = Path(text)
    if not run.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such run directory")
    if not any((run / "dumps").glob("step_*.npz")):
        raise argparse.ArgumentTypeError(f"{text}: holds no dumps/step_*.npz (a run writes them every "
                                         "report.dump_every steps; 0 writes none)")
    return run


def rows_of(path: Path) -> dict:
    dump = load_dump(path)
    if dump.advantage is None:
        raise SystemExit(f"{path}: no 'advantage' key (dumps written before AIS v2); re-run to get one")
    ratios = compute_log_ratios(torch.tensor(dump.behaviour_BT), torch.tensor(dump.proximal_BT),
                                torch.tensor(dump.mask_BT))
    w_BT, keep_BT = compute_weights_and_keep(ratios, SeqMIS(hi=3.0))
    adv = torch.tensor(dump.advantage, dtype=torch.float64)
    lag = torch.tensor(dump.lag)
    row = {"dump": f"{path.parent.parent.name}/{path.name}", "n": int(ratios.num_sequences),
           "all": estimate_alpha(ratios, w_BT, keep_BT, adv)}
    for value in sorted(set(lag.tolist())):
        rows = lag == value
        row[f"lag{value}"] = {**estimate_alpha(ratios, w_BT, keep_BT, adv, rows_B=rows), "n": int(rows.sum())}
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=run_with_dumps, metavar="RUN_DIR",
                        help="run directories with dumps/step_*.npz")
    parser.add_argument("--name", type=result_name, default="ais_sanity_cpu")
    args = parser.parse_args()
    dumps = sorted(p for run in args.runs for p in (run / "dumps").glob("step_*.npz"))
    rows = [rows_of(p) for p in dumps]
    summary = {}
    for key in ("lag0", "lag1", "all"):
        vals = [r[key]["alpha_raw"] for r in rows if key in r and r[key]["alpha_raw"] is not None]
        if vals:
            summary[key] = {"dumps": len(vals), "alpha_raw_median": float(np.median(vals)),
                            "alpha_raw_mean": float(np.mean(vals)), "frac_above_0.5": float(np.mean(np.array(vals) > 0.5)),
                            "frac_zero": float(np.mean(np.array(vals) == 0.0))}
    for key, s in summary.items():
        print(f"{key}: {s}", file=sys.stderr)
    emit(args.name, {"method": "seq-mis hi=3", "runs": [str(r.name) for r in args.runs], "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
