"""``benchmarks/gpu_check.sh`` (the one-call device check) runs its parts at CPU smoke sizes here, so
a GPU session finds it working; its GPU sizes run only there."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_smoke_runs_every_part_without_ray_vllm_or_wandb(tmp_path):
    # the GPU machine has torch and CUDA but no Ray, vLLM or W&B: make their imports fail here too
    absent = tmp_path / "absent"
    for name in ("ray", "vllm", "wandb"):
        (absent / name).mkdir(parents=True)
        (absent / name / "__init__.py").write_text(f"raise ImportError('{name} is absent on the GPU machine')\n")
    env = {**os.environ, "GPU_CHECK_SMOKE": "1", "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(absent), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    for part in ("tests", "correction", "learner tiny"):
        assert f"== {part}: rc 0" in proc.stdout
    results = {r["benchmark"]: r for r in map(json.loads, (out / "summary.jsonl").read_text().splitlines())}
    learner = results["learner_step_cpu_tiny"]
    # tiny Qwen2 (vocab 2048, d 128, MLP 384, 4 layers, 4 heads / 2 kv heads of 32, tied head):
    # matmul weights per layer 128*128*2 + 128*64*2 + 3*128*384 = 196608, x4, + head 2048*128
    assert learner["matmul_parameters"] == 4 * 196608 + 2048 * 128
    # exported bf16: embedding 262144 + layers 4 * (196608 + biases 256 + norms 256) + norm 128,
    # plus the tied head written out for vLLM (262144): 2 bytes each
    assert learner["export_bytes"] == 2 * (262144 + 4 * (196608 + 256 + 256) + 128 + 262144)
    assert learner["batch"]["tokens"] == 2 * 2 * (16 + 32)
    assert learner["mfu"] is None and learner["tokens_per_s"] > 0
    assert results["correction_core_cpu"]["rows"][0]["tokens"] == 65536
    # the smoke run keeps nothing under benchmarks/results
    assert not any(p.name.startswith("learner_step_cpu_tiny") for p in (ROOT / "benchmarks" / "results").iterdir())
