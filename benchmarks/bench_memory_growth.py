"""Memory over a long run: does any role's private memory keep growing?

Runs ``aisrl train`` (the real stack: vLLM FP8 rollout worker, FSDP2 learner ranks, correction
service, private loopback Ray cluster) for ``--steps`` steps and samples, every ``--every`` seconds,
each actor process of the run (Ray titles them ``ray::RolloutWorker...``, ``ray::LearnerRank...``,
``ray::CorrectionService...``) and the driver:

* ``uss_mb``: private memory (pages no other process maps; the object store's shared pages and the
  libraries' mapped files are not counted, so reading weights out of the object store does not count);
* ``heap_mb``: the resident part of the glibc ``[heap]`` mapping (small and medium allocations;
  growth that slows and levels is allocator fragmentation, growth that stays linear a leak).

The result gives, per role, the samples and the growth per 100 steps over each quarter of the run
(steps 0-25 %, 25-50 %, ...): a leak shows as a last quarter that grows as fast as the second.

    python benchmarks/bench_memory_growth.py [--steps 1500] [--every 10] [override ...]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import emit, positive_int, result_name  # noqa: E402

from system.config import ConfigError, resolve_config  # noqa: E402

ROLES = ("RolloutWorker", "LearnerRank", "CorrectionService")
ROOT = Path(__file__).resolve().parents[1]


def heap_mb(pid: int) -> float | None:
    """Resident MiB of the process's ``[heap]`` mapping (None: unreadable or absent)."""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return None
    match = re.search(r"\[heap\]\n(?:.*\n)*?Rss:\s+(\d+) kB", text)
    return int(match.group(1)) / 1024 if match else None


def role_of(proc: psutil.Process, driver: int) -> str | None:
    if proc.pid == driver:
        return "driver"
    try:
        title = " ".join(proc.cmdline())
    except psutil.Error:
        return None
    return next((r for r in ROLES if f"ray::{r}" in title), None)


def sample(driver: psutil.Process) -> dict[str, dict]:
    """``{role#pid: {uss_mb, heap_mb}}`` for the driver and every actor process below it."""
    out = {}
    try:
        procs = [driver, *driver.children(recursive=True)]
    except psutil.Error:
        return out
    for proc in procs:
        role = role_of(proc, driver.pid)
        if role is None:
            continue
        try:
            uss = proc.memory_full_info().uss / 2**20
        except psutil.Error:
            continue
        out[f"{role}#{proc.pid}"] = {"uss_mb": round(uss, 1), "heap_mb": heap_mb(proc.pid)}
    return out


def steps_done(run_dir: Path) -> int:
    try:
        return sum(1 for _ in (run_dir / "metrics.jsonl").open())
    except OSError:
        return 0


def quarter_growth(series: list[tuple[int, float]], steps: int) -> list[float | None]:
    """MiB per 100 steps over each quarter of ``steps``: the first sample at or after the quarter's start
    to the last before its end (None when a quarter holds fewer than two samples)."""
    out = []
    for q in range(4):
        lo, hi = q * steps / 4, (q + 1) * steps / 4
        inside = [(s, v) for s, v in series if lo <= s <= hi and v is not None]
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            out.append(None)
            continue
        (s0, v0), (s1, v1) = inside[0], inside[-1]
        out.append(round((v1 - v0) / (s1 - s0) * 100, 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=1500)
    parser.add_argument("--every", type=positive_int, default=10, help="seconds between samples")
    parser.add_argument("--name", type=result_name, default="memory_growth_cpu")
    parser.add_argument("overrides", nargs="*", help="config overrides for the run (dotted, as aisrl train)")
    args = parser.parse_args()
    fixed = [f"max_steps={args.steps}", "checkpoint_every=0", "report.wandb.mode=disabled"]
    try:  # a bad override is said here, before a run starts
        resolve_config(overrides=[*fixed, *args.overrides])
    except ConfigError as exc:
        parser.error(f"overrides: {exc}")

    run_dir = Path(tempfile.mkdtemp(prefix="aisrl-memory-")) / "run"
    cmd = [sys.executable, "-m", "actors.cli", "train", f"output_dir={run_dir}", *fixed, *args.overrides]
    started = time.monotonic()
    log = run_dir.parent / "train.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        driver = psutil.Process(proc.pid)
        samples = []
        while proc.poll() is None:
            time.sleep(args.every)
            step, memory = steps_done(run_dir), sample(driver)
            if memory and step < args.steps:  # while it trains (the shutdown's exiting processes read 0)
                samples.append({"t": round(time.monotonic() - started, 1), "step": step, "memory": memory})
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    if proc.returncode != 0:
        sys.exit(f"the run failed (exit {proc.returncode}); its log: {log}")

    roles: dict[str, list[tuple[int, float, float | None]]] = {}
    for s in samples:
        for key, m in s["memory"].items():
            roles.setdefault(key, []).append((s["step"], m["uss_mb"], m["heap_mb"]))
    summary = {}
    for key, series in sorted(roles.items()):
        trained = [row for row in series if row[0] > 0]  # from the first step on (start-up is not growth)
        summary[key] = {
            "uss_mb_first_last": [trained[0][1], trained[-1][1]] if trained else None,
            "heap_mb_first_last": [trained[0][2], trained[-1][2]] if trained else None,
            "uss_mb_per_100_steps_by_quarter": quarter_growth([(r[0], r[1]) for r in trained], args.steps),
            "heap_mb_per_100_steps_by_quarter": quarter_growth([(r[0], r[2]) for r in trained], args.steps),
        }
    emit(args.name, {"steps": args.steps, "overrides": args.overrides, "wall_seconds": round(time.monotonic() - started, 1),
                     "roles": summary, "samples": samples})
    os.remove(log)


if __name__ == "__main__":
    main()
