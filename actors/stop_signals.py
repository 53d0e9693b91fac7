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


def terminate_raises():
    """Until ``stop_on_signals`` takes over, make SIGTERM raise :class:`Terminated` in the main thread
    (Ctrl-C already raises KeyboardInterrupt). Call it again after ``ray.init``, whose failure-signal
    handler replaces it (it dumps a stack and aborts, leaving the start's actors behind). Only in the
    main thread (elsewhere a no-op). Returns a function that restores the handler before the first call."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        _TERMINATED.append(signum)
        raise Terminated("SIGTERM during start-up")

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
