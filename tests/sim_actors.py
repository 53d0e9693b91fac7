"""Simulated Ray actors for the two compute roles, so benchmarks and tests isolate the orchestration.

``SimulatedRolloutWorker`` and ``SimulatedLearnerRank`` have the methods and signatures of
``actors.rollout_worker.RolloutWorker`` and ``actors.learner_worker.LearnerRank``; they run
no model. Everything around them is real: ``Trainer``, the controller's two loops, the
trajectory buffer, the exactly-once sampler, the correction service (real math, real sinks)
and the object-store weight path.

- The simulated worker's ``generate`` returns real ``RolloutGroup`` records (random token ids
  in the model's vocabulary, negative behaviour log-probs, digit strings scored by the task's
  real reward), stamped with the policy version it holds, and takes a configured time.
- The simulated rank's ``step`` (in ``sim_learner.py``) follows the real step protocol
  (``system.learner.group_step``): proximal log-probs = the behaviour log-probs plus small noise,
  rank 0 calls the real correction service once, the update takes a configured time and returns
  the keys of the real metrics, and rank 0 puts a bf16 ``WeightPayload`` of a configured size in
  the object store.

Simulated time is a deadline from the call's start (sleep ``max(0, start + seconds - now)``),
so building the records does not add to it: a call takes ``seconds`` plus only what the
orchestration around it costs.

Settings are baked into a class (``Trainer`` builds actors as ``cls.options(...).remote(cfg,
model_dir, ...)``, so nothing else reaches the constructor)::

    rollout_cls = SimulatedRolloutWorker.actor_class(seconds_per_call=0.5)
    learner_cls = SimulatedLearnerRank.actor_class(train_seconds=0.5, payload_params=1_000_000)
    Trainer(cfg, rollout_cls=rollout_cls, learner_cls=learner_cls)

This module is pickled by value (``cloudpickle.register_pickle_by_value``), so Ray's worker
processes need not find ``tests/`` on their path (the benchmarks import it too).
"""

import json
import sys
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import ray
from ray import cloudpickle

from actors.runtime import weights_exist
from system.config import RunConfig
from system.rewards.registry import build_reward
from system.rollout.weight_mailbox import WeightMailbox, with_weights_wait
from system.types import Completion, Prompt, RolloutGroup
from system.weight_payload import WeightPayload

cloudpickle.register_pickle_by_value(sys.modules[__name__])

WeightLoad = Literal["adopt", "touch", "copy"]
PAGE = 4096


