"""The hand-off of each step's weights from learner rank 0's step thread to its export thread."""

import threading
import time

import pytest

from actors.export_handoff import ExportHandoff


def test_take_waits_for_its_version_and_keeps_nothing():
    handoff = ExportHandoff()
    got = {}
    taker = threading.Thread(target=lambda: got.update(v2=handoff.take(2)))
    taker.start()
    handoff.put(1, "payload 1")  # another version does not wake the waiter with the wrong one
    time.sleep(0.05)
    assert taker.is_alive()
    assert handoff.take(1) == "payload 1"
    handoff.put(2, "payload 2")
    taker.join(5)
    assert got == {"v2": "payload 2"}
    with pytest.raises(TimeoutError, match="policy version 1"):  # handed over once, not kept
        handoff.take(1, timeout_s=0.01)


def test_a_step_waits_while_the_previous_payload_is_untaken():
    """Back-pressure: copies slower than steps never pile payloads up (one waits here at most)."""
    handoff = ExportHandoff()
    handoff.put(1, "payload 1")
    second = threading.Thread(target=handoff.put, args=(2, "payload 2"))
    second.start()
    time.sleep(0.05)
    assert second.is_alive()  # version 1 not taken yet: the step producing version 2 waits
    assert handoff.take(1) == "payload 1"
    second.join(5)
    assert not second.is_alive() and handoff.take(2, timeout_s=1) == "payload 2"
    handoff.put(3, "payload 3")
    third = threading.Thread(target=handoff.put, args=(4, "payload 4"))
    third.start()
    handoff.close()  # a closing rank releases a waiting step
    third.join(5)
    assert not third.is_alive()


def test_a_failed_step_or_a_close_ends_the_wait_with_the_reason():
    handoff = ExportHandoff()
    errors = []

    def take(version):
        try:
            handoff.take(version)
        except RuntimeError as exc:
            errors.append(str(exc))

    waiting = [threading.Thread(target=take, args=(v,)) for v in (3, 4)]
    for t in waiting:
        t.start()
    handoff.fail(3, "ValueError: non-finite loss")
    waiting[0].join(5)
    assert errors == ["the step producing policy version 3 failed: ValueError: non-finite loss"]
    handoff.close()
    waiting[1].join(5)
    assert errors[1] == "the learner rank closed before policy version 4 was exported"
