"""Rank 0's correction call (``actors.correction_call``): started on its own thread, packed both ways.

A stand-in service handle (no Ray cluster): its ``process.remote`` blocks until the test releases it,
so ``start`` returning first shows the step's thread never waits for the submission.
"""

import threading

import numpy as np
import pytest

from actors.correction_call import CorrectionCall
from system.learner.collate import collate_groups
from system.types import Completion, Prompt, RolloutGroup


def _batch():
    """Two sequences: responses [8 9] and [10] (mask rows [1 1], [1 0])."""
    def c(k, response, mu):
        return Completion("a", k, np.array([5, 6]), np.array(response), np.array(mu, np.float32), "", float(k), 0)
    return collate_groups([RolloutGroup(Prompt("a", "", ""), (c(0, [8, 9], [-0.1, -0.2]), c(1, [10], [-0.3])), 0)],
                          scale_advantages_by_std=False)


class _Service:
    def __init__(self, weights_N, fail: bool = False) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls, self.weights_N, self.fail = [], weights_N, fail
        self.process = self

    def remote(self, step, holder, proximal_N, version):
        self.calls.append((step, holder, proximal_N.copy(), version, threading.current_thread().name))
        self.entered.set()
        if not self.release.wait(5):
            raise TimeoutError("never released: the submission blocked the caller")
        if self.fail:
            raise RuntimeError("the service is gone")
        return (self.weights_N, {"correction/x": 1.0})


def test_the_call_is_started_off_the_step_thread_and_travels_packed():
    service = _Service(np.array([0.5, 2.0, 1.5], np.float32))
    call = CorrectionCall(service, get=lambda reply: reply)
    proximal_BT = np.array([[-0.15, -0.25], [-0.35, 7.0]], np.float32)  # 7.0: padding, never sent
    wait = call.start(3, _batch(), ["ref"], proximal_BT, 2)  # a start on this thread would time out here
    assert service.entered.wait(5)  # the submission is in progress, blocked, on the call's own thread
    service.release.set()
    weights_BT, metrics = wait()
    np.testing.assert_array_equal(weights_BT, [[0.5, 2.0], [1.5, 0.0]])  # unpacked, 0 off the mask
    assert metrics == {"correction/x": 1.0}
    step, holder, proximal_N, version, thread = service.calls[0]
    assert (step, holder, version) == (3, ["ref"], 2)
    np.testing.assert_array_equal(proximal_N, np.float32([-0.15, -0.25, -0.35]))
    assert thread.startswith("aisrl-correction-call") and thread != threading.current_thread().name


def test_a_failed_call_raises_in_the_wait_and_a_short_reply_is_refused():
    failing = _Service(None, fail=True)
    failing.release.set()
    call = CorrectionCall(failing, get=lambda reply: reply)
    with pytest.raises(RuntimeError, match="the service is gone"):
        call.start(1, _batch(), ["ref"], np.zeros((2, 2), np.float32), 0)()
    short = _Service(np.ones(2, np.float32))  # two weights for three response tokens
    short.release.set()
    call = CorrectionCall(short, get=lambda reply: reply)
    with pytest.raises(ValueError, match=r"correction service's weights: \(2,\) values packed, the batch has 3"):
        call.start(1, _batch(), ["ref"], np.zeros((2, 2), np.float32), 0)()


def test_packing_refuses_a_mask_that_is_not_bool():
    """An integer mask would index rows by position instead of selecting tokens."""
    from system.learner.batch import pack_response, unpack_response

    with pytest.raises(TypeError, match=r"must be a bool \[B, T\] array, got int64 of shape \(2, 2\)"):
        pack_response(np.ones((2, 2)), np.ones((2, 2), np.int64))
    with pytest.raises(TypeError, match="must be a bool"):
        unpack_response(np.ones(4), [[1, 1], [0, 1]], "x")  # a list: its values are ints
    # a per-row mask would have packed whole rows (a probe), a wrong-sized one failed inside numpy
    with pytest.raises(TypeError, match=r"got bool of shape \(2,\)"):
        pack_response(np.ones((2, 3)), np.ones(2, bool))
    with pytest.raises(ValueError, match=r"packing \(2, 3\) values with a \(3, 3\) response mask"):
        pack_response(np.ones((2, 3)), np.ones((3, 3), bool))
