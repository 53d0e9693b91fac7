"""``time/rollout_idle`` in the step that caused the pause (``actors.step_records.RolloutSince``): a
worker idle while a step's record is made counts up to then, and the rest of its pause goes to the
next step; nothing is counted twice. Found by a review: the pause was added to the total only when
the worker was dispatched again, after the new weights, so each step reported the previous one's."""

import time
from dataclasses import dataclass

import pytest

from actors.shared_state import SharedState
from actors.step_records import RolloutSince


@dataclass
class Slot:
    idle_since: float | None = None


class Pool:
    def __init__(self, *slots: Slot) -> None:
        self.slots = list(slots)

    def ready(self) -> list[Slot]:
        return self.slots


def test_an_open_pause_counts_in_the_step_it_happens_and_the_rest_in_the_next():
    state = SharedState(0, (0, None))
    a, b = Slot(), Slot()
    pool, since = Pool(a, b), RolloutSince(state)
    t0 = time.monotonic()
    a.idle_since = t0 - 0.5  # a: idle for 0.5 s so far; b busy
    first = since.idle_s(pool)
    now1 = time.monotonic()
    # mean over the two ready workers: a's 0.5 s (and the microseconds to the call) / 2
    assert 0.5 / 2 <= first <= (now1 - a.idle_since) / 2
    # a is dispatched 0.3 s after its pause began... counted when it is: the driver adds the whole
    # pause (0.8 s) to the total; the next record gets what the first did not (0.8 - first * 2)
    state.rollout_idle_s += 0.8
    a.idle_since = None
    second = since.idle_s(pool)
    assert second * 2 == pytest.approx(0.8 - first * 2, abs=1e-9)
    assert (first + second) * 2 == pytest.approx(0.8, abs=1e-9)  # the pause, once
    assert since.idle_s(pool) == 0.0  # nothing new


def test_the_figure_is_never_negative():
    """A ready worker's open pause that vanishes from the sum without being closed into the total (a
    slot gone from the pool by a path that did not close it) leaves the mark where it was: that step
    reads 0, and only the total's growth past the mark is counted later."""
    state = SharedState(0, (0, None))
    a = Slot(idle_since=time.monotonic() - 1.0)
    pool, since = Pool(a, Slot()), RolloutSince(state)
    assert since.idle_s(pool) >= 0.5  # 1 s over two workers
    pool.slots = [Slot()]
    assert since.idle_s(pool) == 0.0
    state.rollout_idle_s += 0.25  # below the mark (1 s): not shown
    assert since.idle_s(pool) == 0.0
    state.rollout_idle_s += 1.0  # the total passes the mark again: the excess is counted
    assert since.idle_s(pool) == pytest.approx(0.25, abs=0.02)


def test_a_worker_scaled_down_while_idle_keeps_its_pause():
    """The real loop over the in-process runtime (``tests/test_controller_logic.py``'s set-up): two
    workers held back by the staleness bound (no step runs), one retired. Its open pause is closed
    into the total as it leaves: the idle figure after it equals both workers' pauses."""
    from test_controller_logic import build, ticks

    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1, workers=2)
    ticks(loop, 6)  # each worker generated what the bound allows for steps 0 and 1, then waits
    slots = pool.ready()
    assert len(slots) == 2 and all(s.idle_since is not None and not s.calls for s in slots)
    since = RolloutSince(state)
    start = time.monotonic()
    for s in slots:
        s.idle_since = start - 1.0  # both idle for a second
    idle_before = state.rollout_idle_s
    loop.desired_workers = 1
    ticks(loop, 1)
    assert len(pool.slots) == 1
    assert 1.0 <= state.rollout_idle_s - idle_before <= 1.0 + (time.monotonic() - start)  # the leaver's second
    # the record (its mark starts at 0: it also holds the pauses before, idle_before): the leaver's
    # closed second plus the stayer's open one, over the one ready worker
    assert 2.0 <= since.idle_s(pool) - idle_before <= 2.0 + 2 * (time.monotonic() - start)
