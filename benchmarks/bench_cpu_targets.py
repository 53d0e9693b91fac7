"""Issue 9's CPU targets on this machine, in one run: FP8 rollouts at >= 0.5x of BF16 and the default
run within 2x of the AMD EPYC reference.

Runs, each in its own process (every vLLM engine of a process shares vLLM's global state):

1. ``bench_fp8_kernels.py``: the FP8 kernels per matmul at the tiny, 0.5B and 1.5B MLP shapes;
2. ``bench_vllm_precision.py``: whole rollouts of the tiny default, BF16 and FP8 with each kernel, and
   the ``auto`` decision of this CPU;
3. ``bench_default_run.py``: ``aisrl train`` with no arguments (the ``make demo`` run).

Each writes its own result named for this kind of CPU (``_amx`` on a CPU with AMX, ``_<vendor>``
otherwise), so a run on an Intel machine never overwrites the AMD results. The last line is the
summary: every target with its value, the reference and ``met``.
Rerun: ``make cpu-check`` (1 min 40 s on the 2-core AMD EPYC, model cached).
"""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from harness import RESULTS, emit  # noqa: E402

from system.rollout.fp8_kernels import cpu_identity  # noqa: E402

REFERENCE = RESULTS / "default_run_cpu.json"
"""The default run on the 2-core AMD EPYC the README's figures come from."""


def cpu_tag() -> str:
    """``_amx`` on a CPU with AMX, else ``_amd`` / ``_intel`` / ``_x86`` by the model name."""
    cpu = cpu_identity()
    if "amx_tile" in cpu:
        return "_amx"
    return "_amd" if "AMD" in cpu else "_intel" if "Intel" in cpu else "_x86"


def run(script: str, *args: str) -> dict:
    """Run a benchmark script; its last stdout line is its JSON result."""
    out = subprocess.run([sys.executable, str(HERE / script), *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    tag = cpu_tag()
    kernels = run("bench_fp8_kernels.py", "--tag", tag)
    precision = run("bench_vllm_precision.py", "--tag", tag)
    default = run("bench_default_run.py", "--name", f"default_run_cpu{tag}")
    reference = json.loads(REFERENCE.read_text())
    fp8 = precision["fp8_auto_over_bf16_throughput"]
    speed = default["steps_per_minute"] / reference["steps_per_minute"]
    targets = {
        "fp8_auto_over_bf16_rollout_tokens_per_s": {"value": fp8, "target": ">= 0.5", "met": fp8 >= 0.5},
        "default_run_steps_per_minute_over_amd_reference": {
            "value": speed, "target": ">= 0.5 (within 2x)", "met": speed >= 0.5,
            "steps_per_minute": default["steps_per_minute"], "reference": reference["steps_per_minute"],
            "reference_processor": reference.get("processor")},
    }
    for name, t in targets.items():
        print(f"{name}: {t['value']:.3f} (target {t['target']}): {'met' if t['met'] else 'MISSED'}", file=sys.stderr)
    emit(f"cpu_targets{tag}", {
        "targets": targets, "auto_fp8_kernel": precision["auto_fp8_kernel"]["kernel"],
        "cpu_has_amx": precision["cpu_has_amx"],
        "fp8_kernel_speed_vs_bf16": {f"{r['model']} m={r['m']}": r["speed_vs_bf16"] for r in kernels["rows"]},
        "rollout_tokens_per_s": {k: v["tokens_per_s"] for k, v in precision["rows"].items()},
        "default_run": {k: default[k] for k in ("wall_seconds_incl_startup", "steps_per_minute", "reward_first_10",
                                                "reward_last_10", "kl_k1_median")},
    })


if __name__ == "__main__":
    main()
