"""Learner rank 0's export into the broadcast's shared segment (``BroadcastSender.arena``): a version
exported there is *lent* (Ray still copies it into the object store after ``send``), and nothing
rewrites the segment until it is released; a lend never released moves the next version to a new
segment instead of blocking for ever. Ray-free: the generation is a stand-in that records what the
sender asks of it (the real group's side is in ``test_weight_broadcast``)."""

import os
import threading
import time

import numpy as np
import pytest

from system import shared_segment
from system.weight_delta import DeltaEncoder
from system.weight_generations import BroadcastSender
from system.weight_payload import WeightPayload


class Generation:
    """What ``BroadcastSender`` uses of a connected ``WeightBroadcast``: views of a segment, leaving
    it (the next views come from a new one), and sends."""

    shared, world_size = True, 2

    def __init__(self) -> None:
        self.segment = np.zeros(256, dtype=np.uint8)
        self.left, self.sent = 0, []

    def arena(self, sizes):
        return {name: self.segment[64 * i:64 * i + n] for i, (name, n) in enumerate(sorted(sizes.items()))}

    def leave_segment(self):
        self.left += 1
        self.segment = np.zeros(256, dtype=np.uint8)

    def discard_unannounced(self):
        pass  # the real group's side: ``test_a_withdrawn_export_leaves_no_segment_name_behind``

    def send(self, payload):
        self.sent.append(payload.policy_version)
        # as ``WeightBroadcast.send`` counts it: nothing copied for arrays already in the segment
        self.copied_bytes = sum(a.nbytes for a in payload.arrays.values() if not np.shares_memory(a, self.segment))
        return 8

    def close(self):
        self.segment = None


def sender_with(generation: Generation, wait_s: float = 0.3) -> BroadcastSender:
    sender = BroadcastSender()
    sender._group, sender.lend_wait_s = generation, wait_s
    return sender


def payload(version: int) -> WeightPayload:
    return WeightPayload(version, {"w": np.zeros(4, dtype=np.int16)}, {"w": "bfloat16"})


def timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t0


def test_a_released_version_lets_the_next_one_use_the_same_segment():
    gen = Generation()
    sender = sender_with(gen, wait_s=30.0)
    first = sender.arena({"w": 8}, 1)
    assert first["w"].base is gen.segment or np.shares_memory(first["w"], gen.segment)
    sender.send(payload(1))  # the lent version itself: sent at once, nothing to wait for
    sender.release(1)
    second, waited = timed(sender.arena, {"w": 8}, 2)
    assert waited < 5.0 and gen.left == 0 and np.shares_memory(second["w"], first["w"])


def test_a_lend_never_released_moves_the_next_version_to_a_new_segment():
    gen = Generation()
    sender = sender_with(gen, wait_s=0.3)
    old = sender.arena({"w": 8}, 1)["w"]
    old[:] = 7  # version 1, still being read
    new, waited = timed(sender.arena, {"w": 8}, 2)
    assert waited >= 0.3 and gen.left == 1 and sender.moved_segments == 1
    new = new["w"]
    new[:] = 9
    assert (old == 7).all() and not np.shares_memory(new, old)  # version 1 left untouched


def test_a_release_during_the_wait_ends_it_without_moving():
    gen = Generation()
    sender = sender_with(gen, wait_s=30.0)
    sender.arena({"w": 8}, 4)
    threading.Timer(0.2, sender.release, args=(4,)).start()
    _, waited = timed(sender.arena, {"w": 8}, 5)
    assert 0.1 < waited < 10.0 and gen.left == 0


def test_sending_another_payload_waits_for_the_lent_one_but_the_lent_one_goes_at_once():
    gen = Generation()
    sender = sender_with(gen, wait_s=0.3)
    sender.arena({"w": 8}, 1)
    _, waited = timed(sender.send, payload(1))
    assert waited < 0.25 and gen.left == 0  # the lent version is the payload: the segment holds it
    _, waited = timed(sender.send, payload(2))  # written into the segment: version 1 may still be read
    assert waited >= 0.3 and gen.left == 1 and gen.sent == [1, 2]
    _, waited = timed(sender.send, payload(3))  # nothing lent any more
    assert waited < 0.25 and gen.left == 1


def test_a_withdrawn_lend_and_a_closed_generation_hold_nothing():
    gen = Generation()
    sender = sender_with(gen, wait_s=30.0)
    sender.arena({"w": 8}, 1)
    sender.release(1)
    sender.arena({"w": 8}, 2)
    sender.withdraw(1)  # not the lent version: version 2 stays lent
    assert sender._lent == 2
    sender.withdraw(2)  # its step failed: never handed on
    _, waited = timed(sender.arena, {"w": 8}, 3)
    assert waited < 5.0 and gen.left == 0
    sender.close()
    assert sender._lent is None


def test_no_arena_with_deltas_without_a_generation_or_without_shared_memory():
    encoded = BroadcastSender(encoder=DeltaEncoder(rank=2, full_every=4, seed=0))
    encoded._group = Generation()
    assert encoded.arena({"w": 8}, 1) is None  # the wire carries deltas, not the exported arrays
    assert BroadcastSender().arena({"w": 8}, 1) is None  # no generation connected
    sockets = Generation()
    sockets.shared = False
    assert sender_with(sockets).arena({"w": 8}, 1) is None


def test_the_metrics_say_whether_a_version_went_out_in_place():
    # version 1 is written into the lent views (as rank 0's export does): in place; version 2 is a
    # fresh payload, copied into the segment by the send: not in place
    gen = Generation()
    sender = sender_with(gen, wait_s=30.0)
    views = sender.arena({"w": 8}, 1)
    lent = WeightPayload(1, {"w": views["w"].view(np.int16)}, {"w": "bfloat16"})
    assert sender.send(lent)["broadcast_in_place"] == 1
    sender.release(1)
    assert sender.send(payload(2))["broadcast_in_place"] == 0
    sender.close()
    assert sender.send(payload(3))["broadcast_in_place"] == 0  # no generation: nothing sent


def test_after_a_fallback_to_the_sockets_a_lent_version_holds_nothing_up():
    # version 1 lent in the segment, then the generation falls back to gloo (the segment is gone):
    # sending version 2 over the sockets waits for no release, and moves no segment
    gen = Generation()
    sender = sender_with(gen, wait_s=5.0)
    sender.arena({"w": 8}, 1)
    gen.shared = False
    metrics, waited = timed(sender.send, payload(2))
    assert waited < 2.0 and metrics["broadcast_segment_moves"] == 0 and gen.left == 0


@pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm")
def test_a_withdrawn_export_leaves_no_segment_name_behind():
    # a one-member generation of the real group: ``arena`` makes a segment whose name stays until a
    # version announces it; a step that fails after exporting withdraws it, and the name goes with it
    # (a full-size file in /dev/shm, where Ray's object store lives too, otherwise)
    sender = BroadcastSender(timeout_s=30.0, shared_memory=True)
    sender.open("lend-test", 1, "127.0.0.1")
    deadline = time.monotonic() + 30
    while sender._settle() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    mine = lambda: {f.name for f in shared_segment.SHM_DIR.glob(f"aisrl-{os.getpid()}-*")}  # noqa: E731
    before = mine()
    assert sender.arena({"w": 1 << 16}, 1) is not None
    made = mine() - before
    assert len(made) == 1  # the segment, named until announced
    sender.withdraw(1)
    assert mine() == before
    assert sender.arena({"w": 1 << 16}, 2) is not None and len(mine() - before) == 1  # the next one: a new segment
    sender.close()
    assert mine() == before  # closing the sender (a rank's close) removes an unannounced one too
