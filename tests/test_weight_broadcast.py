"""The weight broadcast group (``system.weight_broadcast``): gloo on loopback between processes.

Three processes play learner rank 0 and two rollout workers. Checked, over gloo's sockets and
through a shared segment (``shared_memory``): versions arrive bit for bit (with chunks that cut
across arrays; a larger version after a smaller one takes a new segment), a worker killed during a
broadcast makes the sender fail within the timeout instead of hanging, and the next generation
without it (or with a worker that joined) delivers the next version; a worker that cannot see the
segment makes the whole generation use the sockets; nothing is left under ``/dev/shm``.
"""

import faulthandler
import multiprocessing as mp
import os
import time

import numpy as np
import pytest
import torch

from system import shared_segment
from system.learner.distributed import find_free_port
from system.weight_broadcast import BroadcastFailed, GroupAddress, WeightBroadcast, unpack
from system.weight_layout import ALIGN, layout
from system.weight_payload import WeightPayload, decode_weights, encode_weights

CHUNK = 1000  # bytes: far smaller than the arrays, so chunks cut across array boundaries


def payload_of(version: int) -> WeightPayload:
    """Version 3 is larger than 1 and 2 (a shared segment must grow for it)."""
    g = torch.Generator().manual_seed(version)
    state = {"embed.weight": torch.randn(37 if version < 3 else 370, 11, generator=g).to(torch.bfloat16),
             "layer.bias": torch.randn(5, generator=g),
             "positions": torch.arange(7) * version}
    return encode_weights(state, version)



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


def _sabotage(kind: str) -> None:
    """Make this process's data segments fail: ``write`` (member 0 cannot make one: /dev/shm full) or
    ``read`` (this worker cannot map member 0's); the probe's segment is left alone."""
    import system.weight_broadcast as wb

    real = wb.SharedSegment

    def segment(name, size, create):
        if create == (kind == "write"):
            raise OSError(28, f"No space left on device (sabotaged {kind})")
        return real(name, size, create)

    wb.SharedSegment = segment


def _member(rank: int, address: GroupAddress, versions: list[int], results, die_after_header: bool = False,
            blind: bool = False, hold: bool = False, sabotage: str | None = None, timeout_s: float = 15.0,
            gap_s: float = 0.0, started=None, in_place: bool = False) -> None:
    """``hold``: keep one array of every payload received and check them all at the end (a buffer still
    referenced is never reused for a later version); every member reports its ``shared`` flag when
    the group has formed and, at the end, how it ended (``shared`` again, buffers made). ``in_place``
    (member 0): write each version into ``arena`` views first (as learner rank 0 exports) and report
    how many bytes ``send`` then copied."""
    faulthandler.dump_traceback_later(75, exit=True)  # a member that hangs: its stacks in the test's output
    if blind:  # this worker does not see member 0's /dev/shm (as in a container of its own)
        shared_segment.probe_token = lambda announced: False
    if sabotage:
        _sabotage(sabotage)
    held, copied, lent, reported = [], [0], [], []
    if in_place:
        real_copy = shared_segment.copy_pieces

        def counting(pairs, threads=2):
            copied[0] += sum(src.size for _, src in pairs)
            real_copy(pairs, threads)

        shared_segment.copy_pieces = counting
    if started is not None:  # every member imported: a short timeout_s bounds the forming, not an import
        started.wait(60)
    try:
        group = WeightBroadcast(address, rank, timeout_s=timeout_s, chunk_bytes=CHUNK)
        results.put((rank, 0, f"shared={group.shared}"))
        for i, v in enumerate(versions):
            if rank == 0:
                if i:
                    time.sleep(gap_s)  # a long learner step between two versions
                payload = payload_of(v)
                views = group.arena({n: a.nbytes for n, a in payload.arrays.items()}) if in_place else None
                lent.append(views is not None)
                if views is not None:  # the payload made of the views, holding its values
                    arrays = {}
                    for n, a in payload.arrays.items():
                        views[n][:] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                        arrays[n] = views[n].view(a.dtype).reshape(a.shape)
                    payload = WeightPayload(v, arrays, payload.dtypes)
                group.send(payload)
                reported.append(group.copied_bytes)
                results.put((rank, v, "sent"))
            elif die_after_header:
                size = torch.zeros(1, dtype=torch.int64)
                group._broadcast(size)  # the header size arrives, then this worker dies mid-broadcast
                os._exit(3)
            elif hold:
                held.append((v, group.receive().arrays["positions"]))  # a view of the version's buffer
            else:
                results.put((rank, v, "ok" if same(group.receive(), payload_of(v)) else "corrupt"))
        for v, positions in held:
            results.put((rank, v, "ok" if np.array_equal(positions, np.arange(7) * v) else "corrupt"))
        results.put((rank, -2, f"end shared={group.shared} buffers={group.buffers_made}"))
        if in_place:
            results.put((rank, -3, f"lent={lent} copied={copied[0]} reported={reported}"))
        group.close()
    except BroadcastFailed as exc:
        results.put((rank, -1, f"failed: {str(exc)[:200]}"))


