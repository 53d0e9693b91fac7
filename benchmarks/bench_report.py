"""Mismatch report scaling: wall time and peak memory of ``aisrl report`` at 64k, 1M and 10M tokens.

For each size, a synthetic dump (``N`` responses x ``T = 1024`` tokens, every token valid:
the worst case for the report; ``behaviour = -Exp(1)``, ``proximal = min(behaviour + sigma (1 + lag) N(0, 1),
0)`` with 1 % heavy outliers, ``token_text``, ``uid``, ``reward``, ``lag`` 0..2 and texts
filled) is written once, then the real command runs once in a fresh interpreter
(``python bench_report.py --child DUMP OUT`` calls the typer app as ``aisrl report`` does).
Reported per size: ``seconds`` (the whole command: interpreter start, imports, report),
``import_seconds`` (the CLI and the report's modules: Ray, torch, ... the same for any size)
and ``report_seconds`` (the command itself), both measured inside the child, ``peak_mb`` (the
child's maximum resident set size, from ``os.wait4``) and the sizes of the files written.
One run per size, not a timed test: on a shared machine the numbers move with the load,
which is recorded (``loadavg_before``).

Run: ``.venv/bin/python benchmarks/bench_report.py [--sizes 64k,1M,10M]``; the last line of
output is the JSON record, also kept in ``benchmarks/results/report_scaling_cpu.json``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

SIZES = {"64k": 64, "1M": 1024, "10M": 10240}
"""Responses per size; every response has T = 1024 tokens."""
LENGTH = 1024
_VOCAB = np.array(list("0123456789+=") + ["<eos>"])


def make_dump(path: Path, n: int, t: int = LENGTH, sigma: float = 0.1, seed: int = 0) -> None:
    """A section 6 dump of ``n x t`` valid tokens with every optional key."""
    from system.report.dump import BEHAVIOUR_KEY, MASK_KEY, PROXIMAL_KEY, save_dump

    rng = np.random.default_rng(seed)
    lag = rng.integers(0, 3, size=n).astype(np.int32)
    behaviour = -rng.exponential(1.0, size=(n, t)).astype(np.float32)
    noise = rng.standard_normal((n, t), dtype=np.float32) * np.float32(sigma) * (1 + lag[:, None]).astype(np.float32)
    outliers = rng.random((n, t), dtype=np.float32) < 0.01
    noise += outliers * rng.normal(0.0, 2.0, size=(n, t)).astype(np.float32)
    proximal = np.minimum(behaviour + noise, 0.0).astype(np.float32)
    del noise, outliers
    ids = rng.integers(0, len(_VOCAB), size=(n, t)).astype(np.int32)
    save_dump(
        path,
        **{BEHAVIOUR_KEY: behaviour, PROXIMAL_KEY: proximal, MASK_KEY: np.ones((n, t), bool)}, response_ids=ids,
        token_text=_VOCAB[ids], lag=lag, reward=rng.random(n).astype(np.float32),
        uid=np.array([f"p{i // 8}#{i % 8}" for i in range(n)]),
        prompt_text=np.array([f"{10 + i // 8}+{20 + i // 8}=" for i in range(n)]),
        response_text=np.array(["".join(row[:16]) for row in _VOCAB[ids[:, :16]]]),
    )


def child(dump: str, out: str) -> None:
    """Inside the measured interpreter: the CLI's report command, timed in two parts."""
    t0 = time.perf_counter()
    from actors.cli import app
    from system.report import mismatch_report  # noqa: F401  (the command's lazy import, timed here)

    t1 = time.perf_counter()
    app(["report", dump, "--out", out, "--overwrite"], standalone_mode=False)
    t2 = time.perf_counter()
    print(json.dumps({"import_seconds": t1 - t0, "report_seconds": t2 - t1}))


def measure(dump: Path, out: Path) -> dict:
    """One run of the report in a fresh interpreter: wall seconds, peak RSS and the child's own split."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(dump), str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"report failed on {dump} (exit {proc.returncode})")
    split = json.loads(stdout.strip().splitlines()[-1])
    return {
        "seconds": round(seconds, 3),
        "import_seconds": round(split["import_seconds"], 3),
        "report_seconds": round(split["report_seconds"], 3),
        "peak_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: kilobytes
        **{f"{name.replace('.', '_')}_mb": round((out / name).stat().st_size / 2**20, 2)
           for name in ("summary.json", "samples.json", "report.html")},
    }


def main() -> None:
    from harness import choice_list, result_tag

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=choice_list(SIZES), default=",".join(SIZES),
                        help="Comma-separated subset of 64k,1M,10M.")
    parser.add_argument("--child", nargs=2, metavar=("DUMP", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--tag", type=result_tag, default="", help="Suffix of the result's name (e.g. _amx).")
    parser.add_argument("--no-save", action="store_true", help="Print the record without writing results/.")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from harness import emit

    from system.report.mismatch_report import REPORT_THREADS

    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_report_") as tmp:
        for size in args.sizes:
            n = SIZES[size]
            dump = Path(tmp) / f"dump_{size}.npz"
            t0 = time.perf_counter()
            make_dump(dump, n)
            write_s = time.perf_counter() - t0
            load = os.getloadavg()
            result = measure(dump, Path(tmp) / f"report_{size}")
            runs.append({"size": size, "tokens": n * LENGTH, "sequences": n, "length": LENGTH,
                         "dump_mb": round(dump.stat().st_size / 2**20, 1), "dump_write_seconds": round(write_s, 1),
                         "loadavg_before": [round(v, 2) for v in load], **result})
            print(json.dumps(runs[-1]), file=sys.stderr)
            dump.unlink()
    emit(f"report_scaling_cpu{args.tag}", {"report_torch_threads": REPORT_THREADS, "runs": runs,
                                "targets": {"1M": {"seconds": 3.0, "peak_mb": 500}}},
         save=not args.no_save)


if __name__ == "__main__":
    main()
