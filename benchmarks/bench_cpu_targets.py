"""Issue 9's CPU targets on this machine, in one run: FP8 rollouts at >= 0.5x of BF16 and the default
run within 2x of the AMD EPYC reference.

Runs, each in its own process (every vLLM engine of a process shares vLLM's global state):

1. ``bench_fp8_kernels.py``: the FP8 kernels per matmul at the tiny, 0.5B and 1.5B MLP shapes;
2. ``bench_vllm_precision.py``: whole rollouts of the tiny default, BF16 and FP8 with each kernel, and
   the ``auto`` decision of this CPU;
3. ``bench_default_run.py``: ``aisrl train`` with no arguments (the ``make demo`` run).

The reference is ``results/default_run_cpu_amd.json`` (the default run on the 2-core AMD EPYC the
README cites), read before anything runs. Each result is named for this kind of CPU (``_amx`` on a
CPU with AMX, ``_<vendor>`` otherwise) and, by default, marked as a check:
``fp8_kernels_cpu_amd_check.json``, ``vllm_precision_cpu_amd_check.json``,
``default_run_cpu_amd_check.json`` and the summary ``cpu_targets_amd_check.json`` (git ignores
``results/*_check.json``), so a check never replaces the results the READMEs cite. ``--record``
writes the plain names (``fp8_kernels_cpu_amx.json``, ..., ``cpu_targets_amx.json``): what a session
recording a kind of CPU's figures for the README runs. A sub-benchmark that fails stops the check
(its exit status and the end of its stderr are printed; exit 1, no summary written). The last line
is the summary: every target with its value, the reference and ``met``.
Rerun: ``make cpu-check`` (1 min 40 s on the 2-core AMD EPYC, 5 min 30 s on a 2-core Intel Xeon with AMX, model cached).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from harness import RESULTS, emit  # noqa: E402

REFERENCE = RESULTS / "default_run_cpu_amd.json"
"""The default run on the 2-core AMD EPYC the README's figures come from."""
STDERR_LINES = 40
"""How much of a failed sub-benchmark's stderr is shown."""


def cpu_tag() -> str:
    """``_amx`` on a CPU with AMX, else ``_amd`` / ``_intel`` / ``_x86`` by the model name."""
    from system.rollout.fp8_kernels import cpu_identity

    cpu = cpu_identity()
    if "amx_tile" in cpu:
        return "_amx"
    return "_amd" if "AMD" in cpu else "_intel" if "Intel" in cpu else "_x86"


def suffix(tag: str, record: bool) -> str:
    """The suffix of every result name: the CPU's tag, plus ``_check`` unless the run records."""
    return tag if record else f"{tag}_check"


def plan(tag: str, record: bool) -> list[tuple[str, list[str], str]]:
    """(script, its arguments, the name of the result it writes), in the order they run."""
    s = suffix(tag, record)
    return [("bench_fp8_kernels.py", ["--tag", s], f"fp8_kernels_cpu{s}"),
            ("bench_vllm_precision.py", ["--tag", s], f"vllm_precision_cpu{s}"),
            ("bench_default_run.py", ["--name", f"default_run_cpu{s}"], f"default_run_cpu{s}")]


def summary_name(tag: str, record: bool) -> str:
    return f"cpu_targets{suffix(tag, record)}"


def read_reference(path: Path | None = None) -> dict:
    """The reference run's result (``REFERENCE`` by default); exits with a message when it is missing or has no
    steps per minute."""
    path = REFERENCE if path is None else path
    try:
        reference = json.loads(path.read_text())
        float(reference["steps_per_minute"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"the reference {path} cannot be used ({type(exc).__name__}: {exc}); it is the committed "
                         "default run on the AMD EPYC (git checkout it)") from None
    return reference


def failed(script: str, why: str, stderr: str) -> None:
    """Say which sub-benchmark failed and why, with the end of its stderr, and exit 1."""
    tail = stderr.rstrip("\n").splitlines()[-STDERR_LINES:]
    print(f"{script} {why}; the last {len(tail)} lines of its stderr:", *(f"  {line}" for line in tail),
          f"cpu-check stopped: {script} failed", sep="\n", file=sys.stderr)
    sys.exit(1)


def run(script: str, args: list[str], name: str) -> dict:
    """Run a benchmark script; its last stdout line is its JSON result, which must be named ``name``."""
    out = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True)
    if out.returncode != 0:
        status = f"killed by signal {-out.returncode}" if out.returncode < 0 else f"exit status {out.returncode}"
        failed(script, f"failed ({status})", out.stderr)
    lines = out.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        failed(script, "printed no JSON result as its last line", out.stderr)
    if result.get("benchmark") != name:
        failed(script, f"wrote {result.get('benchmark')!r}, not {name!r}", out.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true",
                        help="write the results under their plain names (e.g. default_run_cpu_amx.json, what the "
                             "READMEs cite) instead of *_check.json")
    args = parser.parse_args()
    reference = read_reference()  # before anything runs: on an AMD EPYC --record rewrites this very file
    tag = cpu_tag()
    kernels, precision, default = (run(script, script_args, name)
                                   for script, script_args, name in plan(tag, args.record))
    fp8 = precision["fp8_auto_over_bf16_throughput"]
    speed = default["steps_per_minute"] / reference["steps_per_minute"]
    targets = {
        "fp8_auto_over_bf16_rollout_tokens_per_s": {"value": fp8, "target": ">= 0.5", "met": fp8 >= 0.5},
        "default_run_steps_per_minute_over_amd_reference": {
            "value": speed, "target": ">= 0.5 (within 2x)", "met": speed >= 0.5,
            "steps_per_minute": default["steps_per_minute"], "reference": reference["steps_per_minute"],
            "reference_file": REFERENCE.name, "reference_commit": reference.get("commit"),
            "reference_processor": reference.get("processor")},
    }
    for name, t in targets.items():
        print(f"{name}: {t['value']:.3f} (target {t['target']}): {'met' if t['met'] else 'MISSED'}", file=sys.stderr)
    emit(summary_name(tag, args.record), {
        "targets": targets, "auto_fp8_kernel": precision["auto_fp8_kernel"]["kernel"],
        "cpu_has_amx": precision["cpu_has_amx"],
        "fp8_kernel_speed_vs_bf16": {f"{r['model']} m={r['m']}": r["speed_vs_bf16"] for r in kernels["rows"]},
        "rollout_tokens_per_s": {k: v["tokens_per_s"] for k, v in precision["rows"].items()},
        "default_run": {k: default[k] for k in ("wall_seconds_incl_startup", "steps_per_minute", "reward_first_10",
                                                "reward_last_10", "kl_k1_median")},
    })


if __name__ == "__main__":
    main()
