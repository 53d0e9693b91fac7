"""The weight broadcast group (``system.weight_broadcast``): gloo on loopback between processes.

Three processes play learner rank 0 and two rollout workers. Checked, over gloo's sockets and
through a shared segment (``shared_memory``): versions arrive bit for bit (with chunks that cut
across arrays; a larger version after a smaller one takes a new segment), a worker killed during a
broadcast makes the sender fail within the timeout instead of hanging, and the next generation
without it (or with a worker that joined) delivers the next version; a worker that cannot see the
segment makes the whole generation use the sockets; nothing is left under ``/dev/shm``.
"""

import multiprocessing as mp
import os
import time

import numpy as np
import pytest
import torch

from system import shared_segment
from system.learner.distributed import find_free_port
from system.weight_broadcast import (
    ALIGN,
    BroadcastFailed,
    GroupAddress,
    WeightBroadcast,
    layout,
    unpack,
)
from system.weight_payload import WeightPayload, decode_weights, encode_weights

CHUNK = 1000  # bytes: far smaller than the arrays, so chunks cut across array boundaries


def payload_of(version: int) -> WeightPayload:
    """Version 3 is larger than 1 and 2 (a shared segment must grow for it)."""
    g = torch.Generator().manual_seed(version)
    state = {"embed.weight": torch.randn(37 if version < 3 else 370, 11, generator=g).to(torch.bfloat16),
             "layer.bias": torch.randn(5, generator=g),
             "positions": torch.arange(7) * version}
    return encode_weights(state, version)


def segments() -> set[str]:
    return {f.name for f in shared_segment.SHM_DIR.glob("aisrl-*")} if shared_segment.available() else set()


def same(a: WeightPayload, b: WeightPayload) -> bool:
    da, db = dict(decode_weights(a)), dict(decode_weights(b))
    return a.policy_version == b.policy_version and da.keys() == db.keys() and all(
        da[k].dtype == db[k].dtype and torch.equal(da[k], db[k]) for k in da)


def test_layout_and_unpack_round_trip_with_aligned_offsets():
    p = payload_of(2)
    header, nbytes = layout(p)
    # sorted names: embed.weight (37 x 11 x 2 = 814 B) at 0, layer.bias (5 x 4 = 20 B) at 832
    # (814 rounded up to 64), positions (7 x 8 = 56 B) at 896 (852 rounded up): 952 B in all.
    assert [(e["name"], e["offset"], e["nbytes"]) for e in header["arrays"]] == [
        ("embed.weight", 0, 814), ("layer.bias", 832, 20), ("positions", 896, 56)]
    assert nbytes == 952 and all(e["offset"] % ALIGN == 0 for e in header["arrays"])
    data = np.zeros(nbytes, dtype=np.uint8)
    for e in header["arrays"]:
        data[e["offset"]:e["offset"] + e["nbytes"]] = np.ascontiguousarray(p.arrays[e["name"]]).reshape(-1).view(np.uint8)
    assert same(unpack(header, data), p)
    with pytest.raises(BroadcastFailed, match="header announced 952"):
        unpack(header, data[:-1])


def _member(rank: int, address: GroupAddress, versions: list[int], results, die_after_header: bool = False,
            blind: bool = False, hold: bool = False) -> None:
    """``hold``: keep every payload received and check them all at the end (a buffer still referenced
    is never reused for a later version)."""
    if blind:  # this worker does not see member 0's /dev/shm (as in a container of its own)
        shared_segment.probe_token = lambda announced: False
    held = []
    try:
        group = WeightBroadcast(address, rank, timeout_s=15.0, chunk_bytes=CHUNK)
        results.put((rank, 0, f"shared={group.shared}"))
        for v in versions:
            if rank == 0:
                group.send(payload_of(v))
                results.put((rank, v, "sent"))
            elif die_after_header:
                size = torch.zeros(1, dtype=torch.int64)
                group._broadcast(size)  # the header size arrives, then this worker dies mid-broadcast
                os._exit(3)
            elif hold:
                held.append(group.receive())
            else:
                results.put((rank, v, "ok" if same(group.receive(), payload_of(v)) else "corrupt"))
        for p in held:
            results.put((rank, p.policy_version, "ok" if same(p, payload_of(p.policy_version)) else "corrupt"))
    except BroadcastFailed as exc:
        results.put((rank, -1, f"failed: {str(exc)[:200]}"))


