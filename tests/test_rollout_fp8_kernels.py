"""FP8 kernel selection on CPU (``system.rollout.fp8_kernels``): logic and products, on any CPU.

The decision is a pure function of the probe's timings, so every branch is tested with
synthetic timings (the Intel AMX case is the one measured in the issue: channel-wise 1.7 s,
row-wise 1.7 ms, BF16 0.22 ms at 512x256x768; its upcast time is not measured there, so the
cases set it on either side). The three FP8 products are checked against a float64 reference
of ``diag(s_x) X W^T diag(s_w)`` on the FP8-rounded operands.
"""

import dataclasses

import pytest
import torch

from system.rollout.fp8_kernels import (
    MIN_GAIN,
    SLOW_FP8_RATIO,
    MatmulProbe,
    WidenedWeight,
    channelwise_product,
    choose_fp8_kernel,
    cpu_identity,
    fp8_to_bf16,
    probe_fp8_matmul,
    rowwise_product,
    upcast_product,
)

AMX = MatmulProbe(512, 256, 768, bf16_ms=0.22, channelwise_ms=1700.0, rowwise_ms=1.7, upcast_ms=2.0)
ALIKE = MatmulProbe(512, 256, 768, bf16_ms=0.95, channelwise_ms=3.5, rowwise_ms=3.3, upcast_ms=2.6)  # 1.35x < MIN_GAIN
FAST = MatmulProbe(512, 256, 768, bf16_ms=1.0, channelwise_ms=1.2, rowwise_ms=1.1, upcast_ms=1.3)


def test_auto_takes_rowwise_where_channelwise_is_pathological():
    d = choose_fp8_kernel("auto", AMX)
    assert d.kernel == "rowwise"
    assert d.fp8_vs_bf16 == pytest.approx(0.22 / 1.7)  # the chosen (row-wise) speed relative to BF16
    assert d.warning is None  # 0.13x >= SLOW_FP8_RATIO (0.1)
    slow = choose_fp8_kernel("auto", MatmulProbe(512, 256, 768, bf16_ms=0.22, channelwise_ms=1700.0, rowwise_ms=4.4,
                                                 upcast_ms=5.0))
    assert slow.kernel == "rowwise" and slow.fp8_vs_bf16 == pytest.approx(0.05)
    # 0.05x BF16 is below SLOW_FP8_RATIO: the warning says what to do
    assert slow.warning is not None and "rollout.quantization=bf16" in slow.warning and "0.05x" in slow.warning
    assert "fp8_kernel=" not in slow.warning  # already the fastest: no kernel to advise


def test_auto_takes_upcast_where_it_is_the_fastest_replacement():
    d = choose_fp8_kernel("auto", MatmulProbe(512, 256, 768, bf16_ms=0.22, channelwise_ms=1700.0, rowwise_ms=1.7,
                                              upcast_ms=0.44))
    assert d.kernel == "upcast" and d.fp8_vs_bf16 == pytest.approx(0.5)  # 0.22 / 0.44
    assert d.warning is None and "upcast 0.44 ms" in d.reason
    # vLLM's kernel 2.2 / 1.0 = 2.2x slower than the upcast one (>= MIN_GAIN), row-wise no faster than vLLM's
    amd = MatmulProbe(512, 1536, 8960, bf16_ms=0.9, channelwise_ms=2.2, rowwise_ms=2.3, upcast_ms=1.0)
    assert choose_fp8_kernel("auto", amd).kernel == "upcast"
    # the tiny default's probe on a 2-core AMD EPYC beside a process running matmuls: 0.235 / 0.129 = 1.82x
    # (quiet: 2.08-2.13x over 40 probes, 2.03x at a worker's start): upcast, as quiet (under the old
    # threshold of 2 it took vLLM's kernel, as 1 of 8 workers starting beside a learner rank did)
    loaded = MatmulProbe(256, 64, 256, bf16_ms=0.0595, channelwise_ms=0.235, rowwise_ms=0.2215, upcast_ms=0.129)
    assert choose_fp8_kernel("auto", loaded).kernel == "upcast"
    forced_slow = choose_fp8_kernel("rowwise", dataclasses.replace(amd, rowwise_ms=10.0))
    # 0.9 / 10 = 0.09x: slow, and the advice names the fastest other kernel (upcast, 1 ms)
    assert forced_slow.warning is not None and "rollout.fp8_kernel=upcast (1 ms)" in forced_slow.warning


