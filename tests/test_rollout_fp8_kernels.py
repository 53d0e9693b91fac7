"""FP8 kernel selection on CPU (``system.rollout.fp8_kernels``): logic and products, on any CPU.

The decision is a pure function of the probe's timings, so every branch is tested with
synthetic timings (the Intel AMX case is the one measured in the issue: channel-wise 1.7 s,
row-wise 1.7 ms, BF16 0.22 ms at 512x256x768). The two FP8 products are checked against a
float64 reference of ``diag(s_x) X W^T diag(s_w)`` on the FP8-rounded operands.
"""

import pytest
import torch

from system.rollout.fp8_kernels import (
    ROWWISE_MIN_GAIN,
    SLOW_FP8_RATIO,
    MatmulProbe,
    channelwise_product,
    choose_fp8_kernel,
    probe_fp8_matmul,
    rowwise_product,
)

AMX = MatmulProbe(512, 256, 768, bf16_ms=0.22, channelwise_ms=1700.0, rowwise_ms=1.7)
EPYC = MatmulProbe(512, 256, 768, bf16_ms=0.95, channelwise_ms=3.5, rowwise_ms=3.3)
FAST = MatmulProbe(512, 256, 768, bf16_ms=1.0, channelwise_ms=1.2, rowwise_ms=1.1)


def test_auto_takes_rowwise_where_channelwise_is_pathological():
    d = choose_fp8_kernel("auto", AMX)
    assert d.kernel == "rowwise"
    assert d.fp8_vs_bf16 == pytest.approx(0.22 / 1.7)  # the chosen (row-wise) speed relative to BF16
    assert d.warning is None  # 0.13x >= SLOW_FP8_RATIO (0.1)
    slow = choose_fp8_kernel("auto", MatmulProbe(512, 256, 768, bf16_ms=0.22, channelwise_ms=1700.0, rowwise_ms=4.4))
    assert slow.kernel == "rowwise" and slow.fp8_vs_bf16 == pytest.approx(0.05)
    # 0.05x BF16 is below SLOW_FP8_RATIO: the warning says what to do
    assert slow.warning is not None and "rollout.quantization=bf16" in slow.warning and "0.05x" in slow.warning
    assert "fp8_kernel=rowwise" not in slow.warning  # already row-wise: no such advice


def test_auto_keeps_vllms_kernel_where_both_run_alike():
    d = choose_fp8_kernel("auto", EPYC)  # 3.5 / 3.3 = 1.06 < ROWWISE_MIN_GAIN
    assert d.kernel == "vllm"
    assert d.fp8_vs_bf16 == pytest.approx(0.95 / 3.5)
    assert d.warning is None  # 0.27x >= 0.1
    assert choose_fp8_kernel("auto", FAST).warning is None  # 1.0 / 1.2 = 0.83
    forced = choose_fp8_kernel("vllm", AMX)  # 0.22 / 1700: far below, with the advice to switch
    assert forced.warning is not None and "rollout.fp8_kernel=rowwise" in forced.warning


def test_gain_threshold_is_inclusive():
    at = MatmulProbe(1, 1, 1, bf16_ms=1.0, channelwise_ms=ROWWISE_MIN_GAIN * 2.0, rowwise_ms=2.0)
    below = MatmulProbe(1, 1, 1, bf16_ms=1.0, channelwise_ms=ROWWISE_MIN_GAIN * 2.0 - 0.01, rowwise_ms=2.0)
    assert choose_fp8_kernel("auto", at).kernel == "rowwise"
    assert choose_fp8_kernel("auto", below).kernel == "vllm"


def test_slow_ratio_threshold():
    just_fast = MatmulProbe(1, 1, 1, bf16_ms=SLOW_FP8_RATIO, channelwise_ms=1.0, rowwise_ms=1.0)
    just_slow = MatmulProbe(1, 1, 1, bf16_ms=SLOW_FP8_RATIO * 0.99, channelwise_ms=1.0, rowwise_ms=1.0)
    assert choose_fp8_kernel("auto", just_fast).warning is None
    assert choose_fp8_kernel("auto", just_slow).warning is not None


def test_forced_choices_are_kept_and_measured():
    d = choose_fp8_kernel("vllm", AMX)
    assert d.kernel == "vllm" and d.fp8_vs_bf16 == pytest.approx(0.22 / 1700.0)
    assert "forced" in d.reason and d.warning is not None
    assert choose_fp8_kernel("rowwise", EPYC).kernel == "rowwise"


def test_without_a_probe_and_bad_requests():
    d = choose_fp8_kernel("auto", None)
    assert d.kernel == "vllm" and d.fp8_vs_bf16 is None and d.warning is None
    with pytest.raises(ValueError, match="rollout.fp8_kernel"):
        choose_fp8_kernel("cutlass", EPYC)  # type: ignore[arg-type]


def test_decision_is_json_ready():
    out = choose_fp8_kernel("auto", AMX).as_dict()
    assert out["kernel"] == "rowwise" and out["probe"]["channelwise_ms"] == 1700.0


def test_both_fp8_products_compute_the_scaled_product():
    gen = torch.Generator().manual_seed(3)
    m, k, n = 33, 64, 48
    x8 = torch.randn(m, k, generator=gen).to(torch.float8_e4m3fn)
    w8 = torch.randn(n, k, generator=gen).to(torch.float8_e4m3fn)
    s_x, s_w = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
    ref = (x8.double() * s_x.double()) @ (w8.double() * s_w.double().t()).t()
    for product in (channelwise_product, rowwise_product):
        out = product(x8, w8, s_x, s_w)
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        # bf16 output: relative rounding 2**-8 of each entry, plus float32 accumulation
        assert torch.allclose(out.double(), ref, rtol=2**-7, atol=1e-3)


def test_probe_times_every_variant_on_this_cpu():
    p = probe_fp8_matmul(32, 64, 128)
    assert (p.m, p.k, p.n) == (32, 64, 128)
    assert p.bf16_ms > 0 and p.channelwise_ms > 0 and p.rowwise_ms > 0


def test_a_cpu_with_amx_fp8_keeps_vllms_native_kernel():
    """Found by a review: on a CPU with AMX-FP8 vLLM runs its native kernel ahead of the torch ones;
    the probe timed only the torch paths, so ``vllm`` was recorded with another kernel's timings and
    ``auto`` could put the row-wise kernel in front of a faster native one."""
    for requested in ("auto", "vllm"):
        d = choose_fp8_kernel(requested, AMX, native_amx_fp8=True)  # even where the probe says rowwise
        assert d.kernel == "vllm" and "native" in d.reason and d.probe is None and d.fp8_vs_bf16 is None
    forced = choose_fp8_kernel("rowwise", AMX, native_amx_fp8=True)
    assert forced.kernel == "rowwise" and forced.probe == AMX
    assert choose_fp8_kernel("auto", AMX).kernel == "rowwise"  # without AMX-FP8, as before
