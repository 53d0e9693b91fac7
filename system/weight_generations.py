"""The weight broadcast across generations: learner rank 0's side (:class:`BroadcastSender`) and a
rollout worker's (:class:`BroadcastReceiver`) over a succession of ``system.weight_broadcast``
groups. A generation is formed without blocking anyone (the members join in the background); the
learner never waits for one to form, only for a broadcast in progress; a failed broadcast drops
the generation, and the caller forms the next one.
"""

import threading
import time
from collections.abc import Callable

import numpy as np

from system import shared_segment
from system.weight_broadcast import BroadcastFailed, GroupAddress, WeightBroadcast, host_store
from system.weight_delta import DeltaDecoder, DeltaEncoder, is_delta
from system.weight_payload import WeightPayload

TAKE_GRACE_S = 0.05
"""How long :meth:`BroadcastReceiver.take` waits for a version whose header has not arrived (see there)."""

ELSEWHERE_POLL_S = 0.005
"""How often :meth:`BroadcastReceiver.exists` asks the other source while it waits for a broadcast."""


class BroadcastSender:
    """Member 0's side across generations (the learner's rank 0).

    :meth:`open` hosts a new generation and returns at once (the members join in the background);
    :meth:`send` broadcasts a version if the current generation is connected, and otherwise skips
    it (the workers then load that version from the object store): the learner never waits for a
    generation to form, only for a broadcast in progress. A failed broadcast drops the generation.

    Export in place (:meth:`arena`, full versions over a shared segment only): learner rank 0
    writes version v straight into the segment, and the payload it hands on (Ray's copy of it into
    the object store, made on another thread after :meth:`send`) is made of views of the segment.
    So v is *lent* until the caller says it is no longer read (:meth:`release`), and nothing
    rewrites the segment before that: the next :meth:`arena` or a :meth:`send` of another payload
    waits for the release up to ``lend_wait_s``, then moves to a new segment (the old memory stays
    mapped by v's views until they go).
    """

    def __init__(self, timeout_s: float = 60.0, chunk_bytes: int = 64 << 20,
                 encoder: DeltaEncoder | None = None, shared_memory: bool = False) -> None:
        """``encoder``: send lossy deltas (``system.weight_delta``); None sends every version in full.
        ``shared_memory``: offer a shared segment to the members (taken if they all see it)."""
        self.timeout_s, self.chunk_bytes, self.encoder = timeout_s, chunk_bytes, encoder
        self.shared_memory = shared_memory
        self._group: WeightBroadcast | None = None
        self._connecting: threading.Thread | None = None
        self._result: dict = {}
        self._number = 0  # the generation connected or connecting (its number from ``open``)
        self._join_failed = 0  # a generation that never formed, not yet reported by ``send``
        self._lend = threading.Condition()
        self._lent: int | None = None  # the version exported into the segment, until released
        self._released = -1  # every version up to this one is no longer read
        self.lend_wait_s = 10.0
        self.moved_segments = 0  # times the segment was still lent when it had to be written

    def open(self, name: str, world_size: int, host: str, number: int = 0) -> GroupAddress:
        """Host generation ``name`` of ``world_size`` members (this one and ``world_size - 1`` workers);
        ``number`` identifies it in the metrics (``broadcast_generation``), so the caller can tell a
        late failure report of an older generation from one of the newest."""
        self.close()
        self._number, self._join_failed = number, 0
        if self.encoder is not None:
            self.encoder.reset()  # a new generation starts from the full weights
        store, port = host_store(host, self.timeout_s)
        address = GroupAddress(host, port, name, world_size, self.shared_memory and shared_segment.available())
        result: dict = {}

        def connect() -> None:
            try:
                result["group"] = WeightBroadcast(address, 0, self.timeout_s, self.chunk_bytes, store=store)
            except Exception as exc:  # a member never came: the generation is dropped
                result["error"] = exc

        self._result, self._connecting = result, threading.Thread(target=connect, name="weights-connect", daemon=True)
        self._connecting.start()
        return address

    def _settle(self) -> WeightBroadcast | None:
        """The connected generation, once its forming thread has ended (None while it forms or when it failed)."""
        if self._connecting is not None and not self._connecting.is_alive():
            self._group, self._connecting = self._result.get("group"), None
            self._join_failed = int("error" in self._result)  # reported once by ``send``, so the
            # controller forms a new generation instead of serving every later version from the object store
        return self._group

    def arena(self, sizes: dict[str, int], version: int) -> dict[str, np.ndarray] | None:
        """Where version ``version``'s arrays go in the connected generation's shared segment, one
        writable uint8 view per name of ``sizes`` (name -> bytes; ``WeightBroadcast.arena``), lent
        until :meth:`release` of ``version``. None (export as usual) without a connected generation
        sharing memory, or with an encoder (deltas are not the exported arrays)."""
        if self.encoder is not None or self._settle() is None or not self._group.shared:
            return None
        self._before_rewrite()
        views = self._group.arena(sizes)
        with self._lend:
            self._lent = version if views is not None else None
        return views

    def release(self, version: int) -> None:
        """Versions up to ``version`` are no longer read by anyone: the segment may be rewritten."""
        with self._lend:
            self._released = max(self._released, version)
            self._lend.notify_all()

    def withdraw(self, version: int) -> None:
        """Version ``version`` was lent but will not be handed on (its step failed): nobody reads it.
        (Earlier versions stay lent until released: only one is lent at a time, and :meth:`arena`
        waited for the one before.)"""
        with self._lend:
            if self._lent == version:
                self._lent = None
        if self._group is not None:  # a segment made for it alone, never announced: its name goes now
            self._group.discard_unannounced()

    def _before_rewrite(self) -> None:
        """Wait until the lent version (if any) is released; after ``lend_wait_s``, leave the segment to
        its readers and let the group make a new one."""
        with self._lend:
            if self._lent is None:
                return
            released = self._lend.wait_for(lambda: self._released >= self._lent, self.lend_wait_s)
            self._lent = None
        if not released and self._group is not None:
            self.moved_segments += 1
            self._group.leave_segment()

    def send(self, payload: WeightPayload) -> dict:
        """Broadcast ``payload`` if a generation is connected; the ``weight_sync/...`` metrics of the step."""
        self._settle()
        join_failed, self._join_failed = self._join_failed, 0
        if self._group is None:
            return self._metrics(failed=join_failed)
        if self._lent is not None and self._lent != payload.policy_version and self._group.shared:
            self._before_rewrite()  # this payload is not in the segment: writing it there must wait
            # (over the sockets, after a fallback, the segment is gone and nothing is rewritten)
        started = time.perf_counter()
        receivers = self._group.world_size - 1
        wire = self.encoder.encode(payload) if self.encoder is not None else payload
        try:
            sent = self._group.send(wire)
        except BroadcastFailed:
            shared = int(self._group.shared)
            self.close()
            return self._metrics(receivers, seconds=time.perf_counter() - started, failed=1, shared=shared)
        shared = int(self._group.shared)  # 0 when this version fell back to gloo
        # in place: the version was exported into the segment, the send copied none of it
        metrics = self._metrics(receivers, sent * receivers, time.perf_counter() - started, shared=shared,
                                in_place=int(bool(shared) and sent > 0 and self._group.copied_bytes == 0))
        if self.encoder is not None:
            # the payload's bytes over those one receiver got (the broadcast's layout, alignment
            # included): payload_bytes * receivers / broadcast_bytes (a probe found the ratio taken
            # over the encoded arrays alone, 3 % above what the byte counts beside it said)
            metrics |= {"compression_ratio": payload.num_bytes / max(sent, 1),
                        "full_version": int(not is_delta(wire)), "codec_rel_error": self.encoder.rel_error,
                        "full_for_error": int(self.encoder.full_for_error)}
        return metrics

    def _metrics(self, receivers: int = 0, sent: int = 0, seconds: float = 0.0, failed: int = 0,
                 shared: int = 0, in_place: int = 0) -> dict:
        """A step's ``weight_sync/broadcast_*`` metrics (``segment_moves``: times so far a lent version was
        still unreleased after ``lend_wait_s``, so the next one waited that long and took a new segment)."""
        return {"broadcast_receivers": receivers, "broadcast_bytes": sent, "broadcast_seconds": seconds,
                "broadcast_failed": failed, "broadcast_shared_memory": shared, "broadcast_in_place": in_place,
                "broadcast_segment_moves": self.moved_segments, "broadcast_generation": self._number}

    def close(self) -> None:
        if self._group is not None:
            self._group.close()  # a lent version keeps its memory through its views
        self._group, self._connecting = None, None
        with self._lend:
            self._lent = None


