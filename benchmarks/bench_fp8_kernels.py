"""The CPU FP8 linear kernels at the matmul shapes of real models, side by side in one run.

``system.rollout.fp8_kernels.probe_fp8_matmul`` (what every rollout worker runs at engine start, at
its own model's shape) times one BF16 matmul and the FP8 product three ways: vLLM's channel-wise
kernel (scalar scales in ``torch._scaled_mm``, then the rescale), aisrl's row-wise kernel (scales
fused into ``torch._scaled_mm``) and aisrl's upcast kernel (the FP8 operands widened to BF16, the
product on the BF16 matmul path, then the scales). One intra-op thread, as vLLM runs on CPU.

Shapes: the MLP up-projection ``[m, hidden] x [hidden, intermediate]`` of the tiny default model,
Qwen2.5-0.5B and Qwen2.5-1.5B, at ``m`` = 16 rows (decode with a few sequences) and 256 (a batch).
Each row records the ``auto`` decision and every kernel's speed relative to BF16 (bf16_ms / kernel_ms).

Rerun: ``.venv/bin/python benchmarks/bench_fp8_kernels.py`` (about 30 s on a 2-core AMD EPYC).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import emit, result_tag  # noqa: E402

from system.config.rollout import KERNELS  # noqa: E402
from system.models.warm_start import single_thread  # noqa: E402
from system.rollout.fp8_kernels import choose_fp8_kernel, cpu_identity, probe_fp8_matmul  # noqa: E402

MODELS = {"tiny default": (64, 256), "Qwen2.5-0.5B": (896, 4864), "Qwen2.5-1.5B": (1536, 8960)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", type=result_tag, default="", help="suffix of the result's name (e.g. _amx)")
    args = parser.parse_args()
    rows = []
    with single_thread():
        for model, (hidden, intermediate) in MODELS.items():
            for m in (16, 256):
                probe = probe_fp8_matmul(m, hidden, intermediate)
                decision = choose_fp8_kernel("auto", probe)
                speed = {k: round(probe.bf16_ms / probe.kernel_ms(k), 3) for k in KERNELS}
                rows.append({"model": model, "m": m, "k": hidden, "n": intermediate, "bf16_ms": probe.bf16_ms,
                             **{f"{k}_ms": probe.kernel_ms(k) for k in KERNELS},
                             "speed_vs_bf16": speed, "auto": decision.kernel})
                print(f"{model:13s} m={m:4d}: bf16 {probe.bf16_ms:8.3f} ms | "
                      + " | ".join(f"{k} {probe.kernel_ms(k):8.3f} ms ({speed[k]:.2f}x)" for k in KERNELS)
                      + f" | auto: {decision.kernel}", file=sys.stderr)
    cpu = cpu_identity()
    emit(f"fp8_kernels_cpu{args.tag}", {"cpu_identity": cpu, "cpu_has_amx": "amx_tile" in cpu, "threads": 1, "rows": rows})


if __name__ == "__main__":
    main()
