"""Rank 0's call to the correction service, made from a thread of its own.

The learner's update needs the correction weights only after its first forward pass, so the call is
started before it and waited for after it (``system.learner.group_step``). Submitting the call (its
arguments serialized, the batch's reference lent on) and reading the reply are Ray work of a few
milliseconds under load; on this thread they overlap the update instead of delaying its start.
The proximal log-probs go, and the weights come back, packed: one float32 per response token
(``system.learner.batch.pack_response``), so a batch's padding never travels and a small batch's call
and reply ride inline instead of through the object store.
"""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ray

from system.learner.batch import LearnerBatch, pack_response, unpack_response


class CorrectionCall:
    """Starts ``service.process`` for a step on one background thread; ``start`` returns the wait."""

    def __init__(self, service: ray.actor.ActorHandle, get=ray.get) -> None:
        """``get``: how the reply is read (``ray.get``; a stand-in in the unit tests)."""
        self.service, self._get = service, get
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="aisrl-correction-call")

    def start(self, step: int, batch: LearnerBatch, holder: list, proximal_BT: np.ndarray,
              learner_version: int) -> Callable[[], tuple[np.ndarray, dict]]:
        """Start the call for ``batch`` (``holder``: ``[its reference]``, which the service reads); the
        returned function waits for ``(weights_BT, correction metrics)`` and raises what the call raised."""
        mask_BT = batch.response_view(batch.response_mask_BS).astype(bool)

        def call():
            ref = self.service.process.remote(step, holder, pack_response(proximal_BT, mask_BT), learner_version)
            return self._get(ref)

        future = self._thread.submit(call)

        def wait() -> tuple[np.ndarray, dict]:
            weights_N, metrics = future.result()
            return unpack_response(weights_N, mask_BT, "the correction service's weights"), metrics
        return wait

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
