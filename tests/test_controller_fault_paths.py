"""The rollout loop's fault paths around a run's end and scaling to 0 (``actors.controller.RolloutLoop``),
on the in-process stand-in runtime of ``test_controller_logic``."""

from controller_fakes import WorkerDied
from test_controller_logic import build, ticks

from system.config.loading import resolve_config


def _small(loop, pool, *extra):
    loop.cfg = pool.cfg = resolve_config(overrides=[
        "async.max_lag=1", "prompts_per_step=2", "rollout.prompts_per_call=2", "rollout.group_size=2",
        "rollout.num_workers=1", "max_steps=50", "rollout.calls_per_worker=2", *extra])


def test_a_worker_that_fails_to_start_during_the_drain_does_not_fail_the_end_of_the_run():
    """Found by a review: with ``rollout.max_start_failures=1``, a worker still starting when the run
    stops (a scale-up, a replacement) whose start fails made ``drain`` raise, so the run ended without
    its final checkpoint and report. While stopping, it is removed and the drain goes on; the busy
    worker's prompts are still handed back."""
    from controller_fakes import Ref

    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    _small(loop, pool, "rollout.max_start_failures=1")
    cls.handles["rollout-0"].held[0] = True
    ticks(loop, 2)  # rollout-0 holds two calls
    [replacement] = pool.launch(1)
    replacement.starting = Ref(error=WorkerDied("rollout-1: engine build failed"))
    loop.drain(timeout=1.0)  # raised "1 rollout workers in a row failed to start" before
    assert "rollout-1" not in pool.slots
    counts = sampler.counts()
    assert counts["issued"] == counts["trained"] + counts["dropped"] + counts["in_flight"] + counts["buffered"]


def test_scaling_to_zero_after_a_loss_does_not_fail_the_run_on_the_worker_timeout():
    """Found by a review: a worker lost around ``aisrl scale --workers 0`` started the no-worker clock,
    and with none expected back the run failed after ``rollout.worker_timeout_s`` ("no rollout worker
    has been alive"). At a target of 0 no worker is missed."""
    import time

    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    _small(loop, pool, "rollout.worker_timeout_s=0.2")
    w = cls.handles["rollout-0"]
    w.held[0] = True
    ticks(loop, 2)  # two calls in flight
    loop.desired_workers = 0
    ticks(loop, 2)
    assert pool.slots["rollout-0"].retiring
    for r in w.held[1:]:  # the retiring worker's node goes away, its calls with it
        r.error, r.ready = WorkerDied("rollout-0 died"), True
    ticks(loop, 2)
    assert not pool.slots and sampler.counts()["in_flight"] == 4
    time.sleep(0.3)
    loop.tick(timeout=0)  # raised after the 0.2 s before
    loop.desired_workers = 1  # scaled up again: a worker is launched
    loop.tick(timeout=0)
    assert len(pool.slots) == 1
