"""The controller: two loops joined by the trajectory buffer.

    rollout loop (thread)                         train loop (caller's thread)
    ─────────────────────                         ────────────────────────────
    sampler ─prompts─▶ idle worker (admitted)     buffer.take(B, version k)  (stale groups dropped)
    worker ─groups─▶ ledger.mark_generated        ─▶ learners: proximal log-probs old   [N, T]
            ─▶ buffer.add                          ─▶ correction service: weights, metrics, dumps
    newer weights? push before the next generate   ─▶ learners: train step; version k+1
                                                   ─▶ export weights ─▶ published for the rollout loop

Admission (``async.max_lag``): a generate call is sent to a worker holding version ``v`` only
if the step that will consume its groups, ``k = steps_started + (buffered + in flight) // B``,
satisfies ``k - v <= max_lag``. ``max_lag = 0`` is the synchronous on-policy mode. The
buffer re-checks the bound at batch time, so no trained sample ever exceeds it.
"""

import threading
import time

import numpy as np
import ray

from actors.rollout_pool import RolloutPool, WorkerSlot
from actors.weight_sync import WeightTransport
from system.config import RunConfig
from system.data.buffer import TrajectoryBuffer
from system.data.sampler import PromptSampler
from system.types import RolloutGroup


class RolloutLoop:
    """Keeps every admitted worker generating; owns every call made to the workers."""

    def __init__(self, cfg: RunConfig, pool: RolloutPool, sampler: PromptSampler,
                 buffer: TrajectoryBuffer, state: "SharedState", transport: WeightTransport) -> None:
        self.cfg, self.pool, self.sampler, self.buffer, self.state = cfg, pool, sampler, buffer, state
        self.transport = transport
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rollout-loop", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self._push_weights()
                self._dispatch()
                self._collect(timeout=0.05)
        except BaseException as exc:  # surfaced to the train loop, which fails the run
            self.error = exc
            with self.state.cond:
                self.state.cond.notify_all()

    def _push_weights(self) -> None:
        version, ref = self.state.published
        for slot in self.pool.slots.values():
            if slot.policy_version < version:
                self.transport.push(slot.handle, ref)
                slot.policy_version = version

    def _inflight_prompts(self) -> int:
        return sum(len(s.inflight_prompts) for s in self.pool.busy())

    def _admitted(self, slot: WorkerSlot) -> bool:
        per_step = self.cfg.prompts_per_step
        with self.state.cond:
            queued = len(self.buffer) + self._inflight_prompts()
            consuming_step = self.state.steps_started + queued // per_step
        return consuming_step - slot.policy_version <= self.cfg.async_.max_lag and \
            consuming_step < self.cfg.max_steps

    def _dispatch(self) -> None:
        for slot in self.pool.idle():
            if not self._admitted(slot):
                continue
            with self.state.cond:
                prompts = self.sampler.next_prompts(self.cfg.rollout.prompts_per_call)
            slot.inflight_prompts = prompts
            slot.inflight = slot.handle.generate.remote(prompts, slot.policy_version)

    def _collect(self, timeout: float) -> None:
        refs = [s.inflight for s in self.pool.busy()]
        if not refs:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        for ref in ready:
            slot = self.pool.by_ref(ref)
            groups: list[RolloutGroup] = ray.get(ref)
            slot.inflight, slot.inflight_prompts = None, []
            with self.state.cond:
                for g in groups:
                    if self.sampler.mark_generated(g.prompt.prompt_id):
                        self.buffer.add(g)
                        self.state.generated_tokens += sum(len(c.response_token_ids) for c in g.completions)
                self.state.cond.notify_all()

    def drain(self, timeout: float) -> None:
        """Stop dispatching; collect (and account for) what is still in flight."""
        self.stop.set()
        self.thread.join()
        deadline = time.monotonic() + timeout
        while self.pool.busy() and time.monotonic() < deadline:
            self._collect(timeout=0.5)
        with self.state.cond:
            for slot in self.pool.busy():
                self.sampler.requeue([p.prompt_id for p in slot.inflight_prompts])


class SharedState:
    """What both loops read: steps started, the latest published weights, counters; one condition."""

    def __init__(self, steps_done: int, initial_weights: tuple[int, ray.ObjectRef | None]) -> None:
        self.cond = threading.Condition()
        self.steps_started = steps_done
        self.published = initial_weights
        self.generated_tokens = 0

    def publish(self, version: int, ref: ray.ObjectRef) -> None:
        with self.cond:
            self.published = (version, ref)


def take_batch(cfg: RunConfig, buffer: TrajectoryBuffer, sampler: PromptSampler, state: SharedState,
               learner_version: int, rollout: RolloutLoop) -> tuple[list[RolloutGroup], float]:
    """Block until B admissible groups are buffered; drop stale ones with a reason. (groups, seconds waited)."""
    started = time.perf_counter()
    with state.cond:
        while True:
            if rollout.error is not None:
                raise RuntimeError(f"the rollout loop failed: {rollout.error!r}") from rollout.error
            groups, stale = buffer.take(cfg.prompts_per_step, learner_version)
            for g in stale:
                sampler.mark_dropped(g.prompt.prompt_id, "stale")
            if groups:
                state.steps_started += 1
                return groups, time.perf_counter() - started
            state.cond.wait(timeout=1.0)


def lag_stats(groups: list[RolloutGroup], learner_version: int) -> dict[str, float]:
    lags = np.array([learner_version - g.policy_version for g in groups for _ in g.completions])
    return {"staleness/lag_mean": float(lags.mean()), "staleness/lag_max": int(lags.max())}
