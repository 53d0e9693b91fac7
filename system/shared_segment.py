"""A named shared-memory segment (a file under ``/dev/shm``, mapped with ``mmap``): how a weight
broadcast hands its data to the members on the same host (``system.weight_broadcast``).

Plain ``os.open`` + ``mmap`` rather than ``multiprocessing.shared_memory``: in Python < 3.13 every
process that *attaches* to one of those registers it with its resource tracker, which unlinks it
when that process exits (and warns), so a worker leaving would destroy the sender's segment.
Here only the creator unlinks: :meth:`SharedSegment.unlink` removes the name (processes that mapped
it keep their mapping until they close it), :meth:`SharedSegment.close` unmaps.

Whether two processes share a ``/dev/shm`` is decided by trying (:func:`probe_token`): containers on
one machine may each have their own. A segment's memory is reserved when it is created
(``posix_fallocate``): a full ``/dev/shm`` (Docker's default is 64 MB) is an ``OSError`` then, never
a SIGBUS on a later write. Names are ``aisrl-<creator pid>-n<pid namespace>-<hex>``;
:func:`remove_orphans` removes the segments of creators that no longer run (killed between creating
one and unlinking it), among those made in its own pid namespace only: a container that shares
``/dev/shm`` but not the pids would see every other container's creators as gone.
"""

import mmap
import os
import re
import secrets
import threading
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
NAME = re.compile(r"aisrl-(\d+)-[0-9a-z-]+")
"""What a segment may be called: ``aisrl-<creator pid>-<lowercase letters, digits, dashes>``."""


def available() -> bool:
    """Whether this host has a writable ``/dev/shm`` (Linux)."""
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


class SharedSegment:
    """``size`` bytes of shared memory under ``/dev/shm/<name>``: created (read-write, mode 0600) or
    attached (read-only; ``size`` None: the whole segment). ``array`` is a uint8 view of the mapping."""

    def __init__(self, name: str, size: int | None, create: bool) -> None:
        if not NAME.fullmatch(name):
            raise ValueError(f"a segment name is aisrl-<pid>-<lowercase letters, digits, dashes>, got {name!r}")
        if size is not None and size < 1 or size is None and create:
            raise ValueError(f"a segment holds at least one byte, got size {size}")
        self.name, self.size, self.created = name, size, create
        self.path = SHM_DIR / name
        flags = (os.O_RDWR | os.O_CREAT | os.O_EXCL if create else os.O_RDONLY) | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
                os.posix_fallocate(fd, 0, size)  # ENOSPC now rather than SIGBUS on a write
            else:
                held = os.fstat(fd).st_size
                size = held if size is None else size
                if held < size or held < 1:
                    raise ValueError(f"shared segment {name} holds {held} bytes, {size} were announced")
                self.size = size
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if create else 0))
        except BaseException:
            os.close(fd)
            if create:
                self.path.unlink(missing_ok=True)
            raise
        os.close(fd)  # the mapping stays valid without the descriptor
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        if not create:
            self.array.setflags(write=False)
        self._linked = create

    def unlink(self) -> None:
        """Remove the name (the creator only; mappings stay valid). Idempotent."""
        if self.created and self._linked:
            self.path.unlink(missing_ok=True)
            self._linked = False

    def close(self) -> None:
        """Unlink (if this process created it) and unmap. Views of ``array`` must be gone by then."""
        self.unlink()
        if self._map is not None:
            self.array = None
            try:
                self._map.close()
            except BufferError:  # a caller still holds a view: the mapping goes with the last one
                pass
            self._map = None


OWN = re.compile(r"aisrl-(\d+)-n([0-9a-f]+)-[0-9a-z-]+")
"""A name :func:`new_name` made: creator pid and pid namespace."""


def pid_namespace() -> str:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``, hex; "0" where unknown)."""
    try:
        return format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except OSError:
        return "0"


def new_name(kind: str = "") -> str:
    """A fresh segment name of this process: ``aisrl-<pid>-n<pid namespace>-[<kind>-]<random hex>``."""
    return f"aisrl-{os.getpid()}-n{pid_namespace()}-{kind + '-' if kind else ''}{secrets.token_hex(6)}"


def remove_orphans() -> list[str]:
    """Unlink the segments whose creator no longer runs, among those made in this pid namespace (a
    pid of another one says nothing here); the names removed. Never raises: a segment this process
    may not unlink (another user's, in the sticky ``/dev/shm``) is left where it is."""
    removed, namespace = [], pid_namespace()
    for path in SHM_DIR.glob("aisrl-*") if available() and namespace != "0" else []:
        match = OWN.fullmatch(path.name)
        if match is None or match.group(2) != namespace or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:  # gone: nobody will unlink it
            try:
                path.unlink(missing_ok=True)
            except OSError:  # another user's, in a sticky /dev/shm: theirs to remove, not a reason to fail
                continue
            removed.append(path.name)
        except PermissionError:  # alive, another user's
            pass
    return removed


def create_probe() -> tuple[SharedSegment, str]:
    """A small segment holding a random token: ``(segment, "name:token")`` for the other side to check."""
    token = secrets.token_hex(16)
    segment = SharedSegment(new_name("probe"), 64, create=True)
    segment.array[:len(token)] = np.frombuffer(token.encode(), dtype=np.uint8)
    return segment, f"{segment.name}:{token}"


def probe_token(announced: str) -> bool:
    """Whether this process sees the probe segment ``create_probe`` announced, token and all."""
    name, _, token = announced.partition(":")
    try:
        segment = SharedSegment(name, 64, create=False)
    except (OSError, ValueError):
        return False
    try:
        return bytes(segment.array[:len(token)]) == token.encode()
    finally:
        segment.close()


def copy_pieces(pairs: list[tuple[np.ndarray, np.ndarray]], threads: int = 2) -> None:
    """``np.copyto(dst, src)`` for every ``(dst, src)`` pair (flat uint8 arrays of equal size), on up
    to ``threads`` threads (numpy releases the GIL while it copies): the pairs' bytes, end to end, are
    cut into ``threads`` contiguous spans of equal size, each copied by one thread in as few calls as
    the pairs allow. Large calls matter: glibc's ``memcpy`` uses non-temporal stores only above a
    size set by the cache (~180 MB on a 2-core Intel Xeon AMX VM), and below it copied at 7.3 GB/s
    there against 12.6 above; a 1 GB buffer on two threads copied at 24.5 GB/s in two halves, at
    14.1 GB/s dealt out in 16 MB pieces (``benchmarks/README.md``, weight transport)."""
    total = sum(dst.size for dst, _ in pairs)
    threads = max(1, min(threads, total, os.cpu_count() or 1))
    share = -(-total // threads) if total else 0
    spans: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(threads)]
    k, room = 0, share
    for dst, src in pairs:
        if dst.size != src.size:
            raise ValueError(f"copy of {src.size} bytes into {dst.size}")
        i = 0
        while i < dst.size:
            n = min(room, dst.size - i)
            spans[k].append((dst[i:i + n], src[i:i + n]))
            i, room = i + n, room - n
            if room == 0 and k < threads - 1:
                k, room = k + 1, share
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for dst, src in spans[k]:
                np.copyto(dst, src)
        except BaseException as exc:  # raised in the caller below: a partial copy is never reported done
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(1, threads)]
    for w in workers:
        w.start()
    run(0)
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