def run_generation(members: dict[int, dict], versions: list[int], name: str,
                   shared: bool = False) -> tuple[list, dict[int, int]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    address = GroupAddress("127.0.0.1", find_free_port(), name, len(members), shared)
    procs = {r: ctx.Process(target=_member, args=(r, address, versions, results), kwargs=kw)
             for r, kw in members.items()}
    for p in procs.values():
        p.start()
    for p in procs.values():
        p.join(timeout=90)
    codes = {r: p.exitcode for r, p in procs.items()}
    for p in procs.values():
        if p.is_alive():
            p.kill()
    out = []
    while not results.empty():
        out.append(results.get())
    return sorted(out, key=str), codes


SHARED = [False, pytest.param(True, marks=pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm"))]


def path_of(out: list) -> set[str]:
    """Each member's view of how the data travels (one entry when they agree)."""
    return {status for _, v, status in out if v == 0 and status.startswith("shared=")}


def delivered(out: list) -> list:
    return [r for r in out if not r[2].startswith("shared=")]


@pytest.mark.parametrize("shared", SHARED, ids=["sockets", "shared-memory"])
def test_two_workers_receive_every_version_bit_for_bit(shared):
    before = segments()
    # versions 1, 2 and 1 again have one size: worker 1 drops each payload (its buffer is reused),
    # worker 2 holds them all (its buffers are not)
    out, codes = run_generation({0: {}, 1: {}, 2: {"hold": True}}, [1, 2, 1, 3], "gen1", shared)
    assert codes == {0: 0, 1: 0, 2: 0}
    assert path_of(out) == {f"shared={shared}"}
    assert delivered(out) == sorted([(r, v, "sent" if r == 0 else "ok") for r in range(3) for v in (1, 2, 1, 3)],
                                    key=str)
    assert segments() == before  # every name removed once mapped, every mapping closed with its process


@pytest.mark.parametrize("shared", SHARED, ids=["sockets", "shared-memory"])
def test_a_worker_killed_mid_broadcast_fails_the_sender_then_the_next_generation_serves(shared):
    before = segments()
    started = time.monotonic()
    out, codes = run_generation({0: {}, 1: {}, 2: {"die_after_header": True}}, [1], "gen1", shared)
    assert codes[2] == 3  # the worker died during the broadcast
    assert codes[0] == 0 and codes[1] == 0  # nobody hangs: both survivors returned (with an error or the data)
    assert any(r == 0 and status.startswith("failed") for r, _, status in out), out  # no hang: an error
    assert time.monotonic() - started < 80
    # the next generation: the survivor, and a worker that joins (it got version 1 elsewhere)
    out, codes = run_generation({0: {}, 1: {}, 2: {}}, [2], "gen2", shared)
    assert codes == {0: 0, 1: 0, 2: 0} and delivered(out) == sorted([(0, 2, "sent"), (1, 2, "ok"), (2, 2, "ok")],
                                                                      key=str)
    assert segments() == before


@pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm")
def test_a_worker_that_cannot_see_the_segment_sends_the_whole_generation_over_the_sockets():
    out, codes = run_generation({0: {}, 1: {}, 2: {"blind": True}}, [1, 2], "gen1", shared=True)
    assert codes == {0: 0, 1: 0, 2: 0}
    assert path_of(out) == {"shared=False"}  # every member agrees, the blind one's view decides
    assert delivered(out) == sorted([(r, v, "sent" if r == 0 else "ok") for r in range(3) for v in (1, 2)], key=str)
