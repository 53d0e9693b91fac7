"""Ctrl-C and SIGTERM during a run: stop after the current step, not in the middle of it."""

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)


def stop_on_signals(stop: threading.Event):
    """Make SIGTERM (``ray job stop``, a scheduler's preemption) and a first Ctrl-C (SIGINT) set ``stop``:
    the run ends after the current step, with a final checkpoint, the report and a finished W&B run;
    a second Ctrl-C interrupts at once (Python's ``KeyboardInterrupt``, restored by the first).

    Two Ctrl-Cs that arrive while the main thread waits inside a library call (a step's ``ray.get``)
    reach Python as one call of the handler; a wake-up pipe (``signal.set_wakeup_fd``: one byte per
    signal delivered) tells the handler how many came, so the second still stops at once.
    Only in the main thread (elsewhere a no-op). Returns a function that restores the handlers before."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _STOPPED_BY.clear()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    wakeup_before = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def handler(signum, frame):
        delivered = _drain(read_fd)  # every signal since the handler last ran, this one included
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if delivered.count(signal.SIGINT) >= 2:
                raise KeyboardInterrupt  # a second Ctrl-C came before this handler could run
            log.warning("Ctrl-C: stopping after the current step (checkpoint, report, W&B finish); "
                        "Ctrl-C again to stop at once, without them")
        else:
            log.warning("SIGTERM: stopping after the current step (checkpoint, report, W&B finish)")
        _STOPPED_BY.append(signum)
        stop.set()

    for sig in before:
        signal.signal(sig, handler)

    def restore() -> None:
        try:
            _put_back(before)
        finally:
            signal.set_wakeup_fd(wakeup_before)
            os.close(read_fd)
            os.close(write_fd)
    return restore


def _put_back(handlers: dict) -> None:
    """Reinstall saved handlers (None, one installed from C, becomes the default)."""
    for sig, old in handlers.items():
        signal.signal(sig, old if old is not None else signal.SIG_DFL)


def _drain(fd: int) -> bytes:
    """What a non-blocking pipe holds now (one byte, the signal's number, per delivered signal)."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 512)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


_STOPPED_BY: list[int] = []
"""The signals that asked the run (``stop_on_signals``' handler, since it was installed) to stop after
its step: the first says how the run ended (:func:`stopped_by`)."""


def stopped_by() -> int | None:
    """The signal (``signal.SIGTERM`` or ``signal.SIGINT``) that first asked the run to stop after its
    step, None when none did."""
    return _STOPPED_BY[0] if _STOPPED_BY else None


_TERMINATED: list[int] = []
"""SIGTERMs taken by ``terminate_raises``' handler (a ``ray.get`` it interrupts re-raises a plain
KeyboardInterrupt, so the exception alone does not say which signal it was)."""


def sigterm_received() -> bool:
    """Whether start-up was stopped by SIGTERM (not Ctrl-C)."""
    return bool(_TERMINATED)


class Terminated(KeyboardInterrupt):
    """SIGTERM before the run's loop started (start-up: model build, cluster, actors): raised in the main
    thread like Ctrl-C's KeyboardInterrupt, so a start that is stopped cleans up as one that failed."""


def terminate_raises(start: bool = True):
    """Until ``stop_on_signals`` takes over, make SIGTERM raise :class:`Terminated` in the main thread
    (Ctrl-C already raises KeyboardInterrupt). Call it again (``start=False``) after ``ray.init``,
    whose own handler replaces it (``sys.exit``, or a stack dump and abort, leaving the start's actors
    behind); during ``ray.init`` a SIGTERM ends in ``SystemExit(15)``: ``as_terminated``. Only in the
    main thread (elsewhere a no-op). Returns a function that restores the handler before the call."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if start:
        _TERMINATED.clear()
    before = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        _TERMINATED.append(signum)
        raise Terminated("SIGTERM during start-up")

    signal.signal(signal.SIGTERM, handler)

    def restore() -> None:  # a trainer shut down from another thread (a test's runner) cannot
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)

    return restore


def as_terminated(exc: SystemExit) -> BaseException:
    """``ray.init``'s SIGTERM handler exits (``SystemExit(15)``) while it starts the cluster: that is a
    :class:`Terminated` too. Any other exit is returned as it is."""
    if exc.code == signal.SIGTERM:
        _TERMINATED.append(signal.SIGTERM)
        return Terminated("SIGTERM during start-up")
    return exc


def defer_signals():
    """While a shutdown or a failed start cleans up, or the private cluster stops, a SIGTERM or a Ctrl-C
    is noted and the cleanup goes on (raised in the middle, it would leave actors, the W&B run, the
    replaced run's files or the cluster's processes behind; a scheduler follows with SIGKILL after its
    grace period anyway). Main thread only (elsewhere a no-op). Returns a function that restores the
    handlers before the call."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        log.warning("%s: finishing the shutdown first", "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C")

    for sig in before:
        signal.signal(sig, handler)

    return lambda: _put_back(before)
