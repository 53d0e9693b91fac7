"""Weight transport from the learner ranks to the rollout workers, behind one interface.

``ObjectStoreTransport`` (CPU, and the portable default): rank 0 exports the full bf16
weights as numpy arrays (bf16 as an int16 view, ``lm_head.weight`` included) into Ray's
object store; every worker receives the same object reference and reads it zero-copy on its
node. The driver never copies the weights. A GPU transport (NCCL broadcast or CUDA IPC into
vLLM's weight-transfer engine) would implement the same two methods.
"""

from typing import Protocol

import ray

from actors.learner_worker import LearnerGroup


class WeightTransport(Protocol):
    def publish(self, learners: LearnerGroup, policy_version: int) -> object:
        """Export the learners' current weights; returns a handle workers can load from."""
        ...

    def push(self, worker: ray.actor.ActorHandle, handle: object) -> ray.ObjectRef:
        """Queue the load on ``worker`` (it runs between generate calls); returns the call's ref."""
        ...


class ObjectStoreTransport:
    name = "object_store"

    def publish(self, learners: LearnerGroup, policy_version: int) -> ray.ObjectRef:
        return learners.export_weights()

    def push(self, worker: ray.actor.ActorHandle, handle: ray.ObjectRef) -> ray.ObjectRef:
        return worker.update_weights.remote(handle)
