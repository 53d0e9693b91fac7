"""The rollout worker core: prompts in, scored and version-stamped rollout groups out.

A plain class (no Ray) that owns one :class:`VLLMEngine` and the task's reward; the Ray
actor in ``actors/rollout_worker.py`` is a thin shell over it. Every completion carries the
policy version of the weights that produced it: 0 for the model directory the worker was
built from, then whatever :meth:`RolloutWorkerCore.update_weights` last loaded.

Each prompt samples with its own seed, derived from the run seed, its ``prompt_id`` (unique
per issue) and the policy version: the samples do not depend on which worker serves the
prompt, in which call, or how often the worker was restarted. So a run is reproducible, a
re-issued prompt at the same version draws the same samples, and a resumed run continues
the uninterrupted one's randomness with nothing to save.
"""

import hashlib
import math
import time
from pathlib import Path

from system.config import RunConfig
from system.rewards.registry import build_reward
from system.rollout.chat import chat_prompt_ids, check_chat_template
from system.rollout.perturbation import model_dir_payload, perturb_payload, perturbation_sigma
from system.rollout.samples import PromptSamples
from system.types import Completion, Prompt, RolloutGroup
from system.weight_payload import WeightPayload


def prompt_seed(run_seed: int, prompt_id: str, policy_version: int) -> int:
    """A 31-bit sampling seed for one prompt's group, at one policy version."""
    digest = hashlib.sha256(f"{run_seed}/{prompt_id}/{policy_version}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


class RolloutWorkerCore:
    """One vLLM engine plus the reward: ``generate_groups`` and ``update_weights``."""

    def __init__(self, run_cfg: RunConfig, model_dir: str | Path, worker_id: str,
                 fp8_kernel_pins: dict[str, str] | None = None) -> None:
        """``fp8_kernel_pins``: the FP8 kernel the run chose before on each kind of CPU (``VLLMEngine``)."""
        # deferred: the driver imports this module (with the Ray actor class) but never builds an engine,
        # and importing vLLM took it ~4 s of a 2-core machine while the learner ranks and workers started
        from system.rollout.vllm_engine import VLLMEngine

        self.cfg = run_cfg
        self.worker_id = worker_id
        self.engine = VLLMEngine(
            model_dir,
            run_cfg.rollout.quantization,
            run_cfg.rollout.engine,
            seed=run_cfg.seed,
            trust_remote_code=getattr(run_cfg.model, "trust_remote_code", False),
            fp8_kernel=run_cfg.rollout.fp8_kernel,
            fp8_kernel_pins=fp8_kernel_pins,
        )
        self.reward = build_reward(run_cfg.data.reward)
        self._chat_tokenizer = None  # data.task.chat_template: prompts as one user turn (``system.rollout.chat``)
        if getattr(run_cfg.data.task, "chat_template", False):
            self._chat_tokenizer = self.engine.tokenizer()
            check_chat_template(self._chat_tokenizer)
        self._policy_version = 0
        self._half_loaded = False  # a load failed part-way (update_weights)
        self._stats = {"num_sequences": 0, "num_response_tokens": 0, "generate_seconds": 0.0,
                       "reward_seconds": 0.0, "num_weight_updates": 0, "weight_update_seconds": 0.0}
        if self._sigma(0) > 0:  # ablations: version 0 perturbed as well
            self.engine.load_weights(self._perturbed(model_dir_payload(model_dir)))

    def _sigma(self, version: int) -> float:
        r = self.cfg.rollout
        return perturbation_sigma(version, r.perturb_std, r.perturb_std_final, r.perturb_ramp_versions)

    def _perturbed(self, payload: WeightPayload) -> WeightPayload:
        return perturb_payload(payload, self._sigma(payload.policy_version), self.cfg.seed)

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine holds now."""
        return self._policy_version

    @property
    def quantization_scheme(self) -> str:
        """The vLLM scheme that ran: ``fp8_per_channel`` (CPU), ``fp8`` (CUDA) or ``bf16``."""
        return self.engine.quantization_scheme

    @property
    def fp8_kernel(self) -> dict | None:
        """The FP8 kernel decision on CPU (kernel, reason, probe, slow-FP8 warning); None otherwise."""
        return self.engine.fp8_kernel

    def generate_groups(self, prompts: list[Prompt], policy_version: int | None = None) -> list[RolloutGroup]:
        """``rollout.group_size`` scored completions per prompt, stamped with the current version.

        ``policy_version``, when given, is the version the caller believes the worker holds;
        a different one is a wiring error and raises :class:`ValueError`.
        """
        if self._half_loaded:
            raise RuntimeError(f"worker {self.worker_id}: its last weight load failed part-way, so its engine holds "
                               f"a mix of two versions; it generates again once a load succeeds")
        if policy_version is not None and policy_version != self._policy_version:
            raise ValueError(f"worker {self.worker_id} holds policy version {self._policy_version}, "
                             f"asked to generate with {policy_version}")
        r = self.cfg.rollout
        started = time.perf_counter()
        inputs = ([p.text for p in prompts] if self._chat_tokenizer is None
                  else [chat_prompt_ids(self._chat_tokenizer, p.text) for p in prompts])
        samples = self.engine.generate(
            inputs, n=r.group_size, temperature=r.temperature, top_p=r.top_p,
            max_new_tokens=r.max_new_tokens, top_k=r.top_k, stop=r.stop,
            seed=[prompt_seed(self.cfg.seed, p.prompt_id, self._policy_version) for p in prompts],
        )
        generated = time.perf_counter()
        groups = [self._group(p, s) for p, s in zip(prompts, samples, strict=True)]
        self._stats["generate_seconds"] += generated - started
        self._stats["reward_seconds"] += time.perf_counter() - generated
        return groups

    def _group(self, prompt: Prompt, samples: PromptSamples) -> RolloutGroup:
        completions = tuple(
            Completion(
                prompt_id=prompt.prompt_id,
                sample_index=j,
                prompt_token_ids=samples.prompt_token_ids,
                response_token_ids=s.response_token_ids,
                behaviour_logprobs=s.behaviour_logprobs,
                response_text=s.text,
                reward=self._reward(s.text, prompt, j),
                policy_version=self._policy_version,
                finish_reason=s.finish_reason,
                worker_id=self.worker_id,
            )
            for j, s in enumerate(samples.responses)
        )
        num_tokens = sum(len(c.response_token_ids) for c in completions)
        self._stats["num_sequences"] += len(completions)
        self._stats["num_response_tokens"] += num_tokens
        return RolloutGroup(prompt=prompt, completions=completions, policy_version=self._policy_version,
                            worker_id=self.worker_id)

    def _reward(self, text: str, prompt: Prompt, sample_index: int) -> float:
        """The reward of one response, refused unless finite: one NaN reward made its group's advantages NaN
        and the step's loss and gradient NaN, so the whole step was skipped (a review; the learner then
        blamed ``learner.lr``)."""
        reward = float(self.reward(text, prompt.reference))
        if not math.isfinite(reward):
            raise ValueError(f"data.reward ({self.cfg.data.reward.type}) gave {reward} for sample {sample_index} "
                             f"of prompt {prompt.prompt_id} (response {text[:80]!r}): rewards must be finite")
        return reward

    def update_weights(self, payload: WeightPayload) -> None:
        """Load ``payload`` into the engine and adopt its ``policy_version``. A load that fails part-way
        leaves the engine with some tensors of the new version and some of the old: until a load
        succeeds, the worker generates nothing (a review: it would have sampled from that mix under
        the old version's stamp)."""
        self._half_loaded = True
        seconds = self.engine.load_weights(self._perturbed(payload))
        self._half_loaded = False
        self._policy_version = payload.policy_version
        self._stats["num_weight_updates"] += 1
        self._stats["weight_update_seconds"] += seconds

    def stats(self) -> dict:
        """Cumulative counters: sequences, response tokens, generate / reward / weight-swap seconds."""
        return {**self._stats, "worker_id": self.worker_id, "policy_version": self._policy_version,
                "quantization": self.quantization_scheme, "engine_build_seconds": self.engine.build_seconds}
