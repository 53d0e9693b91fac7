"""Ctrl-C and SIGTERM around a run (``actors.stop_signals``): the first stops after the step, a second
Ctrl-C at once. Found by a sixth probe (2026-11-27): two Ctrl-Cs that reach Python as one
handler call still stop at once; a Ctrl-C or SIGTERM during the cleanup, or while the private cluster
stops, is noted instead of raised (raised inside Ray's shutdown it left the cluster's agents running
and the CLI exited with a traceback). The signals are sent to this process; the handlers before each
test are put back."""

import hashlib
import logging
import os
import signal
import threading
import time

import pytest

from actors import cluster
from actors.stop_signals import defer_signals, stop_on_signals, stopped_by


@pytest.fixture
def handlers():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, old in before.items():
        signal.signal(sig, old)


def test_the_first_signal_that_asked_for_the_stop_is_remembered_until_the_next_run(handlers):
    """How ``aisrl train`` ends a run a signal stopped after its step: exit 143 (SIGTERM) or 130 (Ctrl-C),
    not 0 and "done:" (a probe: a script could not tell a stopped run from a finished one)."""
    restore = stop_on_signals(threading.Event())
    assert stopped_by() is None
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    restore()
    assert stopped_by() == signal.SIGINT  # the first; still known after the handlers are put back
    defer_signals()()  # the cleanup's handlers, installed and put back, do not forget it
    assert stopped_by() == signal.SIGINT
    restore = stop_on_signals(threading.Event())  # the next run in this process starts with none
    assert stopped_by() is None
    restore()


def test_sigterm_and_a_first_ctrl_c_request_a_stop_and_a_second_ctrl_c_interrupts():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stop = threading.Event()
    restore = stop_on_signals(stop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this (the main) thread before kill returns
        assert stop.is_set()
        stop.clear()
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: a stop request, no KeyboardInterrupt
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):  # the second: at once
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        restore()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_outside_the_main_thread_nothing_is_installed():
    seen = {}

    def side():
        seen["restore"] = stop_on_signals(threading.Event())

    before = signal.getsignal(signal.SIGINT)
    t = threading.Thread(target=side)
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGINT) is before
    seen["restore"]()


def signals_during_a_long_library_call(*sigs: int) -> None:
    """Deliver ``sigs``, 20 ms apart, while the main thread is inside a C call that releases the GIL and
    checks no signal (as a step's ``ray.get`` does): Python runs its handler once, after the call
    returns. (Sent back to back, the kernel would merge them into one pending signal; keys pressed
    by a person are delivered one by one, as here.)"""
    started, sent = threading.Event(), []

    def send():
        started.wait()
        for sig in sigs:
            os.kill(os.getpid(), sig)
            time.sleep(0.02)
        sent.append(time.perf_counter())

    sender = threading.Thread(target=send)
    sender.start()
    data = bytes(512 << 20)
    started.set()
    hashlib.sha256(data).digest()  # ~0.3-1 s in C without the GIL
    returned = time.perf_counter()
    sender.join()
    assert sent[0] < returned, "the signals came after the call: this test needs a longer one"


def test_two_ctrl_cs_that_python_sees_as_one_still_stop_at_once(handlers, caplog):
    caplog.set_level(logging.WARNING)
    stop = threading.Event()
    restore = stop_on_signals(stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            signals_during_a_long_library_call(signal.SIGINT, signal.SIGINT)
            time.sleep(0.1)  # the handler runs here at the latest
    finally:
        restore()
    assert "Ctrl-C: stopping after the current step" not in caplog.text  # not the polite stop: at once


def test_one_ctrl_c_stops_after_the_step_and_a_later_one_at_once(handlers, caplog):
    caplog.set_level(logging.WARNING)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stop = threading.Event()
    restore = stop_on_signals(stop)
    try:
        signals_during_a_long_library_call(signal.SIGINT)
        time.sleep(0.1)
        assert stop.is_set() and "Ctrl-C: stopping after the current step" in caplog.text
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    finally:
        restore()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # all put back
    assert signal.set_wakeup_fd(-1) == -1  # and no wake-up pipe left installed


def test_a_signal_while_the_cluster_stops_is_noted_and_the_stop_goes_on(handlers, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    stopped = []

    def shutdown():  # Ray's shutdown, which sleeps while its processes end
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        stopped.append(True)

    monkeypatch.setattr(cluster.ray, "shutdown", shutdown)
    before = signal.getsignal(signal.SIGINT)
    cluster.stop_session()
    assert stopped == [True]
    assert "Ctrl-C: finishing the shutdown first" in caplog.text
    assert "SIGTERM: finishing the shutdown first" in caplog.text
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C raises again after it


def test_defer_signals_off_the_main_thread_is_a_no_op():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    out = []
    thread = threading.Thread(target=lambda: out.append(defer_signals()))
    thread.start()
    thread.join()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert out[0]() is None
