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
