"""A rollout worker's weight mailbox: the newest offered policy version, adopted when a call starts.

The controller *offers* each new version to a worker the moment it is published (a call that
runs beside generation, not behind it), and queues the next generate call before the current
one returns. The call adopts, when it starts, the newest version offered by then, so a call
queued early never samples with older weights than one sent at the last moment would, and the
worker does not idle through a driver round trip between calls. A call may require a version
(``min_version``, the staleness bound): it waits for that offer, up to a timeout.

An idle worker loads an offer at once (``try_adopt`` from the offering thread, when the engine
is free), as a queued load call used to; a busy one leaves it for its next call.
"""

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

Source = TypeVar("Source")


class WeightMailbox(Generic[Source]):
    """The newest ``(version, source)`` offered; ``source`` is what the worker loads the version from."""

    def __init__(self, held_version: int = 0) -> None:
        self._cond = threading.Condition()
        self._offer: tuple[int, Source] | None = None
        self.held_version = held_version
        """The version the engine holds (updated by :meth:`adopt`)."""
        self.engine = threading.Lock()
        """Held while the engine generates or loads: one thing at a time."""

    def offer(self, version: int, source: Source) -> bool:
        """Record ``version`` if newer than every earlier offer and the held version; True if recorded."""
        with self._cond:
            newest = self._offer[0] if self._offer is not None else self.held_version
            if version <= newest:
                return False
            self._offer = (version, source)
            self._cond.notify_all()
            return True

    def offered_version(self) -> int:
        with self._cond:
            return self._offer[0] if self._offer is not None else self.held_version

    def adopt(self, load: Callable[[int, Source], None], min_version: int = 0, timeout_s: float = 60.0) -> int:
        """Call with :attr:`engine` held: wait until a version >= ``min_version`` is held or offered (up to
        ``timeout_s``), load the newest offer if it is newer than the held one (``load(version, source)``)
        and return the version held. The caller refuses to generate if it is still < ``min_version``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.held_version < min_version and (self._offer is None or self._offer[0] < min_version):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            offer, self._offer = self._offer, None
        if offer is not None and offer[0] > self.held_version:
            try:
                load(*offer)
            except BaseException:
                self.offer(*offer)  # kept for the next call (unless a newer one came meanwhile)
                raise
            self.held_version = offer[0]
        return self.held_version

    def try_adopt(self, load: Callable[[int, Source], None]) -> bool:
        """Load the newest offer now if the engine is free (an idle worker); True if it loaded one."""
        if not self.engine.acquire(blocking=False):
            return False
        try:
            before = self.held_version
            return self.adopt(load, timeout_s=0.0) > before
        finally:
            self.engine.release()
