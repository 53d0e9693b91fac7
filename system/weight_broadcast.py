"""A ``torch.distributed`` broadcast group for weights: learner rank 0 sends, rollout workers receive.

The group is its own process group (gloo on CPU), built from an explicit TCP store, never the
default group: the learner ranks keep theirs for FSDP2, and a vLLM engine keeps its own. One
``send`` is one policy version, as a fixed sequence of broadcasts from member 0::

    1. header size     int64 [1]
    2. header          uint8 [header size]   JSON: policy_version, and per array name, dtype,
                                              shape, offset (64-byte aligned) into the data
    3. data            uint8 [nbytes], in chunks of ``chunk_bytes`` (in the header; one bounded
                                              staging buffer on the sender; the receiver
                                              receives straight into its flat buffer)

With ``shared_memory`` (the address says so, and every member sees member 0's ``/dev/shm``, which
the members check when they join) the data skips the sockets: member 0 writes it into a shared
segment (``system.shared_segment``), the header names the segment, each member copies the data out
of it, and an all-reduce (MIN of each member's ok flag) tells member 0 that every copy is done
before it returns (and may rewrite the segment for the next version). Member 0 may also hand out
the segment itself (:meth:`WeightBroadcast.arena`): learner rank 0 exports the next version straight
into it, and ``send`` then writes nothing (the sender's copy of the weights is gone). A segment's name is
removed once every member has mapped it (after its first version); a sender killed before that
leaves it, and the next sender on the host removes it (``shared_segment.remove_orphans``). A
segment that cannot be written (``/dev/shm`` full) or read by some member sends that version
again over gloo, and the rest of the generation too.

Membership is fixed for the life of a group (a *generation*): a worker that joins later gets the
full weights another way (the object store) and is a member of the NEXT generation; a member
that dies makes the pending broadcast fail on the sender (``BroadcastFailed`` within the
timeout), after which the caller builds the next generation without it. Receivers that did
get the whole payload keep it (the header and size checks make a partial one an error). Learner
rank 0's and the workers' sides across generations are ``system.weight_generations``.
"""

import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from system import shared_segment
from system.learner.distributed import _is_loopback, listening_fd
from system.shared_segment import SharedSegment
from system.weight_layout import ALIGN, fill, layout, offsets
from system.weight_payload import WeightPayload

log = logging.getLogger(__name__)

class BroadcastFailed(RuntimeError):
    """A broadcast of the group did not complete (a member died or timed out): build the next generation."""


@dataclass(frozen=True)
class GroupAddress:
    """Where a generation meets: member 0 hosts the TCP store on ``host:port``; ``name`` keeps
    the keys of two generations (or two runs) on one store apart; ``shared_memory``: members on
    member 0's host take the data from a shared segment (when all of them can)."""

    host: str
    port: int
    name: str
    world_size: int
    shared_memory: bool = False


def unpack(header: dict, data: np.ndarray) -> WeightPayload:
    """The payload whose arrays are views of the flat ``data`` (uint8) at the header's offsets."""
    if data.nbytes != header["nbytes"]:
        raise BroadcastFailed(f"received {data.nbytes} bytes of weights, the header announced {header['nbytes']}")
    arrays, dtypes = {}, {}
    for e in header["arrays"]:
        raw = data[e["offset"]:e["offset"] + e["nbytes"]]
        arrays[e["name"]] = raw.view(np.dtype(e["dtype"])).reshape(e["shape"])
        dtypes[e["name"]] = e["torch_dtype"]
    return WeightPayload(policy_version=int(header["policy_version"]), arrays=arrays, dtypes=dtypes)


def _buffer_pair(nbytes: int) -> tuple[np.ndarray, torch.Tensor]:
    """A new receive buffer and the tensor over it (its storage holds one reference to the buffer)."""
    buf = np.empty(nbytes, dtype=np.uint8)
    return buf, torch.from_numpy(buf)


NEXT_VERSION_WAIT = timedelta(days=7)
"""How long a receiver waits for member 0's next version (its header) before giving up."""


