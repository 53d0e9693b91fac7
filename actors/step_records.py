"""What the driver holds of a step: the step in flight (``SubmittedStep``), and the step records sent
to the correction service (``RecordsInFlight``; not awaited: its sinks write while the next step
runs), checked as the run goes: a record the service could not write fails the run, naming the cause,
instead of every later record being lost while checkpoints are still published; and the rollout
side's figures of a record, since the previous step (``RolloutSince``); the record itself (``step_record``)."""

import time
from dataclasses import dataclass

import numpy as np

from actors.learner_worker import PendingStep
from actors.remote_errors import process_death, remote_error
from actors.runtime import RAY
from system.learner.batch import LearnerBatch
from system.types import RolloutGroup, StepRecord, StepSeconds


@dataclass(frozen=True)
class SubmittedStep:
    """A step handed to the learner group, and what its record needs once it completes."""

    step: int
    """The step it completes (= the policy version it produces)."""
    groups: list[RolloutGroup]
    batch: LearnerBatch
    waited: float
    """Seconds the learner sat idle waiting for this batch (0 when it was queued ahead)."""
    queued_ahead: bool
    """Submitted while the previous step ran (so the learners went on without a pause)."""
    pending: PendingStep


class RecordsLostError(RuntimeError):
    """The correction service could not write a step's record (``metrics.jsonl``, W&B, a dump)."""


class RecordsInFlight:
    """The ``finish_step`` calls sent and not yet seen to end, checked through ``runtime``
    (``actors.runtime``: Ray's, or an in-process stand-in in the tests)."""

    def __init__(self, runtime=RAY) -> None:
        self.runtime = runtime
        self._sent: list[tuple[int, object]] = []

    def sent(self, step: int, ref) -> None:
        self._sent.append((step, ref))

    def check(self, wait: bool = False) -> None:
        """Raise :class:`RecordsLostError` for the first record the service failed to write; the records
        still being written are left (``wait``: waited for, as before a checkpoint is published)."""
        if not self._sent:
            return
        finished = set(self.runtime.finished([ref for _, ref in self._sent], wait))
        for step, ref in self._sent:
            if ref in finished:
                try:
                    self.runtime.get(ref, timeout=0)  # finished: reads its outcome, never waits
                except self.runtime.task_failed as exc:
                    raise RecordsLostError(f"the record of step {step} could not be written ({remote_error(exc)}); "
                                           "the run stops") from None
                except self.runtime.actor_died as exc:  # found by a review: Ray's whole actor-death text
                    death = process_death(str(exc)) or " ".join(str(exc).split())[:300]
                    raise RecordsLostError(f"the record of step {step} could not be written: the correction "
                                           f"service is gone ({death}); the run stops") from None
        self._sent = [(step, ref) for step, ref in self._sent if ref not in finished]


class RolloutSince:
    """The rollout side's figures of a step record, each since the previous call (the first: since this
    object was made). ``state``: the controller's ``SharedState``."""

    def __init__(self, state) -> None:
        self.state = state
        self._idle_mark = 0.0
        self._rate_mark = (time.perf_counter(), state.generated_tokens)

    def idle_s(self, pool) -> float:
        """Seconds a ready rollout worker sat idle (mean over the ``pool``'s ready workers): the rollout
        side's pause, waiting for newer weights under the staleness bound.

        A worker idle right now counts up to now (``idle_since``): its pause is closed into
        ``rollout_idle_s`` only when it is dispatched again, which for a pause that the step's new weights
        end comes after this record, so the step that caused the pause reported it one step late. The
        part counted here is not counted again (the mark includes it); a worker scaled down while idle
        has its pause closed into the total as it leaves (``RolloutLoop``); the mark never goes back, so
        no step's figure is negative."""
        with self.state.cond:
            now, ready = time.monotonic(), pool.ready()
            total = self.state.rollout_idle_s + sum(now - s.idle_since for s in ready if s.idle_since is not None)
        idle = max(total - self._idle_mark, 0.0)
        self._idle_mark = max(self._idle_mark, total)
        return idle / max(len(ready), 1)

    def tokens_per_s(self) -> float:
        """Generated tokens per second."""
        now, tokens = time.perf_counter(), self.state.generated_tokens
        (t_prev, n_prev), self._rate_mark = self._rate_mark, (now, tokens)
        return (tokens - n_prev) / max(now - t_prev, 1e-9)


def step_record(sub: SubmittedStep, outcome, ledger: dict, rollout: RolloutSince, pool, max_lag: int,
                step_s: float) -> StepRecord:
    """The record of the completed step ``sub`` from rank 0's ``outcome`` (``StepOutcome``), the prompt
    ledger's counts, the rollout side's figures since the previous step and the pool's workers;
    ``step_s``: the wall seconds since the previous step completed."""
    batch = sub.batch
    lags = batch.lag_B(sub.step - 1)
    seconds = StepSeconds(wait_rollout=sub.waited, proximal=outcome.seconds["proximal"],
                          correction=outcome.seconds["correction"], update=outcome.seconds["update"],
                          sync=outcome.seconds["export"], step=step_s, rollout_idle=rollout.idle_s(pool))
    return StepRecord(
        step=sub.step, policy_version=sub.step, reward_mean=float(batch.rewards_B.mean()),
        reward_std=float(batch.rewards_B.std()), lag_mean=float(lags.mean()), lag_max=int(lags.max()),
        tokens_trained=int(batch.response_len_B.sum()), learner=outcome.learner, correction=outcome.correction,
        ledger=ledger, seconds=seconds, rollout_tokens_per_s=rollout.tokens_per_s(),
        weight_sync=outcome.weight_sync,
        # every lag up to max_lag, zeros too: a W&B summary would keep a lag's last non-zero count
        lag_counts=dict(enumerate(np.bincount(lags, minlength=max_lag + 1).tolist())),
        queued_ahead=sub.queued_ahead, workers_ready=len(pool.ready()), worker_failures=pool.failures)