def stamp(path: str | None, kind: str, **fields) -> None:
    """Append one event ``{"t": wall clock, "kind": kind, **fields}`` to the JSONL file ``path`` (a
    timeline shared by every process of one machine; nothing when ``path`` is None)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\n")


def _deadline_sleep(started: float, seconds: float) -> None:
    left = started + seconds - time.perf_counter()
    if left > 0:
        time.sleep(left)


def _vocab_size(model_dir: str, default: int = 32_000) -> int:
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, ValueError):
        return default


SIM_CPU = "simulated CPU []"
"""The ``cpu_identity`` every simulated worker reports."""


@dataclass(frozen=True)
class SimulatedRolloutSettings:
    seconds_per_call: float = 0.0
    """Fixed simulated time of one ``generate`` call."""
    seconds_per_prompt: float = 0.0
    """Added per prompt of the call."""
    seconds_per_token: float = 0.0
    """Added per generated response token (all G samples of all prompts)."""
    weight_load: WeightLoad = "adopt"
    """``update_weights``: ``adopt`` the version only (arrays stay mapped, unread), ``touch`` one
    byte of every page, or ``copy`` every array into worker-owned buffers (what an engine's load does)."""
    timeline: str | None = None
    """A JSONL file to stamp ``offer``, ``gen_call``, ``gen_start`` (weights adopted), ``gen_end`` into."""
    fail_to_start: bool = False
    """Raise in the constructor, as an engine that cannot be built on this node."""
    fp8_probes: tuple[str, ...] = ()
    """If set, the worker reports an FP8 kernel decision as a real CPU worker with ``auto`` does: the kernel
    pinned for its CPU (``SIM_CPU``) if it was given one, else what its "probe" picks, ``fp8_probes[i %
    len]`` for worker ``rollout-i`` (so workers can disagree, as probes near the threshold do)."""


def simulated_group(cfg: RunConfig, reward, vocab_size: int, worker_id: str, policy_version: int, prompt: Prompt,
                    rng: np.random.Generator, stats: dict) -> RolloutGroup:
    """G simulated completions of ``prompt`` (random token ids in the vocabulary, negative behaviour
    log-probs, digit strings scored by ``reward``), stamped with ``policy_version``; counted in ``stats``."""
    r = cfg.rollout
    prompt_ids = np.frombuffer(prompt.text.encode(), dtype=np.uint8).astype(np.int32) % vocab_size
    if len(prompt_ids) == 0:
        prompt_ids = np.zeros(1, dtype=np.int32)
    prompt_ids.setflags(write=False)
    completions = []
    for j in range(r.group_size):
        n = int(rng.integers(1, r.max_new_tokens + 1))
        ids = rng.integers(0, vocab_size, n).astype(np.int32)
        logp = (-rng.exponential(0.7, n)).astype(np.float32)
        text = "".join("0123456789"[t % 10] for t in ids)
        ids.setflags(write=False)
        logp.setflags(write=False)
        completions.append(Completion(
            prompt_id=prompt.prompt_id, sample_index=j, prompt_token_ids=prompt_ids,
            response_token_ids=ids, behaviour_logprobs=logp, response_text=text,
            reward=float(reward(text, prompt.reference)), policy_version=policy_version,
            finish_reason="length" if n == r.max_new_tokens else "stop", worker_id=worker_id))
    stats["num_sequences"] += len(completions)
    stats["num_response_tokens"] += sum(len(c.response_token_ids) for c in completions)
    return RolloutGroup(prompt=prompt, completions=tuple(completions), policy_version=policy_version,
                        worker_id=worker_id)


class SimulatedCore:
    """``system.rollout.worker.RolloutWorkerCore``'s interface without an engine, for the real rollout
    worker's shell (``actors.rollout_worker.RolloutWorkerShell``): its mailbox, broadcast receiver and
    weight sources stay real; generating is :func:`simulated_group` at once, a load adopts the version."""

    def __init__(self, cfg: RunConfig, model_dir: str, worker_id: str, fp8_kernel_pins: dict | None = None) -> None:
        self.cfg, self.worker_id = cfg, worker_id
        self.vocab_size = _vocab_size(model_dir)
        self.reward = build_reward(cfg.data.reward)
        self.policy_version = 0
        self.quantization_scheme, self.fp8_kernel = "simulated", None
        self._num_calls = 0
        self._stats = {"num_sequences": 0, "num_response_tokens": 0, "num_weight_updates": 0}

    def generate_groups(self, prompts: list[Prompt], policy_version: int | None = None) -> list[RolloutGroup]:
        started = time.perf_counter()
        rng = np.random.default_rng([self.cfg.seed, zlib.crc32(self.worker_id.encode()), self._num_calls])
        self._num_calls += 1
        groups = [simulated_group(self.cfg, self.reward, self.vocab_size, self.worker_id, self.policy_version, p, rng,
                                  self._stats) for p in prompts]
        _deadline_sleep(started, self.seconds_per_call)
        return groups

    def update_weights(self, payload: WeightPayload) -> None:
        self.policy_version = payload.policy_version
        self._stats["num_weight_updates"] += 1

    def stats(self) -> dict:
        return {**self._stats, "worker_id": self.worker_id, "policy_version": self.policy_version}

    seconds_per_call = 0.0
    """Simulated time of one ``generate_groups`` call (it sleeps what the groups did not take)."""

    @classmethod
    def worker_class(cls, seconds_per_call: float = 0.0, **shell_methods) -> ray.actor.ActorClass:
        """The real rollout worker actor with this core (one class per call), each call taking
        ``seconds_per_call``; ``shell_methods`` replace the shell's (an ablation of the shell's logic)."""
        from actors.rollout_worker import RolloutWorkerShell

        core = type(cls.__name__, (cls,), {"seconds_per_call": seconds_per_call})
        return ray.remote(concurrency_groups={"weights": 1})(
            type("RolloutWorker", (RolloutWorkerShell,), {"core_cls": core, **shell_methods}))


class SimulatedRolloutWorker:
    """A simulated rollout worker: ``RolloutWorker``'s methods, a sleep instead of vLLM."""

    settings = SimulatedRolloutSettings()

    @classmethod
    def actor_class(cls, **settings) -> ray.actor.ActorClass:
        """A Ray actor class of this simulated worker with ``settings`` (see ``SimulatedRolloutSettings``)."""
        baked = type(cls.__name__, (cls,), {"settings": replace(cls.settings, **settings)})
        return ray.remote(concurrency_groups={"weights": 1})(baked)

    def __init__(self, cfg: RunConfig, model_dir: str, worker_id: str, fp8_kernel_pins: dict | None = None) -> None:
        self.fp8_kernel_pins = dict(fp8_kernel_pins or {})
        if self.settings.fail_to_start:
            raise RuntimeError(f"simulated worker {worker_id}: the engine cannot be built here")
        stamp(self.settings.timeline, "constructed", worker=worker_id)
        self.cfg, self.worker_id = cfg, worker_id
        self.vocab_size = _vocab_size(model_dir)
        self.reward = build_reward(cfg.data.reward)
        self.policy_version = 0
        self.mailbox: WeightMailbox[list] = WeightMailbox(0, weights_exist)
        self._running = False
        self._num_calls = 0
        self._loaded: dict[str, np.ndarray] = {}
        self._stats = {"num_sequences": 0, "num_response_tokens": 0, "generate_seconds": 0.0,
                       "reward_seconds": 0.0, "num_weight_updates": 0, "weight_update_seconds": 0.0,
                       "weight_bytes": 0}

    def ready(self) -> dict:
        info = {"worker_id": self.worker_id, "policy_version": self.policy_version, "quantization": "simulated"}
        probes = self.settings.fp8_probes
        if probes:
            probe_says = probes[int(self.worker_id.rpartition("-")[2]) % len(probes)]
            pinned = SIM_CPU in self.fp8_kernel_pins
            info["fp8_kernel"] = {"kernel": self.fp8_kernel_pins.get(SIM_CPU, probe_says), "cpu": SIM_CPU,
                                  "pinned": pinned, "reason": "simulated", "fp8_vs_bf16": None, "warning": None}
        return info

    def generate(self, prompts: list[Prompt], min_policy_version: int) -> list[RolloutGroup]:
        """G simulated samples per prompt stamped with the newest offered version (``RolloutWorker``'s
        mailbox); refuses weights older than allowed."""
        stamp(self.settings.timeline, "gen_call", v=min_policy_version)
        with self.mailbox.engine:
            self.mailbox.adopt(self._load, min_policy_version, 60.0)
            stamp(self.settings.timeline, "gen_start", v=self.policy_version)
            self._running = True
            try:
                return with_weights_wait(self._generate(prompts, min_policy_version), self.mailbox.waited_s)
            finally:
                stamp(self.settings.timeline, "gen_end", v=self.policy_version)
                self._running = False

    @ray.method(concurrency_group="weights")
    def offer_weights(self, version: int, holder: list) -> None:
        stamp(self.settings.timeline, "offer", v=version)
        if self.mailbox.offer(version, holder):
            self.mailbox.adopt_if_idle(self._load)  # an idle worker: now, or once its weights exist

    def _load(self, version: int, holder: list) -> None:
        stamp(self.settings.timeline, "load_start", v=version)
        payload = ray.get(holder[0])
        stamp(self.settings.timeline, "load_got", v=version)
        self.update_weights(payload)

    @ray.method(concurrency_group="weights")
    def generating(self) -> bool:
        """Whether a generate call is running now, its weights adopted (answered beside it, for tests)."""
        return self._running

    def _generate(self, prompts: list[Prompt], min_policy_version: int) -> list[RolloutGroup]:
        started = time.perf_counter()
        if self.policy_version < min_policy_version:
            raise RuntimeError(f"simulated worker {self.worker_id} holds policy version {self.policy_version}, "
                               f"the controller requires >= {min_policy_version}")
        seed = [self.cfg.seed, zlib.crc32(self.worker_id.encode()), self._num_calls]
        rng = np.random.default_rng(seed)
        self._num_calls += 1
        groups = [self._group(p, rng) for p in prompts]
        tokens = sum(len(c.response_token_ids) for g in groups for c in g.completions)
        s = self.settings
        _deadline_sleep(started, s.seconds_per_call + s.seconds_per_prompt * len(prompts) + s.seconds_per_token * tokens)
        self._stats["generate_seconds"] += time.perf_counter() - started
        return groups

    def _group(self, prompt: Prompt, rng: np.random.Generator) -> RolloutGroup:
        return simulated_group(self.cfg, self.reward, self.vocab_size, self.worker_id, self.policy_version, prompt,
                               rng, self._stats)

    def update_weights(self, payload: WeightPayload) -> int:
        """Adopt ``payload.policy_version``; read or copy the arrays as ``settings.weight_load`` says."""
        started = time.perf_counter()
        mode = self.settings.weight_load
        for name, arr in payload.arrays.items():
            if mode == "touch":
                flat = arr.reshape(-1).view(np.uint8)
                int(flat[::PAGE].sum())
            elif mode == "copy":
                dst = self._loaded.get(name)
                if dst is None or dst.shape != arr.shape or dst.dtype != arr.dtype:
                    dst = self._loaded[name] = np.empty_like(arr)
                np.copyto(dst, arr)
        self.policy_version = payload.policy_version
        self.mailbox.held_version = max(self.mailbox.held_version, payload.policy_version)
        self._stats["num_weight_updates"] += 1
        self._stats["weight_update_seconds"] += time.perf_counter() - started
        self._stats["weight_bytes"] = payload.num_bytes
        return self.policy_version

    def stats(self) -> dict:
        return {**self._stats, "worker_id": self.worker_id, "policy_version": self.policy_version,
                "quantization": "simulated", "engine_build_seconds": 0.0}
