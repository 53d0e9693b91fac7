"""A rollout worker's weight mailbox (``system.rollout.weight_mailbox``), with threads and no Ray."""

import threading
import time

import pytest

from system.rollout.weight_mailbox import WeightMailbox, with_weights_wait
from system.types import GroupList, Prompt, RolloutGroup


class Engine:
    """Records what was loaded, in order."""

    def __init__(self, fail_once: bool = False) -> None:
        self.loaded: list[tuple[int, str]] = []
        self.fail_once = fail_once

    def load(self, version: int, source: str) -> None:
        if self.fail_once:
            self.fail_once = False
            raise OSError("load failed")
        self.loaded.append((version, source))


def test_a_call_adopts_only_the_newest_offer_and_older_offers_are_ignored():
    box, engine = WeightMailbox(held_version=0), Engine()
    assert box.offer(2, "v2") and box.offer(5, "v5")
    assert not box.offer(4, "v4")  # older than the newest offer
    assert box.adopt(engine.load) == 5
    assert engine.loaded == [(5, "v5")]  # 2 skipped: only the newest is loaded
    assert not box.offer(5, "again") and not box.offer(3, "v3")  # not newer than the held version
    assert box.adopt(engine.load) == 5 and engine.loaded == [(5, "v5")]


def test_a_call_waits_for_the_version_it_requires_and_gives_up_after_the_timeout():
    box, engine = WeightMailbox(held_version=1), Engine()
    threading.Timer(0.2, box.offer, args=(3, "v3")).start()
    started = time.monotonic()
    assert box.adopt(engine.load, min_version=3, timeout_s=10.0) == 3
    assert 0.15 < time.monotonic() - started < 5.0  # woken by the offer, not by the timeout
    started = time.monotonic()
    assert box.adopt(engine.load, min_version=4, timeout_s=0.2) == 3  # never offered: held version returned
    assert time.monotonic() - started >= 0.19


def test_an_idle_engine_loads_an_offer_at_once_a_busy_one_leaves_it_for_its_next_call():
    box, engine = WeightMailbox(held_version=0), Engine()
    box.offer(1, "v1")
    assert box.try_adopt(engine.load) and engine.loaded == [(1, "v1")]  # idle: loaded now
    with box.engine:  # a call is generating
        box.offer(2, "v2")
        assert not box.try_adopt(engine.load) and engine.loaded == [(1, "v1")]
        assert box.adopt(engine.load) == 2  # the running call's successor, holding the engine, adopts it
    assert engine.loaded == [(1, "v1"), (2, "v2")]


def test_a_failed_load_keeps_the_offer_for_the_next_call():
    box, engine = WeightMailbox(held_version=0), Engine(fail_once=True)
    box.offer(1, "v1")
    with pytest.raises(OSError):
        box.adopt(engine.load)
    assert box.held_version == 0 and box.offered_version() == 1
    assert box.adopt(engine.load) == 1 and engine.loaded == [(1, "v1")]


class Steps:
    """Offered sources whose weights exist once ``make`` is called (the step producing them ends)."""

    def __init__(self) -> None:
        self.made: dict[str, threading.Event] = {}

    def source(self, name: str) -> str:
        self.made[name] = threading.Event()
        return name

    def make(self, name: str) -> None:
        self.made[name].set()

    def ready(self, source: str, timeout_s: float | None) -> bool:
        return self.made[source].wait(timeout_s) if timeout_s != 0 else self.made[source].is_set()


def test_a_pending_offer_does_not_hold_back_a_call_its_held_version_satisfies():
    steps = Steps()
    box, engine = WeightMailbox(held_version=1, ready=steps.ready), Engine()
    assert box.offer(2, steps.source("v2"))  # offered while its step runs
    assert box.adopt(engine.load, min_version=1) == 1 and engine.loaded == [] and box.waited_s == 0.0
    steps.make("v2")
    assert box.adopt(engine.load, min_version=1) == 2 and engine.loaded == [(2, "v2")]


def test_a_call_that_requires_a_pending_version_waits_until_it_exists_past_the_offer_timeout():
    steps = Steps()
    box, engine = WeightMailbox(held_version=1, ready=steps.ready), Engine()
    box.offer(2, steps.source("v2"))
    threading.Timer(0.3, steps.make, args=("v2",)).start()
    started = time.monotonic()
    # the offer timeout (0.1 s) bounds waiting for an OFFER; an offered version is waited for as long
    # as its step takes
    assert box.adopt(engine.load, min_version=2, timeout_s=0.1) == 2 and engine.loaded == [(2, "v2")]
    assert 0.25 < time.monotonic() - started < 5.0 and 0.25 < box.waited_s < 5.0


def test_the_newest_existing_offer_is_adopted_before_a_newer_pending_one():
    steps = Steps()
    box, engine = WeightMailbox(held_version=1, ready=steps.ready), Engine()
    box.offer(2, steps.source("v2"))
    box.offer(3, steps.source("v3"))  # queued ahead: two steps in flight
    steps.make("v2")
    assert box.adopt(engine.load) == 2 and box.offered_version() == 3
    assert not box.offer(3, "again")  # still offered, not newer
    steps.make("v3")
    assert box.adopt(engine.load) == 3 and engine.loaded == [(2, "v2"), (3, "v3")]


