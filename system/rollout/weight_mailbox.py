"""A rollout worker's weight mailbox: the newest offered policy version, adopted when a call starts.

The controller *offers* each new version to a worker as soon as it knows where the version will
come from: the learner step that produces version k+1 is submitted with the reference its weights
will have, and the offer goes out then, while the step still runs (a call beside generation, not
behind it). The worker queues the next generate call before the current one returns. A call
adopts, when it starts, the newest offered version whose weights already exist (``ready``); a call
that requires a version (``min_version``, the staleness bound) waits for it to be offered (up to
a timeout) and then for its weights to exist (as long as the step producing them takes; a failed
step makes the load raise), without loading an older existing version meanwhile. So a call queued
early never samples with older weights than one sent at the last moment would, and no version waits
for a driver round trip after its step ends.

An idle worker loads an offer as soon as its weights exist (``adopt_if_idle``: ``try_adopt`` now, or
``load_when_ready`` in the background), as a queued load call used to; a busy one leaves it for its
next call.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Generic, TypeVar

from system.types import GroupList, RolloutGroup

Source = TypeVar("Source")


def always_ready(source, timeout_s: float | None) -> bool:
    """Offers whose weights exist when offered (the default)."""
    return True


class WeightMailbox(Generic[Source]):
    """The offered ``(version, source)`` pairs newer than the held version; ``source`` is what the worker
    loads the version from, and ``ready(source, timeout_s)`` says whether it exists yet, waiting up to
    ``timeout_s`` (0: a check; None: as long as it takes)."""

    def __init__(self, held_version: int = 0,
                 ready: Callable[[Source, float | None], bool] = always_ready) -> None:
        self._cond = threading.Condition()
        self._offers: dict[int, Source] = {}
        self._ready = ready
        self.held_version = held_version
        """The version the engine holds (updated by :meth:`adopt`)."""
        self.engine = threading.Lock()
        """Held while the engine generates or loads: one thing at a time."""
        self.waited_s = 0.0
        """Seconds the last :meth:`adopt` waited for its ``min_version`` (offered, then ready)."""
        self._missed = False  # a try_adopt found the engine held (see try_adopt)

    def offer(self, version: int, source: Source) -> bool:
        """Record ``version`` if newer than every earlier offer and the held version; True if recorded.
        Offers older than the newest one whose weights exist are dropped (never adopted: each would
        only keep its copy of the weights alive)."""
        with self._cond:
            if version <= max(self._offers, default=self.held_version):
                return False
            self._offers[version] = source
            self._cond.notify_all()
        newest = self._newest_ready()
        if newest is not None:
            with self._cond:
                for v in [v for v in self._offers if v < newest[0]]:
                    del self._offers[v]
        return True

    def offered_version(self) -> int:
        with self._cond:
            return max(self._offers, default=self.held_version)

    def _newest_ready(self) -> tuple[int, Source] | None:
        with self._cond:
            candidates = sorted(self._offers.items(), reverse=True)
        return next(((v, s) for v, s in candidates if self._ready(s, 0.0)), None)

    def _load(self, load: Callable[[int, Source], None], version: int, source: Source) -> None:
        load(version, source)  # raises: the offers stay for the next call
        with self._cond:
            self.held_version = version
            for v in [v for v in self._offers if v <= version]:
                del self._offers[v]

    def adopt(self, load: Callable[[int, Source], None], min_version: int = 0, timeout_s: float = 60.0) -> int:
        """Call with :attr:`engine` held: load the newest offer whose weights exist, if newer than the held
        version and not below ``min_version`` (an older one would be replaced before the call samples;
        ``load(version, source)``); if the held version is still below ``min_version``, wait up to
        ``timeout_s`` for a version >= ``min_version`` to be offered and then, however long it takes,
        for its weights to exist. Returns the version held; the caller refuses to generate if it is
        still < ``min_version`` (never offered in time)."""
        deadline = time.monotonic() + timeout_s
        self.waited_s = 0.0  # only the waits below: the loads are not counted, waiting or not
        while True:
            chosen = self._newest_ready()
            if chosen is not None and chosen[0] >= min_version:  # an older one would be replaced unused
                self._load(load, *chosen)
            if self.held_version >= min_version:
                return self.held_version
            started = time.monotonic()
            with self._cond:
                pending = sorted((v, s) for v, s in self._offers.items() if v >= min_version)
                if not pending:
                    remaining = deadline - started
                    if remaining <= 0:
                        return self.held_version
                    self._cond.wait(remaining)
                    self.waited_s += time.monotonic() - started
                    continue
            version, source = pending[0]
            self._ready(source, None)  # the oldest sufficient version is produced first
            self.waited_s += time.monotonic() - started
            # load it now (or a newer one whose weights exist), trusting the blocking wait: a zero-timeout
            # check right after it may still say no (Ray has had such lags), and would spin this loop
            chosen = self._newest_ready()
            if chosen is None or chosen[0] < version:
                with self._cond:
                    chosen = (version, source) if self._offers.get(version) is source else None
            if chosen is not None:
                self._load(load, *chosen)

    def try_adopt(self, load: Callable[[int, Source], None]) -> bool:
        """Load the newest offer whose weights exist, now, if the engine is free (an idle worker);
        True if it loaded one. An offer that finds the engine held by another ``try_adopt`` (an idle
        load in progress) is looked at by that one before it returns."""
        loaded = False
        while True:
            if not self.engine.acquire(blocking=False):
                with self._cond:
                    self._missed = True
                return loaded
            try:
                with self._cond:
                    self._missed = False
                before = self.held_version
                loaded = self.adopt(load, timeout_s=0.0) > before or loaded
            finally:
                self.engine.release()
            with self._cond:
                if not self._missed:
                    return loaded

    def adopt_if_idle(self, load: Callable[[int, Source], None]) -> threading.Thread | None:
        """What an offer does on an idle worker: load the newest offer now if its weights exist
        (:meth:`try_adopt`), else once they do (:meth:`load_when_ready`). A load that fails (a failed
        step) is left to the next generate call, whose load raises it; the offers stay."""
        try:
            self.try_adopt(load)
        except Exception:  # noqa: BLE001 - raised again by the next call's load
            return None
        return self.load_when_ready(load)

    def load_when_ready(self, load: Callable[[int, Source], None]) -> threading.Thread | None:
        """An idle worker's newest offer: wait for its weights in a background thread, then
        :meth:`try_adopt` (a call that starts meanwhile adopts it itself); if they exist already (they
        may have appeared since the caller's own :meth:`try_adopt` looked), load it now. The thread, or
        None if none was needed."""
        with self._cond:
            newest = max(self._offers, default=None)
            source = self._offers.get(newest) if newest is not None else None
        if newest is None:
            return None

        def wait_then_adopt() -> None:
            try:
                self._ready(source, None)
                self.try_adopt(load)
            except Exception:  # noqa: BLE001 - a failed step: the next call's load raises it
                pass

        if self._ready(source, 0.0):
            wait_then_adopt()
            return None

        thread = threading.Thread(target=wait_then_adopt, name=f"adopt-v{newest}", daemon=True)
        thread.start()
        return thread


def with_weights_wait(groups: list[RolloutGroup], waited_s: float) -> GroupList:
    """A call's result: its groups, the first carrying the seconds the call waited for its weights
    (``RolloutGroup.weights_wait_s``; the controller adds them to the rollout side's pause), as a
    ``GroupList`` (one set of columns through Ray)."""
    return GroupList([replace(groups[0], weights_wait_s=waited_s), *groups[1:]] if groups and waited_s else groups)