def test_auto_keeps_vllms_kernel_where_both_run_alike():
    d = choose_fp8_kernel("auto", ALIKE)  # 3.5 / 2.6 = 1.35 (upcast, the faster one) < MIN_GAIN
    assert d.kernel == "vllm"
    assert d.fp8_vs_bf16 == pytest.approx(0.95 / 3.5)
    assert d.warning is None  # 0.27x >= 0.1
    assert choose_fp8_kernel("auto", FAST).warning is None  # 1.0 / 1.2 = 0.83
    forced = choose_fp8_kernel("vllm", AMX)  # 0.22 / 1700: far below, with the advice to switch to the fastest
    assert forced.warning is not None and "rollout.fp8_kernel=rowwise (1.7 ms)" in forced.warning


def test_gain_threshold_is_inclusive():
    for other in ("rowwise_ms", "upcast_ms"):  # whichever of the two replacements is the faster one
        times = {"rowwise_ms": 50.0, "upcast_ms": 50.0, other: 2.0}
        at = MatmulProbe(1, 1, 1, bf16_ms=1.0, channelwise_ms=MIN_GAIN * 2.0, **times)
        below = MatmulProbe(1, 1, 1, bf16_ms=1.0, channelwise_ms=MIN_GAIN * 2.0 - 0.01, **times)
        assert choose_fp8_kernel("auto", at).kernel == other.removesuffix("_ms")
        assert choose_fp8_kernel("auto", below).kernel == "vllm"


def test_slow_ratio_threshold():
    just_fast = MatmulProbe(1, 1, 1, bf16_ms=SLOW_FP8_RATIO, channelwise_ms=1.0, rowwise_ms=1.0, upcast_ms=1.0)
    just_slow = MatmulProbe(1, 1, 1, bf16_ms=SLOW_FP8_RATIO * 0.99, channelwise_ms=1.0, rowwise_ms=1.0, upcast_ms=1.0)
    assert choose_fp8_kernel("auto", just_fast).warning is None
    assert choose_fp8_kernel("auto", just_slow).warning is not None


def test_forced_choices_are_kept_and_measured():
    d = choose_fp8_kernel("vllm", AMX)
    assert d.kernel == "vllm" and d.fp8_vs_bf16 == pytest.approx(0.22 / 1700.0)
    assert "forced" in d.reason and d.warning is not None
    assert choose_fp8_kernel("rowwise", ALIKE).kernel == "rowwise"
    up = choose_fp8_kernel("upcast", AMX)
    assert up.kernel == "upcast" and up.fp8_vs_bf16 == pytest.approx(0.22 / 2.0)


def test_without_a_probe_and_bad_requests():
    d = choose_fp8_kernel("auto", None)
    assert d.kernel == "vllm" and d.fp8_vs_bf16 is None and d.warning is None
    with pytest.raises(ValueError, match="rollout.fp8_kernel"):
        choose_fp8_kernel("cutlass", ALIKE)  # type: ignore[arg-type]


def test_decision_is_json_ready():
    out = choose_fp8_kernel("auto", AMX).as_dict()
    assert out["kernel"] == "rowwise" and out["probe"]["channelwise_ms"] == 1700.0


