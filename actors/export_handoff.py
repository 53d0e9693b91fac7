"""The hand-off of each step's exported weights from learner rank 0's step thread to its export thread.

A rank's ``step`` ends with the new version's payload (numpy arrays, a copy of the weights, not
views of live parameters); returning it from ``step`` would make Ray copy it into the object store
before the rank's next call can start, on the learners' critical path (2 MB: ~2 ms between two
steps, 200 MB: ~70 ms; 2-core AMD EPYC). Instead ``step`` puts it here and returns, and the rank's
``weights(version)`` call, running on a thread of its own (a Ray concurrency group), takes it and
returns it: Ray's copy then overlaps the next step (it mostly releases the GIL). At most one payload
waits here: a step that ends while the previous version is still untaken waits for it (the copies
cannot fall behind the steps without bound: rank 0 holds at most the payload being copied, the one
waiting and the one being built).
"""

import threading


class ExportHandoff:
    """One payload (or the error that replaced it) per policy version, from :meth:`put` / :meth:`fail`
    on one thread to :meth:`take` on another."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: dict[int, object] = {}
        self._failed: dict[int, str] = {}
        self._closed = False

    def put(self, version: int, payload: object) -> None:
        """Hand over ``version``'s payload, once no earlier one is waiting to be taken (or at once after
        :meth:`close`, which drops it)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._ready or self._closed)
            if self._closed:
                return
            self._ready[version] = payload
            self._cond.notify_all()

    def fail(self, version: int, reason: str) -> None:
        """The step producing ``version`` failed: its ``take`` raises instead of waiting forever."""
        with self._cond:
            self._failed[version] = reason
            self._cond.notify_all()

    def close(self) -> None:
        """Every waiting and later ``take`` raises (the rank is shutting down)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, version: int, timeout_s: float | None = None) -> object:
        """Wait for ``version``'s payload and hand it over (it is not kept here). Raises
        ``RuntimeError`` when its step failed or the hand-off was closed, ``TimeoutError`` after
        ``timeout_s`` seconds without it."""
        with self._cond:
            if not self._cond.wait_for(lambda: version in self._ready or version in self._failed or self._closed,
                                       timeout_s):
                raise TimeoutError(f"no weights for policy version {version} after {timeout_s} s")
            if version in self._ready:
                payload = self._ready.pop(version)
                self._cond.notify_all()  # a put waiting for room
                return payload
            if version in self._failed:
                raise RuntimeError(f"the step producing policy version {version} failed: {self._failed.pop(version)}")
            raise RuntimeError(f"the learner rank closed before policy version {version} was exported")
