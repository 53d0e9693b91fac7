"""The correction service's dump beside the step (``system.report.dump_in_flight``): the caller goes on
while a dump is written, the step's record waits for its own step's dump only, one dump at a time, and a
failed dump raises where it is waited for. Found by a review: a dump step's weights went back to the
learners only once its npz was on disk (~10 us a token on a 2-core VM)."""

import threading

import pytest

from system.report.dump_in_flight import DumpInFlight


def test_the_caller_goes_on_while_a_dump_is_written_and_the_record_waits_for_its_own_step():
    release, written = threading.Event(), []

    def write(step, payload):
        assert release.wait(10)
        written.append((step, payload))

    dumps = DumpInFlight(write)
    dumps.start(10, "batch 10")  # returns at once: the dump waits for `release`
    assert written == []
    dumps.wait(through=9)  # the record of step 9: not this dump's, no wait (a wait would fail in 10 s)
    assert written == []
    waiter = threading.Thread(target=dumps.wait, kwargs={"through": 10})
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # step 10's record waits for step 10's dump
    release.set()
    waiter.join(10)
    assert not waiter.is_alive() and written == [(10, "batch 10")]
    dumps.close()


def test_one_dump_at_a_time_in_order_and_a_failure_raised_where_it_is_waited_for():
    order = []

    def write(step):
        order.append(step)
        if step == 20:
            raise OSError(28, "No space left on device")

    dumps = DumpInFlight(write)
    dumps.start(10)
    dumps.start(20)  # waits for 10 first: one batch held at a time
    assert order[0] == 10
    with pytest.raises(OSError, match="No space left"):
        dumps.wait(through=20)
    dumps.wait()  # raised once: nothing in flight now
    dumps.start(30)
    dumps.close()  # waits for 30
    assert order == [10, 20, 30]
    with pytest.raises(RuntimeError):  # closed: no more dumps
        dumps.start(40)
