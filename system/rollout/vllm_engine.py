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
temperature and top-p), which is what the learner recomputes with logits / temperature.
On CPU vLLM sets torch to one intra-op thread in the process that builds an engine.

``vllm.LLM`` is imported when the first engine is built, not with this module: its import
chain loads ``ray`` (``vllm.v1.executor.ray_utils`` tries ``import ray``), and importing
``system`` must not (``tests/test_import_boundaries.py``).
"""

import numbers
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from vllm import SamplingParams
from vllm.platforms import current_platform

from system.config.rollout import VLLMEngineConfig
from system.rollout.quantization import resolve_quantization, scheme_name
from system.rollout.samples import PromptSamples, SampledResponse
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


class VLLMEngine:
    """One vLLM engine over a Hugging Face model directory, in this process."""

    def __init__(
        self,
        model_dir: str | Path,
        quantization: str,
        engine_cfg: VLLMEngineConfig,
        seed: int = 0,
        trust_remote_code: bool = False,
    ) -> None:
        self.device = current_platform.device_type
        _configure_environment(self.device)
        self.dtype = torch.bfloat16
        memory = ({"kv_cache_memory_bytes": int(engine_cfg.kv_cache_gib * _GIB)}
                  if self.device == "cpu" else {})
        from vllm import LLM  # deferred: importing it loads ray (see the module docstring)

        started = time.perf_counter()
        self.llm = LLM(
            model=str(model_dir),
            dtype="bfloat16",
            quantization=resolve_quantization(quantization, self.device),
            seed=seed,
            enforce_eager=engine_cfg.enforce_eager,
            max_num_seqs=engine_cfg.max_num_seqs,
            gpu_memory_utilization=engine_cfg.gpu_memory_utilization,
            distributed_executor_backend="uni",
            logprobs_mode="processed_logprobs",
            trust_remote_code=trust_remote_code,
            **memory,
        )
        self.build_seconds = time.perf_counter() - started
        model_config = self.llm.llm_engine.vllm_config.model_config
        self.quantization_scheme = scheme_name(model_config.quantization)
        """The scheme that actually ran: ``fp8_per_channel`` (CPU), ``fp8`` (CUDA) or ``bf16``."""
        self.tied_embeddings = bool(getattr(model_config.hf_config, "tie_word_embeddings", False))

    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int | Sequence[int] | None = None,
    ) -> list[PromptSamples]:
        """``n`` samples for each prompt, in prompt order; ``seed`` makes the call reproducible.

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
            SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                           logprobs=0, seed=s)
            for s in seeds
        ]
        outputs = self.llm.generate(list(prompts), params, use_tqdm=False)
        return [
            PromptSamples(
                prompt_token_ids=frozen_array(out.prompt_token_ids, np.int32),
                responses=tuple(_response(o) for o in out.outputs),
            )
            for out in outputs
        ]

    def _weights(self, payload: WeightPayload) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in decode_weights(payload):
            yield name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor
            if name == "model.embed_tokens.weight" and "lm_head.weight" not in payload.arrays:
                yield "lm_head.weight", tensor.to(self.dtype)  # tied: the head is the embedding

    def load_weights(self, payload: WeightPayload) -> float:
        """Swap in ``payload`` in place (re-runs FP8 quantization), reset the prefix cache; seconds taken.

        ``lm_head.weight`` is always pushed: a payload without it is completed from
        ``model.embed_tokens.weight`` for a tied-embedding model and refused for an untied one.
        """
        if "lm_head.weight" not in payload.arrays and (
            not self.tied_embeddings or "model.embed_tokens.weight" not in payload.arrays
        ):
            raise ValueError(f"weight payload of policy version {payload.policy_version} lacks "
                             "lm_head.weight (the engine would keep a stale head)")
        started = time.perf_counter()
        worker = self.llm.llm_engine.model_executor.driver_worker.worker
        worker.reload_weights(weights_iterator=self._weights(payload))
        self.llm.reset_prefix_cache()
        return time.perf_counter() - started
