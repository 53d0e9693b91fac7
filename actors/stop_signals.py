"""Ctrl-C and SIGTERM during a run: stop after the current step, not in the middle of it."""

import logging
import signal
import threading

log = logging.getLogger(__name__)


def stop_on_signals(stop: threading.Event):
    """Make SIGTERM (``ray job stop``, a scheduler's preemption) and a first Ctrl-C (SIGINT) set ``stop``:
    the run ends after the current step, with a final checkpoint, the report and a finished W&B run;
    a second Ctrl-C interrupts at once (Python's ``KeyboardInterrupt``, restored by the first).
    Only in the main thread (elsewhere a no-op). Returns a function that restores the handlers before."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            log.warning("Ctrl-C: stopping after the current step (checkpoint, report, W&B finish); "
                        "Ctrl-C again to stop at once, without them")
        else:
            log.warning("SIGTERM: stopping after the current step (checkpoint, report, W&B finish)")
        stop.set()

    for sig in before:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in before.items():
            signal.signal(sig, old)
    return restore


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


def defer_sigterm():
    """While a shutdown or a failed start cleans up, a SIGTERM is noted and the cleanup goes on (raised
    in the middle, it would leave actors, the W&B run or the replaced run's files behind; a scheduler
    follows with SIGKILL after its grace period anyway). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        log.warning("SIGTERM: finishing the shutdown first")

    signal.signal(signal.SIGTERM, handler)