def run_generation(members: dict[int, dict], versions: list[int], name: str,
                   shared: bool = False) -> tuple[list, dict[int, int], list[int]]:
    """Run one generation; ``(sorted results, exit codes by rank, the members' pids)``."""
    ctx = mp.get_context("spawn")
    results, started = ctx.Queue(), ctx.Barrier(len(members))
    address = GroupAddress("127.0.0.1", find_free_port(), name, len(members), shared)
    procs = {r: ctx.Process(target=_member, args=(r, address, versions, results), kwargs={**kw, "started": started})
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
    return sorted(out, key=str), codes, [p.pid for p in procs.values()]


def segments(pids: list[int]) -> set[str]:
    """The /dev/shm segments these processes made that still have a name."""
    if not shared_segment.available():
        return set()
    return {f.name for pid in pids for f in shared_segment.SHM_DIR.glob(f"aisrl-{pid}-*")}


SHARED = [False, pytest.param(True, marks=pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm"))]


def path_of(out: list) -> set[str]:
    """Each member's view, when the group formed, of how the data travels (one entry when they agree)."""
    return {status for _, v, status in out if v == 0 and status.startswith("shared=")}


def ends(out: list) -> dict[int, str]:
    return {r: status for r, v, status in out if v == -2}


def delivered(out: list) -> list:
    return [r for r in out if r[1] > 0]


def expected(versions: list[int], members: int = 3) -> list:
    return sorted([(r, v, "sent" if r == 0 else "ok") for r in range(members) for v in versions], key=str)


@pytest.mark.parametrize("shared", SHARED, ids=["sockets", "shared-memory"])
def test_two_workers_receive_every_version_bit_for_bit(shared):
    # versions 1, 2 and 1 again have one size: worker 1 drops each payload, so one buffer serves
    # all three (and a second one version 3, larger); worker 2 holds an array of each, so each
    # takes a buffer of its own, and the held arrays keep their version's values
    versions = [1, 2, 1, 3]
    out, codes, pids = run_generation({0: {}, 1: {}, 2: {"hold": True}}, versions, "gen1", shared)
    assert codes == {0: 0, 1: 0, 2: 0}
    assert path_of(out) == {f"shared={shared}"}
    assert delivered(out) == expected(versions)
    assert ends(out)[1] == f"end shared={shared} buffers=2" and ends(out)[2] == f"end shared={shared} buffers=4"
    assert segments(pids) == set()  # every name removed once mapped


@pytest.mark.parametrize("shared", SHARED, ids=["sockets", "shared-memory"])
def test_a_version_exported_into_the_segment_is_sent_without_a_copy(shared):
    # member 0 writes each version into the views ``arena`` gives (version 3 is larger: a new
    # segment); the workers get every version bit for bit, and ``send`` copied none of its bytes.
    # Over the sockets there is no segment: ``arena`` gives nothing and the payload goes as usual.
    versions = [1, 2, 1, 3]
    out, codes, pids = run_generation({0: {"in_place": True}, 1: {}, 2: {"hold": True}}, versions, "gen1", shared)
    assert codes == {0: 0, 1: 0, 2: 0}
    assert delivered(out) == expected(versions)
    report = next(status for r, v, status in out if r == 0 and v == -3)
    if shared:
        assert report == "lent=[True, True, True, True] copied=0 reported=[0, 0, 0, 0]"
    else:  # over the sockets every byte goes through the staging buffer (``copied_bytes`` = the data's)
        data = [layout(payload_of(v))[1] for v in versions]
        assert report.startswith("lent=[False, False, False, False]") and report.endswith(f"reported={data}")
    assert segments(pids) == set()  # a segment made by ``arena`` loses its name once announced, too


@pytest.mark.parametrize("shared", SHARED, ids=["sockets", "shared-memory"])
def test_a_worker_killed_mid_broadcast_fails_the_sender_then_the_next_generation_serves(shared):
    started = time.monotonic()
    out, codes, pids = run_generation({0: {}, 1: {}, 2: {"die_after_header": True}}, [1], "gen1", shared)
    assert codes[2] == 3  # the worker died during the broadcast
    assert codes[0] == 0 and codes[1] == 0  # nobody hangs: both survivors returned (with an error or the data)
    assert any(r == 0 and status.startswith("failed") for r, _, status in out), out  # no hang: an error
    assert time.monotonic() - started < 80
    assert segments(pids) == set()  # the sender unlinked its segment though the version failed
    # the next generation: the survivor, and a worker that joins (it got version 1 elsewhere)
    out, codes, pids = run_generation({0: {}, 1: {}, 2: {}}, [2], "gen2", shared)
    assert codes == {0: 0, 1: 0, 2: 0} and delivered(out) == expected([2])
    assert segments(pids) == set()


@pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm")
def test_a_worker_that_cannot_see_the_segment_sends_the_whole_generation_over_the_sockets():
    out, codes, _ = run_generation({0: {}, 1: {}, 2: {"blind": True}}, [1, 2], "gen1", shared=True)
    assert codes == {0: 0, 1: 0, 2: 0}
    assert path_of(out) == {"shared=False"}  # every member agrees, the blind one's view decides
    assert delivered(out) == expected([1, 2])


@pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm")
@pytest.mark.parametrize("who, sabotage", [(0, "write"), (2, "read")], ids=["shm-full-at-the-sender", "a-worker-cannot-map"])
def test_a_segment_that_fails_sends_the_version_again_over_the_sockets_and_the_rest_too(who, sabotage):
    """The probe passed (every member saw it), then the data segment fails: no version is lost, no
    BroadcastFailed, and the generation ends on the sockets."""
    members = {0: {}, 1: {}, 2: {}}
    members[who] = {"sabotage": sabotage}
    out, codes, pids = run_generation(members, [1, 2, 3], "gen1", shared=True)
    assert codes == {0: 0, 1: 0, 2: 0}
    assert path_of(out) == {"shared=True"} and delivered(out) == expected([1, 2, 3])
    assert {r: e.split(" buffers")[0] for r, e in ends(out).items()} == dict.fromkeys(range(3), "end shared=False")
    assert segments(pids) == set()


def test_a_member_whose_group_cannot_form_fails_like_a_broadcast():
    """A member whose peers never come (or one that died while the group formed, which a loaded
    machine showed: the others' ``connectFullMesh`` failed with a RuntimeError that escaped the
    receiver's handling in this test) gets ``BroadcastFailed`` after its timeout, not another error."""
    from system.weight_broadcast import host_store

    store, port = host_store("127.0.0.1", 5.0)
    started = time.monotonic()
    with pytest.raises(BroadcastFailed, match="worker 1 of 1 could not form its group"):
        WeightBroadcast(GroupAddress("127.0.0.1", port, "member-0-never-comes", 2), 1, timeout_s=1.0)
    assert time.monotonic() - started < 4.0  # the 1 s timeout, with a busy machine's margin
    del store


def test_a_generation_nobody_joins_is_reported_failed_once_so_a_new_one_forms():
    """A sender whose members never join within its timeout: the first ``send`` after the join gave up
    says ``broadcast_failed`` (the controller then forms a new generation), later ones do not repeat
    it; nothing is sent (no receivers)."""
    from system.weight_generations import BroadcastSender

    sender = BroadcastSender(timeout_s=1.0)
    sender.open("nobody-joins", 2, "127.0.0.1", number=7)
    deadline = time.monotonic() + 30
    while sender._connecting is not None and sender._connecting.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    first, second = sender.send(payload_of(1)), sender.send(payload_of(2))
    sender.close()
    assert (first["broadcast_failed"], first["broadcast_receivers"], first["broadcast_bytes"]) == (1, 0, 0)
    assert first["broadcast_generation"] == 7  # which generation failed: the controller re-forms only the newest
    assert (second["broadcast_failed"], second["broadcast_receivers"]) == (0, 0)


def test_a_receiver_does_not_wait_for_a_version_while_its_generation_forms():
    """A worker that joined a generation another member has not joined yet (the sender skips every
    version until all have): ``take`` answers None at once, so the load falls back to the object store,
    instead of holding the engine for ``wait_s`` per version (as it did while the group formed)."""
    from system.weight_generations import BroadcastReceiver, BroadcastSender

    sender = BroadcastSender(timeout_s=3.0)
    address = sender.open("one-member-late", 3, "127.0.0.1")
    receiver = BroadcastReceiver()
    receiver.join(address, 1, timeout_s=3.0)  # member 2 never joins
    time.sleep(0.2)
    started = time.monotonic()
    assert receiver.take(1, wait_s=5.0) is None
    assert time.monotonic() - started < 4.0  # at once (a busy machine's margin), not after wait_s = 5
    sender.close()


def test_only_a_failure_of_the_newest_generation_re_forms_the_group(caplog):
    """A step that ran before generation 3 was opened reports generation 2's failure after it: ignored
    (3 is forming already); a failure of 3 itself, or one without a number, re-forms. Each failed
    generation is said once on the console (a probe found the failure only in the metrics)."""
    import logging
    from types import SimpleNamespace

    from actors.weight_sync import CollectiveTransport
    from system.config.loading import resolve_config

    caplog.set_level(logging.WARNING, logger="actors.weight_sync")
    transport = CollectiveTransport(resolve_config([], ["weight_sync.type=collective"]), SimpleNamespace(ranks=[None]))
    transport.generation = 3
    transport.step_done({"broadcast_failed": 1, "broadcast_generation": 2})
    assert not transport.reform
    transport.step_done({"broadcast_failed": 0, "broadcast_generation": 3})
    assert not transport.reform
    transport.step_done({"broadcast_failed": 1, "broadcast_generation": 3})
    assert transport.reform
    transport.generation = 4  # the rollout loop opened the next one (found by a review: a failure of 3
    transport.step_done({"broadcast_failed": 1, "broadcast_generation": 3})  # read meanwhile tore 4 down)
    assert not transport.reform
    transport.step_done({"broadcast_failed": 1})  # without a number: the current one
    assert transport.reform
    said = [r.getMessage() for r in caplog.records if r.name == "actors.weight_sync"]
    assert [m.split(" failed")[0] for m in said] == [f"weight broadcast generation {g}" for g in (2, 3, 4)]


def test_a_pause_between_versions_longer_than_the_timeout_breaks_nothing():
    """Found by a review: the receivers' wait for the next version was bounded by timeout_s (the
    transfer's bound), so a learner step longer than it (a checkpoint, a long step on a real model)
    failed every generation (broadcast_failed on a healthy run, then a re-formed group and, under
    delta, a full sync). timeout_s = 2, 3 s between versions: both arrive."""
    out, codes, _ = run_generation({0: {"timeout_s": 2.0, "gap_s": 3.0}, 1: {"timeout_s": 2.0}}, [1, 2], "gap")
    assert codes == {0: 0, 1: 0}
    assert delivered(out) == expected([1, 2], members=2)


def test_a_buffer_is_reused_while_gloo_still_holds_a_chunk_view_but_not_while_a_payload_holds_it():
    """CI saw a receiver make a third buffer where two serve (the test above, under the parallel
    suite's load): gloo's worker thread drops its reference to the last chunk's tensor a moment after
    ``wait()`` returns (measured: 118-144 of 3000 waits on 2 cores). Each buffer now keeps its tensor
    for life, so such a view changes no count; a view ``unpack`` made (a payload still held) does."""
    receiver = object.__new__(WeightBroadcast)  # only the buffer bookkeeping: no group
    receiver._buffers, receiver.buffers_made = [], 0
    data, flat = receiver._buffer(64)
    lingering = flat[32:64]  # what gloo's worker thread may still hold
    del data, flat
    again, _ = receiver._buffer(64)
    assert receiver.buffers_made == 1  # the same buffer: the chunk view does not make it look held
    payload_view = again[:16].view(np.int16)  # a payload's array, still held by the caller
    del again
    other, _ = receiver._buffer(64)
    assert receiver.buffers_made == 2 and not np.shares_memory(other, payload_view)
    del lingering

