"""Ctrl-C and SIGTERM during a run (``actors.stop_signals.stop_on_signals``): the first stops after the step."""

import os
import signal
import threading

import pytest

from actors.stop_signals import stop_on_signals


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
