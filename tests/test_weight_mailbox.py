"""A rollout worker's weight mailbox (``system.rollout.weight_mailbox``), with threads and no Ray."""

import threading
import time

import pytest

from system.rollout.weight_mailbox import WeightMailbox


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