class WeightBroadcast:
    """One member of one generation. Member 0 calls :meth:`send`, the others :meth:`receive`,
    once per policy version, in the same order (both are collective over the generation)."""

    def __init__(self, address: GroupAddress, rank: int, timeout_s: float = 60.0,
                 chunk_bytes: int = 64 << 20, store: dist.Store | None = None) -> None:
        """Join the generation at ``address`` (blocks until every member has joined; ``BroadcastFailed``
        when one dies first or ``timeout_s`` passes). Member 0 passes the store it hosts
        (:func:`host_store`); the others connect to it."""
        if not 0 <= rank < address.world_size:
            raise ValueError(f"rank must be in [0, {address.world_size}), got {rank}")
        if chunk_bytes < ALIGN:
            raise ValueError(f"chunk_bytes must be >= {ALIGN}, got {chunk_bytes}")
        self.rank, self.world_size, self.chunk_bytes = rank, address.world_size, chunk_bytes
        self.timeout = timedelta(seconds=timeout_s)
        try:  # a member that dies (or never comes) while the group forms fails it like a broadcast
            if store is None:
                store = dist.TCPStore(address.host, address.port, address.world_size, rank == 0, self.timeout,
                                      wait_for_workers=False)
            self._store = store
            prefixed = dist.PrefixStore(f"weights/{address.name}/", self._store)
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = self.timeout
            bind = "127.0.0.1" if _is_loopback(address.host) else None
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=bind) if bind
                             else dist.ProcessGroupGloo.create_default_device()]
            self._pg = dist.ProcessGroupGloo(prefixed, rank, address.world_size, opts)
        except RuntimeError as exc:  # the store's timeout, or gloo: a peer closed its connection
            raise BroadcastFailed(f"{self._what()} could not form its group: {exc}") from exc
        self._segment: SharedSegment | None = None
        self._announced = True  # member 0: its segment's name was announced (and then removed)
        self._buffers: list[tuple[np.ndarray, torch.Tensor]] = []  # a receiver's data buffers, reused once free
        self.buffers_made = 0
        self.copied_bytes = 0  # member 0: bytes its last send copied out of the payload (0: exported in place)
        self.shared = bool(address.shared_memory) and self._agree_on_shared_memory(prefixed)
        """Whether the data goes through a shared segment (every member sees member 0's)."""

    def _what(self) -> str:
        return (f"weight broadcast to {self.world_size - 1} workers" if self.rank == 0
                else f"weight broadcast from the learner to worker {self.rank} of {self.world_size - 1}")

    def _broadcast(self, t: torch.Tensor, timeout: timedelta | None = None) -> None:
        """Member 0's ``t`` into every member's (collective); ``timeout``: this operation's, else the
        group's ``timeout_s``."""
        opts = dist.BroadcastOptions()
        if timeout is not None:
            opts.timeout = timeout
        try:
            self._pg.broadcast([t], opts).wait()
        except RuntimeError as exc:  # gloo: a peer closed its connection, or the timeout passed
            raise BroadcastFailed(f"{self._what()} failed: {exc}") from exc

    def _all_ok(self, ok: bool) -> bool:
        """Every member's flag (an all-reduce of MIN): True only if every member passed True."""
        flag = torch.tensor([int(ok)], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        try:
            self._pg.allreduce([flag], opts).wait()
        except RuntimeError as exc:
            raise BroadcastFailed(f"{self._what()} failed: {exc}") from exc
        return bool(flag.item())

    def _agree_on_shared_memory(self, store: dist.Store) -> bool:
        """Member 0 announces a probe segment through the store; each member reports whether it sees
        it (same host and the same ``/dev/shm``); the data goes through shared memory only if all do."""
        probe = None
        if self.rank == 0:
            announced = ""
            if shared_segment.available():
                shared_segment.remove_orphans()  # segments of earlier senders killed mid-version
                try:
                    probe, announced = shared_segment.create_probe()
                except OSError:
                    announced = ""
            store.set("shm_probe", announced)
            ok = probe is not None
        else:
            announced = store.get("shm_probe").decode()
            ok = bool(announced) and shared_segment.probe_token(announced)
        try:
            return self._all_ok(ok)
        finally:
            if probe is not None:
                probe.close()

    def send(self, payload: WeightPayload) -> int:
        """Broadcast ``payload`` to every other member; returns the bytes of data sent."""
        if self.rank != 0:
            raise ValueError("only member 0 sends")
        header, nbytes = layout(payload)
        if self.shared:
            return self._send_shared(payload, header, nbytes)
        self.copied_bytes = nbytes  # through the staging buffer, chunk by chunk
        header["chunk_bytes"] = self.chunk_bytes  # the receivers cut the data the same way
        self._send_header(header)
        staging = np.empty(min(self.chunk_bytes, max(nbytes, 1)), dtype=np.uint8)
        sources = [(e["offset"], np.ascontiguousarray(payload.arrays[e["name"]]).reshape(-1).view(np.uint8))
                   for e in header["arrays"]]
        for start in range(0, nbytes, self.chunk_bytes):
            end = min(start + self.chunk_bytes, nbytes)
            chunk = staging[:end - start]
            chunk[:] = 0
            for offset, raw in sources:  # copy the part of every array that falls in [start, end)
                lo, hi = max(offset, start), min(offset + raw.size, end)
                if lo < hi:
                    chunk[lo - start:hi - start] = raw[lo - offset:hi - offset]
            self._broadcast(torch.from_numpy(chunk))
        return nbytes

    def _send_header(self, header: dict) -> None:
        encoded = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8).copy()
        self._broadcast(torch.tensor([encoded.size], dtype=torch.int64))
        self._broadcast(torch.from_numpy(encoded))

    def _own_segment(self, nbytes: int) -> None:
        """Member 0: a segment of at least ``nbytes`` (a new one when the current is smaller; raises
        ``OSError`` when ``/dev/shm`` cannot hold it). A new segment's name is removed once its first
        version has been announced and every member has mapped it."""
        if self._segment is None or self._segment.size < nbytes:
            self._drop_segment()
            self._segment = SharedSegment(shared_segment.new_name(), max(nbytes, 1), create=True)
            self._announced = False

    def arena(self, sizes: dict[str, int]) -> dict[str, np.ndarray] | None:
        """Member 0 of a shared generation: where the next version's arrays go in the segment, one
        writable uint8 view per name of ``sizes`` (name -> bytes), at the offsets
        ``weight_layout.layout`` will give a payload with those arrays. A payload whose arrays ARE
        these views is sent without writing it (``weight_layout.fill`` skips an array already in
        place): learner rank 0 exports straight into them and saves one full copy of the weights per
        version. None when this generation does
        not share memory, or the segment cannot be made. The views are valid until the next
        :meth:`arena` or :meth:`send` of a different payload, which may rewrite the segment; keeping
        the payload readable that long (Ray's copy of it into the object store, for one) is the
        caller's part (``system.weight_generations.BroadcastSender``)."""
        if self.rank != 0 or not self.shared:
            return None
        starts, nbytes = offsets(sizes)
        try:
            self._own_segment(nbytes)
        except OSError as exc:
            self._stop_sharing(f"the shared weight segment could not be made ({exc})")
            return None
        data = self._segment.array
        return {name: data[starts[name]:starts[name] + int(sizes[name])] for name in sizes}

    def _send_shared(self, payload: WeightPayload, header: dict, nbytes: int) -> int:
        """The data through the shared segment (a new, larger one when it does not fit). When the
        segment cannot be made or filled (``/dev/shm`` full), or a worker could not read it, this
        version goes again over the sockets, and so does every later one of this generation."""
        try:
            self._own_segment(nbytes)
            self.copied_bytes = fill(self._segment.array[:nbytes], header, payload)
        except OSError as exc:
            self._stop_sharing(f"the shared weight segment could not be written ({exc})")
            return self.send(payload)
        header["shm"] = self._segment.name
        try:
            self._send_header(header)
            ok = self._all_ok(True)
        finally:
            if not self._announced:  # every member has mapped it now (or failed): the name is no longer needed
                self._segment.unlink()
                self._announced = True
        if not ok:
            self._stop_sharing(f"a worker could not read the shared weight segment {header['shm']}")
            return self.send(payload)
        return nbytes

    def _stop_sharing(self, reason: str) -> None:
        """From now on the data of this generation goes over gloo (every member learns it from the next
        header, or from the all-reduce that failed)."""
        if self.rank == 0:
            log.warning("weight broadcast: %s; this generation sends over gloo from now on", reason)
        self.shared = False
        self._drop_segment()

    def discard_unannounced(self) -> None:
        """Member 0: drop a segment :meth:`arena` made that no version has announced yet (its export was
        withdrawn): its name would otherwise stay in ``/dev/shm`` until this process ends."""
        if self._segment is not None and not self._announced:
            self._drop_segment()
            self._announced = True

    def leave_segment(self) -> None:
        """Member 0: write no more into the current segment (whoever holds views of it keeps them, and
        the mapping with them); the next version takes a new one."""
        self._drop_segment()

    def _drop_segment(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def receive(self, on_header: Callable[[int], None] | None = None) -> WeightPayload:
        """The payload member 0 sends next (its arrays are views of one flat buffer); ``on_header`` is
        called with its policy version as soon as its header arrived (before its data)."""
        if self.rank == 0:
            raise ValueError("member 0 sends, it does not receive")
        size = torch.zeros(1, dtype=torch.int64)
        # the wait for the next version lasts as long as the learner's step (a long step, a checkpoint, the
        # first batch): not bounded by timeout_s, which bounds the transfer; a sender that goes away
        # closes its sockets, which ends the wait at once
        self._broadcast(size, timeout=NEXT_VERSION_WAIT)
        encoded = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(encoded)
        header = json.loads(bytes(encoded.numpy()).decode())
        if on_header is not None:
            on_header(int(header["policy_version"]))
        if "shm" in header:
            return self._receive_shared(header, on_header)
        if self.shared:  # member 0 stopped sharing (it could not write a segment): the sockets from now on
            self._stop_sharing("member 0 sent over gloo")
        data, flat = self._buffer(int(header["nbytes"]))
        chunk = int(header["chunk_bytes"])
        for start in range(0, data.size, chunk):
            self._broadcast(flat[start:start + chunk])
        return unpack(header, data)

    def _buffer(self, nbytes: int) -> tuple[np.ndarray, torch.Tensor]:
        """A buffer for the next version and the tensor over it: an earlier one of this size that
        nothing else references any more (its payload was dropped: every view ``unpack`` made, and
        every view of those, holds a reference to it), else a new one (a recycled buffer's pages are
        already mapped: no page faults on the copy). The tensor lives as long as the buffer, so its
        storage holds the buffer's one torch reference for good: a chunk view gloo's worker thread
        releases a moment after ``wait()`` (seen under load) changes no count. Free means: as many
        references as a fresh pair held by a list has, counted by the same code (interpreters differ
        in whether the loop variable adds one)."""
        baseline = None
        for pair in [_buffer_pair(0)]:
            baseline = sys.getrefcount(pair[0])
        free, held = None, []
        for pair in self._buffers:
            refs = sys.getrefcount(pair[0])
            if free is None and pair[0].size == nbytes and refs <= baseline:
                free = pair
            elif refs > baseline:
                held.append(pair)
        if free is not None:
            return free
        pair = _buffer_pair(nbytes)
        self.buffers_made += 1
        self._buffers = held[-2:] + [pair]  # at most two older ones kept for reuse, none still held
        return pair

    def _receive_shared(self, header: dict, on_header: Callable[[int], None] | None = None) -> WeightPayload:
        """Copy the data out of member 0's segment, then tell it (the all-reduce) whether that worked;
        if any member failed, member 0 sends this version again over gloo, and every later one."""
        error = None
        try:
            data, _ = self._buffer(int(header["nbytes"]))
            if self._segment is None or self._segment.name != header["shm"]:
                self._drop_segment()
                self._segment = SharedSegment(header["shm"], None, create=False)
            shared_segment.copy_pieces([(data, self._segment.array[:data.size])])
        except Exception as exc:  # noqa: BLE001 - every failure must still reach the all-reduce below
            error = exc
        if self._all_ok(error is None):
            return unpack(header, data)
        self._stop_sharing(f"reading {header['shm']} failed: {error or 'on another worker'}")
        return self.receive(on_header)

    def close(self) -> None:
        """Drop the group (a dead peer's group is dropped the same way) and its shared segment."""
        self._pg = None
        self._store = None
        self._drop_segment()
        self._buffers = []


def host_store(host: str, timeout_s: float) -> tuple[dist.TCPStore, int]:
    """Member 0's store on a free port of ``host`` only (the socket is bound here and handed to the
    store, which would otherwise listen on every interface): ``(store, port)``."""
    fd, port = listening_fd(host, 0)
    try:
        return dist.TCPStore(host, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False,
                             master_listen_fd=fd), port
    except BaseException:
        os.close(fd)
        raise
