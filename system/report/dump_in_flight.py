"""One batch dump written in a thread of its own while its caller goes on (the correction service:
the step's weights go back to the learners before its dump is on disk).

At most one dump is in flight: starting the next waits for the previous one, so one batch at a time is
held for dumping. ``wait(through=step)`` is what the step's record does before it is written (its media
go with it); a dump that failed raises its error there.
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class DumpInFlight:
    def __init__(self, write: Callable[..., None]) -> None:
        """``write(step, *args)``: writes step ``step``'s dump."""
        self._write = write
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="aisrl-dump")
        self._current: tuple[int, Future] | None = None

    def start(self, step: int, *args) -> None:
        """Write step ``step``'s dump beside the caller (after the one in flight, which is waited for)."""
        self.wait()
        self._current = (step, self._pool.submit(self._write, step, *args))

    def wait(self, through: int | None = None) -> None:
        """Wait for the dump in flight, if any (only if it is of a step up to ``through``); its error is
        raised here, once."""
        if self._current is not None and (through is None or self._current[0] <= through):
            (_, future), self._current = self._current, None
            future.result()

    def close(self) -> None:
        """Wait for the dump in flight (raising its error), then stop the thread."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