def test_a_call_that_requires_a_pending_version_does_not_load_an_older_existing_one_first():
    """Held 1, offered 2 (exists) and 3 (its step still runs), the call requires 3: loading 2 would be a
    whole weight update replaced unused before the call samples, so only 3 is loaded, once it exists."""
    steps = Steps()
    box, engine = WeightMailbox(held_version=1, ready=steps.ready), Engine()
    box.offer(2, steps.source("v2"))
    box.offer(3, steps.source("v3"))
    steps.make("v2")
    threading.Timer(0.2, steps.make, args=("v3",)).start()
    assert box.adopt(engine.load, min_version=3, timeout_s=5.0) == 3
    assert engine.loaded == [(3, "v3")]


def test_an_offer_that_arrives_while_an_idle_load_runs_is_loaded_by_it_before_it_returns():
    """An idle worker loading v1 in the background (``try_adopt`` holds the engine) when v2, whose
    weights already exist, is offered: the offer's own ``try_adopt`` finds the engine held, so the
    running one loads v2 as well before it returns (else v2 would wait for the next generate call)."""
    box = WeightMailbox(held_version=0)
    loading, release, loaded = threading.Event(), threading.Event(), []

    def load(version, source):
        if version == 1:
            loading.set()
            release.wait(5)
        loaded.append(version)

    box.offer(1, "v1")
    idle = threading.Thread(target=box.try_adopt, args=(load,))
    idle.start()
    assert loading.wait(5)
    box.offer(2, "v2")
    assert not box.try_adopt(load)  # the engine is busy with v1
    release.set()
    idle.join(5)
    assert loaded == [1, 2] and box.held_version == 2


def test_an_idle_worker_loads_a_pending_offer_once_it_exists():
    steps = Steps()
    box, engine = WeightMailbox(held_version=0, ready=steps.ready), Engine()
    box.offer(1, steps.source("v1"))
    assert not box.try_adopt(engine.load) and engine.loaded == []  # idle, but the weights do not exist yet
    waiter = box.load_when_ready(engine.load)
    assert waiter is not None and waiter.is_alive()
    steps.make("v1")
    waiter.join(timeout=5.0)
    assert engine.loaded == [(1, "v1")] and box.held_version == 1
    assert box.load_when_ready(engine.load) is None  # nothing pending


def test_the_wait_rides_on_the_first_group_of_the_call():
    def group(pid: str) -> RolloutGroup:
        return RolloutGroup(Prompt(pid, "1+2=", "3"), (), policy_version=2)

    groups = [group("a"), group("b")]
    unchanged = with_weights_wait(groups, 0.0)
    assert isinstance(unchanged, GroupList) and all(a is b for a, b in zip(unchanged, groups, strict=True))
    waited = with_weights_wait(groups, 0.4)
    assert [g.weights_wait_s for g in waited] == [0.4, 0.0] and [g.prompt.prompt_id for g in waited] == ["a", "b"]


def test_an_offer_drops_the_older_ones_once_a_newer_one_exists():
    """A busy worker offered 1, 2 (both produced) and 3 (in training) keeps only 2 and 3: 1 would never
    be adopted and would only keep its copy of the weights alive."""
    steps = Steps()
    box, engine = WeightMailbox(held_version=0, ready=steps.ready), Engine()
    with box.engine:  # generating
        box.offer(1, steps.source("v1"))
        steps.make("v1")
        box.offer(2, steps.source("v2"))
        assert sorted(box._offers) == [1, 2]  # 2 not produced yet: 1 may still be the one to adopt
        steps.make("v2")
        box.offer(3, steps.source("v3"))
        assert sorted(box._offers) == [2, 3]
    assert box.adopt(engine.load) == 2 and engine.loaded == [(2, "v2")]


def test_weights_that_appear_between_an_offers_two_looks_are_loaded_at_once():
    """An idle worker offered v1 while its step runs: ``try_adopt`` finds no weights, the step ends, and
    ``load_when_ready`` then finds them: it loads v1 itself (before, it returned and nothing loaded v1
    until the next generate call)."""
    steps = Steps()
    box, engine = WeightMailbox(held_version=0, ready=steps.ready), Engine()
    box.offer(1, steps.source("v1"))
    assert not box.try_adopt(engine.load)
    steps.make("v1")  # the step ends between the two looks
    assert box.load_when_ready(engine.load) is None
    assert engine.loaded == [(1, "v1")] and box.held_version == 1


def test_a_call_does_not_spin_when_a_zero_timeout_check_lags_the_blocking_wait():
    """Weights that a blocking wait sees but a zero-timeout check does not (yet): the call loads what the
    wait saw instead of looping between the two checks forever with the engine held."""
    checks = []

    def lagging(source, timeout_s):
        checks.append(timeout_s)
        return timeout_s is None  # exists when waited for, never on a zero-timeout check

    box, engine = WeightMailbox(held_version=0, ready=lagging), Engine()
    box.offer(1, "v1")
    done = []
    call = threading.Thread(target=lambda: done.append(box.adopt(engine.load, min_version=1, timeout_s=0.01)))
    call.start()
    call.join(timeout=5.0)
    assert not call.is_alive() and done == [1] and engine.loaded == [(1, "v1")]
    assert len(checks) < 10


def test_an_idle_workers_failed_load_is_left_to_the_next_call():
    """``adopt_if_idle`` (the offer's own path) swallows a failed load (a failed step): the offer stays,
    and the next generate call's load raises it or succeeds."""
    box, engine = WeightMailbox(held_version=0), Engine(fail_once=True)
    box.offer(1, "v1")
    assert box.adopt_if_idle(engine.load) is None
    assert engine.loaded == [] and box.offered_version() == 1
    assert box.adopt(engine.load) == 1 and engine.loaded == [(1, "v1")]
