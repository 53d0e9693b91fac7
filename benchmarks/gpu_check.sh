#!/usr/bin/env bash
# The device check: every GPU measurement of the Ray-free core in one short run (expected ~4 min on
# one H100/H200; the parts' limits add up to 560 s, inside the device tool's 600 s a call), for a
# machine with torch and CUDA but no network, no Ray and no vLLM.
#
#   make gpu-wheels                      # here, once: pydantic's wheels for the GPU machine's Python
#   bash benchmarks/gpu_check.sh [OUT]   # there, from the repository root, carrying .whl/
#
# 1. tests/test_gpu_paths.py: the correction core on CUDA against the CPU (1e-10), a learner rank on
#    NCCL against the naive CPU reference;
# 2. bench_correction.py --device cuda: the correction core's full path against the memory floor;
# 3. bench_learner_step.py --size 0.5b and 1.5b: the learner's tokens/s, MFU and export GB/s.
# Results and one log go to OUT (default: $OUT, else /tmp/aisrl-gpu-check). Each part has its own
# time limit and a failed part does not stop the others; the exit code is the number that failed.
# GPU_CHECK_SMOKE=1 runs the same parts at CPU smoke sizes (what the CPU test suite checks).
set -u
out="${1:-${OUT:-/tmp/aisrl-gpu-check}}"
mkdir -p "$out"
log="$out/gpu_check.log"
py="${PYTHON:-python3}"
site=/tmp/aisrl-site
if ! "$py" -c "import pydantic" 2>/dev/null; then
    "$py" -m pip install -q --no-index --find-links .whl --target "$site" pydantic >>"$log" 2>&1 \
        || { echo "pydantic is missing and .whl/ could not provide it: run 'make gpu-wheels' and carry .whl" | tee -a "$log"; exit 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ date -u; nvidia-smi -L 2>/dev/null; "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } >>"$log" 2>&1

if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
    corr_args=(--sizes 65536 --repeats 3 --device cpu --no-save)
    learner_sizes=(tiny)
    learner_args=(--prompts 2 --group-size 2 --prompt-len 16 --response-len 32 --micro-batch 2 --steps 1 --warmup 0 --no-save)
    tests=(tests/test_learner_flops.py tests/test_gpu_paths.py)
else
    corr_args=(--device cuda)
    learner_sizes=(0.5b 1.5b)
    learner_args=(--prompts 8 --group-size 8 --prompt-len 256 --response-len 768 --micro-batch 8)
    tests=(tests/test_gpu_paths.py)
fi

failed=0
part() {  # part NAME SECONDS COMMAND...: run with a limit, log everything, count a failure
    local name="$1" limit="$2"; shift 2
    echo "== $name" | tee -a "$log"
    local t0=$SECONDS
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    echo "== $name: rc $rc in $((SECONDS - t0)) s" | tee -a "$log"
    [ "$rc" = 0 ] || failed=$((failed + 1))
}

part tests 120 "$py" -m pytest -q -p no:cacheprovider --noconftest "${tests[@]}"
part correction 90 "$py" benchmarks/bench_correction.py "${corr_args[@]}"
for size in "${learner_sizes[@]}"; do
    part "learner $size" "$([ "$size" = 1.5b ] && echo 200 || echo 150)" "$py" benchmarks/bench_learner_step.py \
        --size "$size" "${learner_args[@]}"
done
for f in benchmarks/results/correction_core_cuda.json benchmarks/results/learner_step_cuda_*.json; do
    [ -f "$f" ] && cp "$f" "$out/"
done
grep '^{"benchmark"' "$log" | tail -n 5 >"$out/summary.jsonl"
echo "gpu_check: $failed part(s) failed; results in $out" | tee -a "$log"
exit "$failed"
