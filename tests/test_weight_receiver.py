"""A rollout worker's readiness for an offered version (``BroadcastReceiver.exists``, and the worker
shell's mailbox using it): the version exists once its broadcast arrives or the object store holds
it, whichever is first. No group and no Ray: versions are delivered to the receiver by hand, the
object store is a function."""

import threading
import time

import actors.rollout_worker as rw
from system.rollout.weight_mailbox import WeightMailbox
from system.weight_generations import BroadcastReceiver
from system.weight_payload import WeightPayload


def version(v: int) -> WeightPayload:
    return WeightPayload(policy_version=v, arrays={}, dtypes={})


def _connected_receiver():
    """A receiver as it is once generation 1's group is up (no group: versions are delivered by hand)."""
    receiver = BroadcastReceiver()
    receiver._generation, receiver._alive, receiver._connected = 1, True, True
    return receiver


def test_an_offer_exists_when_its_broadcast_arrives_without_waiting_for_the_object_store():
    """Version 2 arrives by broadcast 0.2 s in; the object store never has it: the wait ends at the
    arrival, the object store asked without waiting every ``ELSEWHERE_POLL_S`` (5 ms) meanwhile."""
    receiver, asked = _connected_receiver(), []
    threading.Timer(0.2, receiver._arrived, (1, version(2))).start()
    started = time.monotonic()
    assert receiver.exists(2, lambda t: asked.append(t) or False, None)
    assert 0.19 <= time.monotonic() - started < 1.5
    assert len(asked) >= 10 and set(asked) == {0.0}  # ~40 checks in 0.2 s; 10 leaves a busy machine room


def test_an_offer_exists_when_the_object_store_has_it_and_a_receiver_in_no_generation_asks_it_alone():
    receiver = _connected_receiver()
    receiver._arrived(1, version(2))  # an older version arrived; version 3 is in the object store at the 3rd ask
    calls = []
    assert receiver.exists(3, lambda t: calls.append(t) or len(calls) >= 3, None) and len(calls) == 3
    assert receiver.exists(2, lambda t: False, 0.0)  # the one that arrived: at once
    alone, seen = BroadcastReceiver(), []  # in no generation: one wait on the object store, the caller's timeout
    assert alone.exists(3, lambda t: seen.append(t) or True, 2.5) and len(seen) == 1 and 2.4 < seen[0] <= 2.5
    assert not alone.exists(3, lambda t: False, 0.0)


def test_an_offer_neither_source_has_within_the_timeout_does_not_exist():
    receiver = _connected_receiver()
    started = time.monotonic()
    assert not receiver.exists(5, lambda t: False, 0.1)
    assert 0.09 <= time.monotonic() - started < 1.5


def test_an_offer_whose_newer_version_arrived_is_waited_for_in_the_object_store_alone():
    """Version 3 arrived by broadcast; version 2's copy is gone: one wait on the object store, with the
    caller's timeout, not a poll every 5 ms."""
    receiver = _connected_receiver()
    receiver._arrived(1, version(3))
    seen = []
    assert receiver.exists(2, lambda t: seen.append(t) or True, None) and seen == [None]


def test_an_idle_worker_loads_a_broadcast_version_the_object_store_does_not_hold_yet(monkeypatch):
    """The rollout worker's shell, without Ray: version 2 arrived by broadcast, its object-store copy
    does not exist yet (``weights_exist`` says no): the offer is loaded at once, from the broadcast.
    (With readiness from the object store alone, as before, nothing would load: no copy exists.)"""
    monkeypatch.setattr(rw, "weights_exist", lambda holder, timeout_s: False)
    loaded = []

    class Core:
        policy_version = 0

        def update_weights(self, payload):
            loaded.append(payload.policy_version)

    shell = object.__new__(rw.RolloutWorkerShell)
    shell.core, shell.receiver = Core(), _connected_receiver()
    shell.mailbox = WeightMailbox(0, shell._exists)
    shell.weight_sources = {"broadcast": 0, "object_store": 0}
    shell.receiver._arrived(1, version(2))
    shell.offer_weights(2, ["a reference never resolved"])
    assert loaded == [2] and shell.weight_sources == {"broadcast": 1, "object_store": 0}
    assert shell.mailbox.held_version == 2