class BroadcastReceiver:
    """A worker's side across generations: a background thread per generation receives every version
    into ``latest``; :meth:`take` hands the version the controller asks for, if it arrived."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._alive = False
        self._connected = False  # the current generation's group is up (its versions can arrive)
        self.latest: WeightPayload | None = None
        """The newest version received and not yet taken (:meth:`take` drops it: its buffer is then free
        for the next version, instead of one more full copy of the weights held per worker)."""
        self.newest = -1
        """The newest version received (taken or not)."""
        self.incoming: int | None = None
        """The version whose header arrived and whose data is being received (or decoded), if any."""
        self.error: str | None = None

    def join(self, address: GroupAddress, rank: int, timeout_s: float = 60.0, delta: bool = False) -> None:
        """Become member ``rank`` of the generation at ``address`` (returns at once); ``delta``: the
        sender codes versions as deltas, decoded here against this member's reconstruction."""
        with self._cond:
            self._generation += 1
            generation, self._alive, self._connected = self._generation, True, False
            self.incoming = None  # an older generation's version in flight will not arrive any more

        def loop() -> None:
            group = None
            try:
                group = WeightBroadcast(address, rank, timeout_s)
                with self._cond:
                    if generation == self._generation:
                        self._connected = True
                decoder = DeltaDecoder() if delta else None
                while True:
                    payload = group.receive(on_header=lambda version: self._incoming(generation, version))
                    if decoder is not None:
                        payload = decoder.decode(payload)
                    if not self._arrived(generation, payload):
                        return  # a newer generation took over
            except Exception as exc:  # the generation broke (a member died, or member 0 moved on)
                with self._cond:
                    if generation == self._generation:
                        self._alive, self.error = False, f"{type(exc).__name__}: {str(exc)[:300]}"
                        self.incoming = None
                        self._cond.notify_all()
            finally:
                if group is not None:  # its shared segment's mapping and spare buffers
                    group.close()

        threading.Thread(target=loop, name=f"weights-receive-{generation}", daemon=True).start()

    def _incoming(self, generation: int, version: int) -> None:
        """Generation ``generation``'s thread is receiving ``version`` (its header arrived)."""
        with self._cond:
            if generation == self._generation:
                self.incoming = version
                self._cond.notify_all()

    def _arrived(self, generation: int, payload: WeightPayload) -> bool:
        """Generation ``generation``'s thread received ``payload``: it is ``latest`` unless a newer
        generation took over (False: that thread ends)."""
        with self._cond:
            if generation != self._generation:
                return False
            self.latest, self.incoming = payload, None
            self.newest = max(self.newest, payload.policy_version)
            self._cond.notify_all()
            return True

    def exists(self, version: int, elsewhere: Callable[[float | None], bool], timeout_s: float | None) -> bool:
        """Whether ``version``'s weights exist, here by broadcast or (``elsewhere(t)``: waiting up to t
        seconds, None: as long as it takes) another way (the object store), waiting up to
        ``timeout_s`` (None: as long as it takes) for either. While a generation is connected, an
        arrival ends the wait at once and ``elsewhere`` is asked every ``ELSEWHERE_POLL_S``; while
        none is, or once a newer version arrived (this one's copy is gone), only ``elsewhere`` is
        waited on. (A rollout worker's mailbox readiness: the broadcast copy reaches a member before
        the object store's does, which the learner writes after it.)"""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._cond:
                if self.latest is not None and self.latest.policy_version == version:
                    return True
                # a newer version arrived: this one's broadcast copy is gone, only the object store has it
                listening = self._alive and self._connected and self.newest < version
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not listening:
                return elsewhere(remaining)
            if elsewhere(0.0):
                return True
            if remaining == 0.0:
                return False
            with self._cond:
                if self.latest is None or self.latest.policy_version != version:
                    self._cond.wait(ELSEWHERE_POLL_S if remaining is None else min(ELSEWHERE_POLL_S, remaining))

    def take(self, version: int, wait_s: float = 5.0, grace_s: float = TAKE_GRACE_S) -> WeightPayload | None:
        """The payload of ``version`` if it arrived; None if it did not (load it another way).

        Called once ``version`` exists (:meth:`exists`), so the sender has broadcast it if it ever will
        (it broadcasts before it writes the object-store copy). While the generation is connected and
        only older versions arrived, the wait lasts up to ``wait_s`` while ``version`` (or an older one)
        is being received or decoded here, and only ``grace_s`` while nothing is (its header still in
        the sockets). A version the sender skipped (exported before every member joined a new
        generation) so costs ``grace_s``, not ``wait_s`` with the engine held (a review found 5 s per
        worker at every re-form); none at all while the generation forms."""
        now = time.monotonic()
        deadline, grace = now + wait_s, now + min(grace_s, wait_s)
        with self._cond:
            while True:
                if self.latest is not None and self.latest.policy_version == version:
                    payload, self.latest = self.latest, None
                    return payload
                if self.newest >= version:  # taken already, or a newer one arrived: this copy is gone
                    return None
                if self.incoming is not None and self.incoming > version:
                    return None  # a newer one is coming: this one was skipped
                receiving = self.incoming is not None  # this version, or an older one it may follow
                remaining = (deadline if receiving else grace) - time.monotonic()
                if not (self._alive and self._connected) or remaining <= 0:
                    return None
                self._cond.wait(remaining)
