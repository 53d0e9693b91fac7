"""``system.shared_segment``: a named segment under /dev/shm, created, attached, unlinked; orphans."""

import os
import subprocess
import sys

import numpy as np
import pytest

from system import shared_segment
from system.shared_segment import SharedSegment

pytestmark = pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm")


def test_an_attached_segment_reads_what_the_creator_wrote_and_outlives_the_name():
    created = SharedSegment(shared_segment.new_name("test"), 1000, create=True)
    created.array[:] = np.arange(1000) % 251
    attached = SharedSegment(created.name, None, create=False)  # None: the whole segment, 1000 bytes
    assert attached.size == 1000 and not attached.array.flags.writeable
    created.unlink()
    assert not created.path.exists()
    created.array[3] = 7  # after the unlink, the mappings are still one memory
    assert attached.array[3] == 7 and np.array_equal(attached.array[4:], np.arange(4, 1000) % 251)
    attached.close()
    created.close()
    with pytest.raises(FileNotFoundError):
        SharedSegment(created.name, None, create=False)


def test_an_announced_size_larger_than_the_segment_and_bad_names_are_refused():
    created = SharedSegment(shared_segment.new_name("test"), 64, create=True)
    try:
        with pytest.raises(ValueError, match="holds 64 bytes, 65 were announced"):
            SharedSegment(created.name, 65, create=False)
        with pytest.raises(FileExistsError):
            SharedSegment(created.name, 64, create=True)  # never two creators of one name
    finally:
        created.close()
    for name in ("../etc/x", "aisrl-12-..", "other-12-ab", "aisrl-x-ab", "aisrl-12-AB"):
        with pytest.raises(ValueError, match="a segment name is aisrl-<pid>-"):
            SharedSegment(name, 64, create=True)


def test_a_segment_larger_than_dev_shm_fails_when_made_not_when_written():
    free = os.statvfs(shared_segment.SHM_DIR)
    too_big = free.f_bavail * free.f_frsize + (1 << 30)
    name = shared_segment.new_name("test")
    with pytest.raises(OSError):  # ENOSPC from posix_fallocate (a bare ftruncate would succeed)
        SharedSegment(name, too_big, create=True)
    assert not (shared_segment.SHM_DIR / name).exists()


def test_the_probe_is_seen_with_its_token_only():
    probe, announced = shared_segment.create_probe()
    try:
        assert shared_segment.probe_token(announced)
        assert not shared_segment.probe_token(announced[:-1] + ("0" if announced[-1] != "0" else "1"))
        assert not shared_segment.probe_token(f"aisrl-{os.getpid()}-missing:abc")
    finally:
        probe.close()
    assert not shared_segment.probe_token(announced)  # gone with its creator's close


def test_orphans_of_processes_that_no_longer_run_are_removed_and_nothing_else():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)  # exited: its pid runs nothing (unless reused within this test)
    ns = shared_segment.pid_namespace()
    orphan = shared_segment.SHM_DIR / f"aisrl-{dead_pid}-n{ns}-deadbeef"
    orphan.write_bytes(b"x" * 10)
    mine = SharedSegment(shared_segment.new_name("test"), 64, create=True)
    alive = shared_segment.SHM_DIR / f"aisrl-{os.getppid()}-n{ns}-cafe"  # the parent runs
    alive.write_bytes(b"y")
    # the same dead pid in another pid namespace (a container sharing /dev/shm): not ours to judge
    foreign = shared_segment.SHM_DIR / f"aisrl-{dead_pid}-n{int(ns, 16) + 1:x}-beef"
    foreign.write_bytes(b"z")
    unmarked = shared_segment.SHM_DIR / f"aisrl-{dead_pid}-feed"  # no namespace in the name: left alone
    unmarked.write_bytes(b"w")
    try:
        removed = shared_segment.remove_orphans()
        assert orphan.name in removed and not orphan.exists()
        assert mine.path.exists() and alive.exists() and mine.name not in removed and alive.name not in removed
        assert foreign.exists() and unmarked.exists() and foreign.name not in removed and unmarked.name not in removed
    finally:
        for path in (orphan, alive, foreign, unmarked):
            path.unlink(missing_ok=True)
        mine.close()


