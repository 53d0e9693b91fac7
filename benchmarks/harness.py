"""Benchmark plumbing: environment facts, a warm-up-then-median timer, the one-JSON-line result, and the
``argparse`` types the scripts check their arguments with (before anything is measured)."""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
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
    """Print the result as the last line (one JSON object) and keep it under ``benchmarks/results/``,
    unless it has ``rows`` and they are empty (nothing was measured: the last measured result stays)."""
    record = {"benchmark": name, **environment(), **result}
    line = json.dumps(record)
    if save and result.get("rows", True) in ([], {}):
        print(f"{name}: nothing measured (no rows); results/{name}.json is not written", file=sys.stderr)
        save = False
    if save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(line)


# --- argument types: each raises argparse.ArgumentTypeError, which argparse reports as
# "error: argument --x: <message>" with exit status 2, before the script measures anything.

MAX_NAME_BYTES = 200
"""Longest result name or tag: ``<name>.partial.json`` and the like must stay within a file name's 255 bytes."""


def _integer(text: str, minimum: int, maximum: int | None, wanted: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
    return value


def int_range(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An ``argparse`` type: an integer in ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
    wanted = f"an integer >= {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"

    def parse(text: str) -> int:
        return _integer(text, minimum, maximum, wanted)

    parse.__name__ = f"int_range({minimum}, {maximum})"
    return parse


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (a count that must not be zero)."""
    return _integer(text, 1, None, "a positive integer")


def nonnegative_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 0 (a count where 0 means none, e.g. warm-up steps)."""
    return _integer(text, 0, None, "a non-negative integer")


SEED = int_range(0, 2**32 - 1)
"""A run's seed, in the range ``RunConfig.seed`` accepts."""


def float_range(minimum: float, maximum: float | None = None, *, above: bool = False) -> Callable[[str], float]:
    """An ``argparse`` type: a finite float ``>= minimum`` (``> minimum`` with ``above``), at most ``maximum``."""
    low = f"> {minimum:g}" if above else f">= {minimum:g}"
    wanted = f"a finite number {low}" + ("" if maximum is None else f" and <= {maximum:g}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if (not math.isfinite(value) or value < minimum or (above and value == minimum)
                or (maximum is not None and value > maximum)):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    parse.__name__ = f"float_range({minimum}, {maximum})"
    return parse


_POSITIVE_FLOAT = float_range(0.0, above=True)


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite float > 0 (seconds, sizes, a peak rate)."""
    return _POSITIVE_FLOAT(text)


def int_list(minimum: int = 1, multiple: int = 1, what: str = "value") -> Callable[[str], list[int]]:
    """An ``argparse`` type: comma-separated integers, at least one, each ``>= minimum`` and a multiple of
    ``multiple`` (e.g. token counts made of whole 1024-token rows)."""
    rule = f"at least {minimum}" + (f" and a multiple of {multiple}" if multiple > 1 else "")

    def parse(text: str) -> list[int]:
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or "" in items:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers (each {rule}), got {text!r}")
        values = []
        for item in items:
            try:
                value = int(item)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{item!r} is not an integer (in {text!r})") from None
            if value < minimum or value % multiple:
                raise argparse.ArgumentTypeError(f"each {what} must be {rule}: got {value}")
            values.append(value)
        return values

    parse.__name__ = "int_list"
    return parse


def choice_list(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """An ``argparse`` type: a non-empty comma-separated subset of ``choices``, in the order given."""
    known = list(choices)

    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",")]
        unknown = [item for item in items if item not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, unknown))} in {text!r}: "
                                             f"expected a comma-separated subset of {','.join(known)}")
        return items

    parse.__name__ = "choice_list"
    return parse


def _file_name_part(text: str, what: str, where: str) -> str:
    """``text`` when it can be (part of) a file name in ``benchmarks/results/``: no '/', no NUL, short."""
    if "/" in text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{what} {where}; it must not contain '/' or a NUL character, got {text!r}")
    if len(text.encode()) > MAX_NAME_BYTES:
        raise argparse.ArgumentTypeError(f"{what} is at most {MAX_NAME_BYTES} bytes, got {len(text.encode())}")
    return text


def result_tag(text: str) -> str:
    """An ``argparse`` type: a suffix of a result's name (``fp8_kernels_cpu<tag>``), possibly empty, so it must not
    make the name a path."""
    return _file_name_part(text, "a result tag", "is appended to a file name in benchmarks/results/")


def result_name(text: str) -> str:
    """An ``argparse`` type: the name of a result, written as ``benchmarks/results/<name>.json``: a plain file name
    (not empty, no '/', not starting with '.')."""
    if not text:
        raise argparse.ArgumentTypeError("a result name must not be empty")
    if text.startswith("."):
        raise argparse.ArgumentTypeError(f"a result name must not start with '.' (a hidden file), got {text!r}")
    return _file_name_part(text, "a result name", "is a plain file name, written as benchmarks/results/<name>.json")
