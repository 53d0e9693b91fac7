"""The weight broadcast group (``system.weight_broadcast``): gloo on loopback between processes.

Three processes play learner rank 0 and two rollout workers. Checked: versions arrive bit for
bit (with chunks that cut across arrays), a worker killed during a broadcast makes the sender
fail within the timeout instead of hanging, and the next generation without it (or with a
worker that joined) delivers the next version.
"""

import multiprocessing as mp
import os
import time

import numpy as np
import pytest
import torch

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
    g = torch.Generator().manual_seed(version)
    state = {"embed.weight": torch.randn(37, 11, generator=g).to(torch.bfloat16),
             "layer.bias": torch.randn(5, generator=g),
             "positions": torch.arange(7) * version}
    return encode_weights(state, version)


def same(a: WeightPayload, b: WeightPayload) -> bool:
    da, db = dict(decode_weights(a)), dict(decode_weights(b))
    return a.policy_version == b.policy_version and da.keys() == db.keys() and all(
        da[k].dtype == db[k].dtype and torch.equal(da[k], db[k]) for k in da)


def test_layout_and_unpack_round_trip_with_aligned_offsets():
    p = payload_of(3)
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


def _member(rank: int, address: GroupAddress, versions: list[int], results, die_after_header: bool = False) -> None:
    try:
        group = WeightBroadcast(address, rank, timeout_s=15.0, chunk_bytes=CHUNK)
        for v in versions:
            if rank == 0:
                group.send(payload_of(v))
                results.put((rank, v, "sent"))
            elif die_after_header:
                size = torch.zeros(1, dtype=torch.int64)
                group._broadcast(size)  # the header size arrives, then this worker dies mid-broadcast
                os._exit(3)
            else:
                results.put((rank, v, "ok" if same(group.receive(), payload_of(v)) else "corrupt"))
    except BroadcastFailed as exc:
        results.put((rank, -1, f"failed: {str(exc)[:200]}"))


def run_generation(members: dict[int, dict], versions: list[int], name: str) -> tuple[list, dict[int, int]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    address = GroupAddress("127.0.0.1", find_free_port(), name, len(members))
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


def test_two_workers_receive_every_version_bit_for_bit():
    out, codes = run_generation({0: {}, 1: {}, 2: {}}, [1, 2], "gen1")
    assert codes == {0: 0, 1: 0, 2: 0}
    assert out == sorted([(0, 1, "sent"), (0, 2, "sent"), (1, 1, "ok"), (1, 2, "ok"), (2, 1, "ok"), (2, 2, "ok")],
                         key=str)


def test_a_worker_killed_mid_broadcast_fails_the_sender_then_the_next_generation_serves():
    started = time.monotonic()
    out, codes = run_generation({0: {}, 1: {}, 2: {"die_after_header": True}}, [1], "gen1")
    assert codes[2] == 3  # the worker died during the broadcast
    assert codes[0] == 0 and codes[1] == 0  # nobody hangs: both survivors returned (with an error or the data)
    assert any(r == 0 and status.startswith("failed") for r, _, status in out), out  # no hang: an error
    assert time.monotonic() - started < 80
    # the next generation: the survivor, and a worker that joins (it got version 1 elsewhere)
    out, codes = run_generation({0: {}, 1: {}, 2: {}}, [2], "gen2")
    assert codes == {0: 0, 1: 0, 2: 0} and out == sorted([(0, 2, "sent"), (1, 2, "ok"), (2, 2, "ok")], key=str)
