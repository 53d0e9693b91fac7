"""Rank 0's call to the correction service, made from a thread of its own.

The learner's update needs the correction weights only after its first forward pass, so the call is
started before it and waited for after it (``system.learner.group_step``). Submitting the call (its
arguments serialized, the batch's reference lent on) and reading the reply are Ray work of a few
milliseconds under load; on this thread they overlap the update instead of delaying its start.
The proximal log-probs go, and the weights come back, packed: one float32 per response token
(``system.learner.batch.pack_response``), so a batch's padding never travels and a small batch's call
and reply ride inline instead of through the object store.
"""

import threading
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import ray

from system.learner.batch import LearnerBatch, pack_response, unpack_response


class CorrectionCall:
    """Starts ``service.process`` for a step on a thread of its own; ``start`` returns the wait."""

    def __init__(self, service: ray.actor.ActorHandle, get=ray.get) -> None:
        """``get``: how the reply is read (``ray.get``; a stand-in in the unit tests)."""
        self.service, self._get = service, get

    def start(self, step: int, batch: LearnerBatch, holder: list, proximal_BT: np.ndarray,
              learner_version: int) -> Callable[[], tuple[np.ndarray, dict]]:
        """Start the call for ``batch`` (``holder``: ``[its reference]``, which the service reads); the
        returned function waits for ``(weights_BT, correction metrics)`` and raises what the call raised."""
        mask_BT = batch.response_mask_BT()  # the mask the service unpacks with (``correction_input``)
        future: Future = Future()

        def call() -> None:
            try:
                ref = self.service.process.remote(step, holder, pack_response(proximal_BT, mask_BT), learner_version)
                future.set_result(self._get(ref))
            except BaseException as exc:  # noqa: BLE001 - raised again, as it came, by the wait
                future.set_exception(exc)

        # one daemon thread per call (a step's wait comes before the next step's start, so calls never
        # overlap and reach the service in order): a call stuck in a hung service never holds up the
        # process's exit, as a pool's worker thread, joined at exit, would
        threading.Thread(target=call, name=f"aisrl-correction-call-{step}", daemon=True).start()

        def wait() -> tuple[np.ndarray, dict]:
            weights_N, metrics = future.result()
            return unpack_response(weights_N, mask_BT, "the correction service's weights"), metrics
        return wait