def test_every_fp8_product_computes_the_scaled_product():
    gen = torch.Generator().manual_seed(3)
    m, k, n = 33, 64, 48
    x8 = torch.randn(m, k, generator=gen).to(torch.float8_e4m3fn)
    w8 = torch.randn(n, k, generator=gen).to(torch.float8_e4m3fn)
    s_x, s_w = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
    ref = (x8.double() * s_x.double()) @ (w8.double() * s_w.double().t()).t()
    upcast = lambda x8, w8, s_x, s_w: upcast_product(x8, fp8_to_bf16(w8).t(), s_x, s_w)  # noqa: E731
    for product in (channelwise_product, rowwise_product, upcast):
        out = product(x8, w8, s_x, s_w)
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        # bf16 output: relative rounding up to 2**-8 of each entry (BF16's unit roundoff), plus float32
        # accumulation; the upcast one rounds twice (the unscaled sum, then the scaled one): up to 2**-7
        rtol = 2**-7 + 2**-12 if product is upcast else 2**-7
        assert torch.allclose(out.double(), ref, rtol=rtol, atol=1e-3)


def test_upcast_product_is_the_exact_sum_rounded_twice():
    """The operands are multiples of 1/4 below 4 in magnitude (exact in FP8: at most 4 significant bits), so
    every product is a multiple of 1/16 below 16 and every partial sum of k = 16 of them a multiple of 1/16
    below 256: 12 bits, exact in the BF16 matmul's float32 accumulator whatever its order. The result must
    be that sum rounded to BF16, times the scales in float32, plus the bias, rounded to BF16."""
    gen = torch.Generator().manual_seed(5)
    m, k, n = 19, 16, 24
    x8 = (torch.randint(-15, 16, (m, k), generator=gen) / 4).to(torch.float8_e4m3fn)
    w8 = (torch.randint(-15, 16, (n, k), generator=gen) / 4).to(torch.float8_e4m3fn)
    s_x, s_w = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(n, 1, generator=gen) + 0.5  # weight scales [n, 1]
    bias = torch.randn(n, generator=gen)
    exact = x8.double() @ w8.double().t()  # exact in float64 too
    assert not torch.equal(exact.to(torch.bfloat16).double(), exact)  # some sums do need BF16's rounding
    expected = ((exact.to(torch.bfloat16).float() * s_x) * s_w.t() + bias).to(torch.bfloat16)
    out = upcast_product(x8, fp8_to_bf16(w8).t(), s_x, s_w, bias)
    assert torch.equal(out, expected)
    # a per-tensor activation scale (one number) broadcasts over the rows
    one = torch.tensor([0.75])
    assert torch.equal(upcast_product(x8, fp8_to_bf16(w8).t(), one, s_w),
                       ((exact.to(torch.bfloat16).float() * 0.75) * s_w.t()).to(torch.bfloat16))


def test_fp8_to_bf16_is_exact_for_every_bit_pattern():
    bits = torch.arange(256, dtype=torch.uint8)
    x8 = bits.view(torch.float8_e4m3fn)
    widened = fp8_to_bf16(x8.reshape(16, 16)).reshape(-1)
    reference = x8.to(torch.float32)  # torch's own element-wise conversion
    assert torch.isnan(widened).tolist() == torch.isnan(reference).tolist() and int(torch.isnan(widened).sum()) == 2
    finite = ~torch.isnan(reference)
    assert torch.equal(widened[finite].float(), reference[finite])
    assert float(widened[0x7E]) == 448.0 and float(widened[0x01]) == 2.0**-9  # largest normal, smallest subnormal
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_to_bf16(torch.zeros(3))


def test_widened_weight_is_made_again_for_a_new_tensor_or_a_new_generation():
    """The upcast kernel's BF16 copy of a layer's FP8 weight: a load that writes into the same tensor
    keeps its address, so without the engine's generation the copy would be the replaced weights."""
    w8 = torch.randn(8, 4).to(torch.float8_e4m3fn).t()  # [k, n] view, as vLLM passes the weight
    cache = WidenedWeight()
    first = cache.get(w8, generation=0)
    assert torch.equal(first.float(), w8.float()) and first.stride() == w8.stride() and cache.made == 1
    assert cache.get(w8, generation=0) is first and cache.made == 1  # no copy per product
    w8.copy_(torch.randn(4, 8).to(torch.float8_e4m3fn))  # new values, same tensor
    assert cache.get(w8, generation=0) is first  # what a missed generation would use: stale
    renewed = cache.get(w8, generation=1)
    assert cache.made == 2 and torch.equal(renewed.float(), w8.float()) and not torch.equal(renewed, first)
    other = torch.randn(8, 4).to(torch.float8_e4m3fn).t()  # a new tensor (vLLM re-created the parameter)
    assert torch.equal(cache.get(other, generation=1).float(), other.float()) and cache.made == 3


