"""FP8 on a real vLLM engine (CPU, fp8_per_channel): its log-prob gap against BF16's, and aisrl's two FP8
kernels (row-wise and upcast, ``system.rollout.vllm_engine``) used by the engine, matching vLLM's
channel-wise one, running one sequence, following every weight load, and pinned per kind of CPU.
The shared config and helpers: ``tests/vllm_engines.py``; the model and engines: ``tests/conftest.py``.
"""

import numpy as np
import pytest
import torch
from vllm_engines import CFG, PROMPTS, TEMPERATURE, logprob_gaps, sample

from system.rollout.vllm_engine import VLLMEngine
from system.weight_payload import encode_weights

pytestmark = pytest.mark.vllm


def test_fp8_gap_is_larger_than_bf16(fp8_worker, bf16_engine, hf_model):
    assert fp8_worker.quantization_scheme == "fp8_per_channel"
    bf16 = logprob_gaps(hf_model, sample(bf16_engine), TEMPERATURE)
    fp8 = logprob_gaps(hf_model, sample(fp8_worker.engine), TEMPERATURE)
    print(f"log-prob gap to transformers: bf16 mean {bf16.mean():.5f} max {bf16.max():.5f}; "
          f"fp8_per_channel mean {fp8.mean():.5f} max {fp8.max():.5f}")
    assert fp8.mean() > 1.5 * bf16.mean() and fp8.max() > bf16.max()


@pytest.fixture(scope="module")
def rowwise_engine(model_dir):
    """Kept for the module: destroying one of several in-process engines tears down vLLM's global
    parallel state that the others still use."""
    return VLLMEngine(model_dir, "fp8", CFG.rollout.engine, seed=0, fp8_kernel="rowwise")


@pytest.fixture(scope="module")
def upcast_engine(model_dir):
    """Kept for the module, like ``rowwise_engine``."""
    return VLLMEngine(model_dir, "fp8", CFG.rollout.engine, seed=0, fp8_kernel="upcast")


def kernel_class(kernel: str) -> type:
    from system.rollout.vllm_engine import rowwise_kernel_class, upcast_kernel_class

    return {"rowwise": rowwise_kernel_class, "upcast": upcast_kernel_class}[kernel]()


def skip_where_vllms_native_fp8_kernel_runs():
    """On a CPU with AMX-FP8 vLLM's native kernel runs for ``vllm`` / ``auto`` without a probe."""
    from system.rollout.vllm_engine import native_amx_fp8

    if native_amx_fp8():
        pytest.skip("this CPU has AMX-FP8: vLLM's native FP8 kernel runs unprobed")


@pytest.mark.parametrize("kernel", ["rowwise", "upcast"])
def test_aisrl_fp8_kernel_is_used_and_matches_the_channelwise_one(kernel, fp8_worker, bf16_engine, hf_model, request):
    """aisrl's row-wise kernel (scales fused into ``torch._scaled_mm``) and upcast kernel (the product on the
    BF16 matmul path, one more BF16 rounding) compute vLLM's FP8 product: their gap to the reference sits at
    the FP8 level of vLLM's channel-wise kernel (the worker's), not at the BF16 one."""
    skip_where_vllms_native_fp8_kernel_runs()
    engine = request.getfixturevalue(f"{kernel}_engine")
    assert fp8_worker.fp8_kernel["kernel"] == "vllm" and fp8_worker.fp8_kernel["probe"]["bf16_ms"] > 0  # probed
    before = kernel_class(kernel).calls
    assert engine.quantization_scheme == "fp8_per_channel" and engine.fp8_kernel["kernel"] == kernel
    ours = logprob_gaps(hf_model, sample(engine), TEMPERATURE)
    assert kernel_class(kernel).calls > before  # vLLM ran the products through it
    cw = logprob_gaps(hf_model, sample(fp8_worker.engine), TEMPERATURE)
    bf16 = logprob_gaps(hf_model, sample(bf16_engine), TEMPERATURE)
    print(f"log-prob gap mean: bf16 {bf16.mean():.5f}, fp8 channel-wise {cw.mean():.5f}, {kernel} {ours.mean():.5f}")
    assert ours.mean() > 1.5 * bf16.mean()
    assert 0.5 * cw.mean() < ours.mean() < 2.0 * cw.mean()


