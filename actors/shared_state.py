"""What the train loop and the rollout loop share (``SharedState``: one condition, the weights to offer,
counters) and the train loop's wait for a batch (``take_batch``); the loops themselves are drawn in
``actors.controller``."""

import logging
import threading
import time

import ray

from actors.remote_errors import remote_error
from system.config import RunConfig
from system.data.buffer import TrajectoryBuffer
from system.data.sampler import PromptSampler
from system.types import RolloutGroup

log = logging.getLogger(__name__)


class SharedState:
    """What both loops read: steps started, the weights to offer, counters; one condition."""

    def __init__(self, steps_done: int, initial_weights: tuple[int, ray.ObjectRef | None]) -> None:
        self.cond = threading.Condition()
        self.steps_started = steps_done
        self.generated_tokens = 0
        self.offers: dict[int, ray.ObjectRef | None] = dict([initial_weights])
        """The versions to offer: the last finished one and those whose steps were submitted since."""
        self.rollout_idle_s = 0.0
        """Seconds ready rollout workers sat idle (held back by the staleness bound, i.e. waiting for
        newer weights, or with nothing left to generate), summed over workers: counted by the driver
        when a worker without calls is dispatched again, and reported by a worker for a call that
        waited inside it for the weights it required (``RolloutGroup.weights_wait_s``); a worker
        scaled down while idle adds its pause as it leaves. A step record also counts the pauses still
        open (``actors.step_records.RolloutSince``)."""

    def wake(self) -> None:
        """Wake every waiter on the condition (e.g. when a learner step has ended)."""
        with self.cond:
            self.cond.notify_all()

    def publish(self, version: int, ref: ray.ObjectRef) -> None:
        """Version ``version`` will be at ``ref`` (its step may still run)."""
        with self.cond:
            self.offers[version] = ref
            self.cond.notify_all()  # the rollout loop pushes the new weights at once

    def finished(self, version: int) -> None:
        """Version ``version``'s step has ended: older versions are no longer offered."""
        with self.cond:
            for v in [v for v in self.offers if v < version]:
                del self.offers[v]


def take_batch(cfg: RunConfig, buffer: TrajectoryBuffer, sampler: PromptSampler, state: SharedState,
               learner_version: int, rollout, give_up=None,
               poll_s: float = 1.0, warn: bool = True) -> tuple[list[RolloutGroup], float]:
    """Block until B admissible groups are buffered; drop stale ones with a reason. (groups, seconds waited).

    With ``give_up`` (a callable, checked whenever the condition is notified, and every ``poll_s``):
    ``([], seconds)`` as soon as it returns True before the batch is ready
    (queueing a step ahead stops once the running step has ended; its end notifies the condition,
    ``SharedState.wake``; a stop request ends the wait for a batch that may never come). ``warn``: say
    on the console after every ``report.stall_warning_s`` without a batch (off when queueing ahead: the
    wait then lasts as long as the running step, whose own wait warns). ``rollout``: the
    ``actors.controller.RolloutLoop`` (its error and its pool's ready workers)."""
    started = time.perf_counter()
    stall_s = cfg.report.stall_warning_s
    warn_at = started + stall_s if warn else float("inf")
    with state.cond:
        while True:
            if time.perf_counter() >= warn_at:
                log.warning("no batch for step %d after %.0f s: %d of %d groups buffered, %d rollout worker(s) "
                            "ready (a worker stuck in a generate call, or too few workers for the batch)",
                            learner_version + 1, time.perf_counter() - started, len(buffer), cfg.prompts_per_step,
                            len(rollout.pool.ready()))
                warn_at += stall_s
            if rollout.error is not None:
                # the cause and the actor method in the line (its repr was "RayTaskError(OSError)()")
                raise RuntimeError(f"the rollout loop failed: {remote_error(rollout.error, with_type=True)}") from rollout.error
            groups, stale = buffer.take(cfg.prompts_per_step, learner_version)
            for g in stale:
                sampler.mark_dropped(g.prompt.prompt_id, "stale")
            if groups:
                state.steps_started += 1
                state.cond.notify_all()  # admission may now let an idle worker generate
                return groups, time.perf_counter() - started
            if give_up is not None and give_up():
                return [], time.perf_counter() - started
            state.cond.wait(timeout=poll_s)