def test_probe_times_each_product_under_its_own_name(monkeypatch):
    """Each timing field holds the product it names (``choose_fp8_kernel`` acts on them): the timer is
    replaced by one that calls each variant once and keeps its output and which product ran; the BF16
    variant is ``x @ w^T`` exactly, the three FP8 ones ``(x8 s_x) (w8 s_w)^T`` against float64 (a review:
    swapped fields passed the test that only checked the timings were positive)."""
    from system.rollout import fp8_kernels

    ran, outputs = [], {}
    for name in ("channelwise_product", "rowwise_product", "upcast_product"):
        real = getattr(fp8_kernels, name)
        monkeypatch.setattr(fp8_kernels, name, lambda *a, _real=real, _name=name: (ran.append(_name), _real(*a))[1])

    def time_once(variants):
        for key, call in variants.items():
            before = len(ran)
            outputs[key] = (call(), ran[before:])
        return dict.fromkeys(variants, 1.0)

    monkeypatch.setattr(fp8_kernels, "_time_ms", time_once)
    p = probe_fp8_matmul(32, 64, 128, seed=3)
    assert (p.m, p.k, p.n) == (32, 64, 128)
    assert {k: names for k, (_, names) in outputs.items()} == {
        "bf16_ms": [], "channelwise_ms": ["channelwise_product"], "rowwise_ms": ["rowwise_product"],
        "upcast_ms": ["upcast_product"]}
    # the probe's inputs, drawn as it draws them
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(32, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(128, 64, generator=gen).to(torch.bfloat16)
    s_x, s_w = torch.rand(32, 1, generator=gen) + 0.5, torch.rand(1, 128, generator=gen) + 0.5
    assert torch.equal(outputs["bf16_ms"][0], x @ w.t())
    want = (x.to(torch.float8_e4m3fn).double() * s_x.double()) @ (w.to(torch.float8_e4m3fn).double() * s_w.double().t()).t()
    for key in ("channelwise_ms", "rowwise_ms", "upcast_ms"):
        torch.testing.assert_close(outputs[key][0].double(), want, rtol=2e-2, atol=5e-2, msg=key)


def test_the_probe_interleaves_the_variants_and_drops_a_pathological_one_after_its_warm_up(monkeypatch):
    """Rounds of one call each (a load that comes and goes falls on every variant alike), after one
    warm-up each; a variant whose warm-up spent the budget is not called again; best time kept."""
    from system.rollout import fp8_kernels

    calls, clock = [], [0.0]
    costs = {"fast": [0.003, 0.001, 0.002], "slow": [0.5], "mid": [0.004, 0.002]}  # seconds per call, cycled

    def variant(name):
        def call():
            calls.append(name)
            clock[0] += costs[name][(calls.count(name) - 1) % len(costs[name])]
        return call

    monkeypatch.setattr(fp8_kernels.time, "perf_counter", lambda: clock[0])
    best = fp8_kernels._time_ms({n: variant(n) for n in costs}, budget_s=0.25, max_calls=3)
    monkeypatch.undo()
    # warm-ups fast, slow, mid; slow spent 0.5 s > 0.25 s and leaves; then 3 rounds of fast, mid
    assert calls == ["fast", "slow", "mid"] + ["fast", "mid"] * 3
    # fast: 3, 1, 2, 3 ms -> 1; mid: 4, 2, 4, 2 ms -> 2; slow: its warm-up, 500
    assert best == pytest.approx({"fast": 1.0, "slow": 500.0, "mid": 2.0})


def test_a_cpu_with_amx_fp8_keeps_vllms_native_kernel():
    """Found by a review: on a CPU with AMX-FP8 vLLM runs its native kernel ahead of the torch ones;
    the probe timed only the torch paths, so ``vllm`` was recorded with another kernel's timings and
    ``auto`` could put the row-wise kernel in front of a faster native one."""
    for requested in ("auto", "vllm"):
        d = choose_fp8_kernel(requested, AMX, native_amx_fp8=True)  # even where the probe says rowwise
        assert d.kernel == "vllm" and "native" in d.reason and d.probe is None and d.fp8_vs_bf16 is None
    for requested in ("rowwise", "upcast"):
        forced = choose_fp8_kernel(requested, AMX, native_amx_fp8=True)
        assert forced.kernel == requested and forced.probe == AMX
    assert choose_fp8_kernel("auto", AMX).kernel == "rowwise"  # without AMX-FP8, as before


def test_a_pinned_kernel_is_kept_by_auto_only():
    """``pinned``: the kernel the run chose before on this kind of CPU; a probe on the other side of MIN_GAIN
    (here vLLM's would win) does not change it, and the reason says what the probe alone would take."""
    d = choose_fp8_kernel("auto", ALIKE, pinned="upcast")
    assert d.kernel == "upcast" and d.pinned and "would take vllm" in d.reason
    assert d.fp8_vs_bf16 == pytest.approx(0.95 / 2.6)  # measured for the kernel that runs
    forced = choose_fp8_kernel("rowwise", ALIKE, pinned="upcast")
    assert forced.kernel == "rowwise" and not forced.pinned  # a forced choice is the config's
    assert not choose_fp8_kernel("auto", ALIKE).pinned
    with pytest.raises(ValueError, match="pinned FP8 kernel"):
        choose_fp8_kernel("auto", ALIKE, pinned="cutlass")  # type: ignore[arg-type]


def test_a_compiled_engine_never_gets_the_upcast_kernel():
    """The upcast kernel's weight copy is renewed by a Python check a compiled graph would not run."""
    fast_upcast = MatmulProbe(1, 1, 1, bf16_ms=1.0, channelwise_ms=10.0, rowwise_ms=8.0, upcast_ms=1.0)
    assert choose_fp8_kernel("auto", fast_upcast).kernel == "upcast"
    compiled = choose_fp8_kernel("auto", fast_upcast, eager=False)
    assert compiled.kernel == "vllm" and "left out" in compiled.reason  # 10 / 8 < MIN_GAIN
    assert choose_fp8_kernel("auto", fast_upcast, eager=False, pinned="upcast").kernel == "vllm"  # pin dropped
    assert choose_fp8_kernel("auto", AMX, eager=False).kernel == "rowwise"
    with pytest.raises(ValueError, match="enforce_eager"):
        choose_fp8_kernel("upcast", AMX, eager=False)


def test_cpu_identity_names_the_model_and_the_fp8_relevant_flags():
    info = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
            "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8 sse4_2\n"
            "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2\n")
    assert cpu_identity(info) == "Intel(R) Xeon(R) Platinum 8480+ [amx_bf16 amx_int8 amx_tile avx2 avx512_bf16 avx512f]"
    assert cpu_identity("") == "unknown CPU []"
    # this machine's: its model name as /proc/cpuinfo gives it (read here without the module's parser)
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    assert cpu_identity().startswith(f"{names[0]} [" if names else "unknown CPU [")


def test_the_config_refuses_the_upcast_kernel_on_a_compiled_engine():
    from system.config import ConfigError, resolve_config

    with pytest.raises(ConfigError, match="enforce_eager"):
        resolve_config(overrides=["rollout.fp8_kernel=upcast", "rollout.engine.enforce_eager=false"])
    assert resolve_config(overrides=["rollout.fp8_kernel=upcast"]).rollout.fp8_kernel == "upcast"