@pytest.mark.parametrize("kernel", ["rowwise", "upcast"])
def test_aisrl_fp8_kernel_runs_a_single_sequence(kernel, hf_model, request):
    """Found by a review (row-wise): with one sequence running, the decode forward has one token, so vLLM's
    per-token scales are [1, 1] and the kernel took them for a per-tensor scale: the padded product raised
    ``Invalid scaling configuration`` (the last unfinished completion of a call)."""
    engine = request.getfixturevalue(f"{kernel}_engine")
    before = kernel_class(kernel).calls
    one = engine.generate([PROMPTS[0].text], n=1, temperature=TEMPERATURE, top_p=1.0, max_new_tokens=5, seed=2)
    assert kernel_class(kernel).calls > before
    response = one[0].responses[0]
    assert len(response.response_token_ids) >= 1 and np.isfinite(response.behaviour_logprobs).all()
    gap = logprob_gaps(hf_model, one, TEMPERATURE)
    assert gap.max() < 0.5  # FP8's level of error (about 0.01-0.05 here), not a broken product


def test_auto_keeps_the_kernel_the_run_chose_before_on_this_cpu(model_dir):
    """A resumed run's (or a replacement's) worker gets the run's earlier choice for its kind of CPU and
    keeps it whatever its own probe says; another kind of CPU's pin does not apply."""
    from system.rollout.fp8_kernels import cpu_identity
    from system.rollout.vllm_engine import decide_fp8_kernel

    skip_where_vllms_native_fp8_kernel_runs()
    for kernel in ("rowwise", "vllm", "upcast"):
        d = decide_fp8_kernel(model_dir, "auto", pins={cpu_identity(): kernel, "another CPU []": "rowwise"})
        assert d.kernel == kernel and d.pinned and d.cpu == cpu_identity() and d.probe is not None
    free = decide_fp8_kernel(model_dir, "auto", pins={"another CPU []": "rowwise"})
    assert not free.pinned and "this run chose before" not in free.reason
    assert decide_fp8_kernel(model_dir, "auto", eager=False, pins={cpu_identity(): "upcast"}).kernel != "upcast"


def test_upcast_fp8_kernel_follows_every_weight_load(upcast_engine, hf_model):
    """The kernel keeps a BF16 copy of each layer's FP8 weights: a load must renew it, or the engine would
    sample with the weights it replaced (vLLM's own kernels read the FP8 weights at every product)."""
    from system.rollout.vllm_engine import upcast_kernel_class

    old_state = {k: v.clone() for k, v in hf_model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    # the projections go through the FP8 kernel (the embedding and the head do not): change only them
    new_state = {k: (v * (1 + 0.5 * torch.randn(v.shape, generator=gen)) if k.endswith("proj.weight") else v)
                 for k, v in old_state.items()}
    try:
        widened = upcast_kernel_class().widened
        upcast_engine.load_weights(encode_weights(new_state, policy_version=1))
        samples = sample(upcast_engine)
        assert upcast_kernel_class().widened > widened  # the copies were made again
        hf_model.load_state_dict(new_state)
        new_gap = logprob_gaps(hf_model, samples, TEMPERATURE)
        hf_model.load_state_dict(old_state)
        old_gap = logprob_gaps(hf_model, samples, TEMPERATURE)
        print(f"upcast after reload: vs new weights mean {new_gap.mean():.4f}, vs old weights mean {old_gap.mean():.4f}")
        # FP8's level against the weights loaded (about 0.01-0.05 here); far from the replaced ones
        assert new_gap.mean() < 0.1 and old_gap.mean() > 3 * new_gap.mean()
    finally:
        hf_model.load_state_dict(old_state)
        upcast_engine.load_weights(encode_weights(old_state, policy_version=0))
