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