def test_a_version_the_sender_skipped_costs_the_grace_not_the_whole_wait():
    """Found by a review: a version exported before a re-formed generation settled is never broadcast,
    yet ``take`` (after the object store said it exists) waited its full ``wait_s`` (5 s) with the
    engine held, once per worker at every re-form. Nothing is being received: None after
    ``grace_s``; and at once when a newer version's header is already in."""
    receiver = _connected_receiver()
    receiver._arrived(1, version(1))
    assert receiver.take(1).policy_version == 1
    started = time.monotonic()
    assert receiver.take(2, wait_s=5.0, grace_s=0.1) is None
    assert 0.09 <= time.monotonic() - started < 2.0  # the grace (a busy machine's margin), not wait_s
    receiver._incoming(1, 4)  # version 4's header arrived: 3 was skipped
    started = time.monotonic()
    assert receiver.take(3, wait_s=5.0, grace_s=5.0) is None and time.monotonic() - started < 1.0


def test_a_version_being_received_is_waited_for_beyond_the_grace():
    """Version 2's header is in (its data still copying, or a delta decoding) when the object store
    already holds it: ``take`` waits for the arrival (0.3 s here, past the 0.05 s grace) and returns
    the broadcast copy."""
    receiver = _connected_receiver()
    receiver._incoming(1, 2)
    threading.Timer(0.3, receiver._arrived, (1, version(2))).start()
    started = time.monotonic()
    got = receiver.take(2, wait_s=5.0, grace_s=0.05)
    assert got is not None and got.policy_version == 2 and 0.29 <= time.monotonic() - started < 3.0


def test_a_taken_version_is_not_held_by_the_receiver():
    """Found by a review: the receiver kept the last version it received after the engine loaded it, one
    more full copy of the weights per worker (and its buffer could not be reused for the next one).
    ``take`` hands it over and drops it; the version still counts as received (a second ``take`` and
    ``exists`` do not wait for another broadcast of it)."""
    receiver = _connected_receiver()
    receiver._arrived(1, version(3))
    assert receiver.take(3).policy_version == 3
    assert receiver.latest is None and receiver.newest == 3
    started = time.monotonic()
    assert receiver.take(3, wait_s=5.0, grace_s=5.0) is None and time.monotonic() - started < 1.0
    seen = []
    assert receiver.exists(3, lambda t: seen.append(t) or True, None) and seen == [None]  # the object store alone


def test_a_version_in_flight_in_an_older_generation_is_not_waited_for_after_a_join(monkeypatch):
    """Generation 1's thread had version 5's header when a new generation was joined (a re-form): its
    data will never be handed on (``_arrived`` refuses an older generation's), so ``take(5)`` must not
    wait ``wait_s`` for it. (Generation 2's group is a stand-in that stays forming until the end.)"""
    import system.weight_generations as wg
    from system.weight_broadcast import GroupAddress

    release = threading.Event()

    class Forming:
        def __init__(self, *args, **kwargs):
            release.wait(10)
            raise RuntimeError("the test ended")

    monkeypatch.setattr(wg, "WeightBroadcast", Forming)
    receiver = _connected_receiver()
    receiver._incoming(1, 5)
    try:
        receiver.join(GroupAddress("127.0.0.1", 1, "generation-2", 2), 1, timeout_s=1.0)
        receiver._connected = True  # as once generation 2's group is up (its versions could arrive)
        started = time.monotonic()
        assert receiver.take(5, wait_s=5.0, grace_s=0.05) is None and time.monotonic() - started < 2.0
        assert receiver.incoming is None
    finally:
        release.set()
