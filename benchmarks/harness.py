"""Benchmark plumbing: environment facts, a warm-up-then-median timer, and the one-JSON-line result."""

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from system.cpu_info import cpuinfo_fields

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict:
    import numpy
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "commit": commit, "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "processor": _cpu_model(), "python": platform.python_version(), "torch": torch.__version__,
        "numpy": numpy.__version__, "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _cpu_model() -> str:
    return cpuinfo_fields().get("model name") or platform.processor()


def time_median(fn: Callable[[], object], repeats: int = 7, warmup: int = 2, sync: Callable[[], None] | None = None) -> float:
    """Median wall seconds of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(name: str, result: dict, save: bool = True) -> None:
    """Print the result as the last line (one JSON object) and keep it under ``benchmarks/results/``."""
    record = {"benchmark": name, **environment(), **result}
    line = json.dumps(record)
    if save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(line)