def test_an_orphan_this_process_may_not_unlink_is_left_and_the_others_still_go(monkeypatch):
    """In a sticky /dev/shm another user's orphan cannot be unlinked (PermissionError, as a probe saw):
    it stays, the call returns (a raise here stopped every broadcast generation from forming), and an
    orphan that can be unlinked is still removed."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    ns = shared_segment.pid_namespace()
    theirs = shared_segment.SHM_DIR / f"aisrl-{int(dead.stdout)}-n{ns}-0ther0"
    ours = shared_segment.SHM_DIR / f"aisrl-{int(dead.stdout)}-n{ns}-0ur50"
    theirs.write_bytes(b"t")
    ours.write_bytes(b"o")
    real_unlink = type(theirs).unlink

    def unlink(path, missing_ok=False):
        if path.name == theirs.name:
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(type(theirs), "unlink", unlink)
    try:
        removed = shared_segment.remove_orphans()
        assert removed.count(ours.name) == 1 and not ours.exists()
        assert theirs.name not in removed and theirs.exists()
    finally:
        monkeypatch.undo()
        theirs.unlink(missing_ok=True)
        ours.unlink(missing_ok=True)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_copy_pieces_copies_every_pair_whole_however_the_spans_cut_them(threads):
    """Pairs of 0, 1, 7, 1000 and 33 bytes (1041 in all): with 2 threads the spans are bytes [0, 521) and
    [521, 1041), cutting the 1000-byte pair at its byte 513; with 3, at 347 and 694. Every destination
    ends equal to its source, byte for byte, and nothing outside them is written."""
    rng = np.random.default_rng(threads)
    sizes = [0, 1, 7, 1000, 33]
    sources = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    canvas = np.full(sum(sizes) + 2 * len(sizes), 7, dtype=np.uint8)  # a guard byte either side of each
    dsts, guards, at = [], [], 0
    for n in sizes:
        dsts.append(canvas[at + 1:at + 1 + n])
        guards += [at, at + 1 + n]
        at += n + 2
    shared_segment.copy_pieces(list(zip(dsts, sources, strict=True)), threads=threads)
    assert all(np.array_equal(d, s) for d, s in zip(dsts, sources, strict=True))
    assert (canvas[guards] == 7).all()


def test_copy_pieces_refuses_pairs_of_two_sizes_and_raises_a_threads_error():
    with pytest.raises(ValueError, match="copy of 5 bytes into 4"):
        shared_segment.copy_pieces([(np.zeros(4, np.uint8), np.zeros(5, np.uint8))])
    dst = np.zeros(2000, np.uint8)
    read_only = np.zeros(2000, np.uint8)
    read_only.setflags(write=False)
    # the second span ([1000, 2000) of the read-only pair) fails in the second thread: raised here
    with pytest.raises(ValueError, match="read-only"):
        shared_segment.copy_pieces([(dst[:1000], np.ones(1000, np.uint8)), (read_only[:1000], np.ones(1000, np.uint8))],
                                   threads=2)


@pytest.mark.parametrize(("threads", "expected"), [
    # 1041 bytes in pairs of 0, 1, 7, 1000 and 33: spans of ceil(1041 / threads) bytes, end to end
    (1, [[1, 7, 1000, 33]]),
    (2, [[1, 7, 513], [487, 33]]),  # 521 + 520
    (3, [[1, 7, 339], [347], [314, 33]]),  # 347 each
])
def test_copy_pieces_gives_each_thread_one_contiguous_span(monkeypatch, threads, expected):
    """Which thread copies what: the sizes of each thread's ``np.copyto`` calls, in order (machines with
    fewer cores than ``threads`` are told they have enough)."""
    import threading

    monkeypatch.setattr(shared_segment.os, "cpu_count", lambda: 8)
    calls, real = {}, np.copyto

    def spy(dst, src):
        calls.setdefault(threading.current_thread().name, []).append(dst.size)  # names: idents are reused
        real(dst, src)
    monkeypatch.setattr(shared_segment.np, "copyto", spy)
    pairs = [(np.zeros(n, np.uint8), np.ones(n, np.uint8)) for n in (0, 1, 7, 1000, 33)]
    shared_segment.copy_pieces(pairs, threads=threads)
    monkeypatch.undo()
    assert sorted(calls.values()) == sorted(expected)
    assert all(dst.all() for dst, _ in pairs)
