"""Rollout worker actor: a thin shell over ``system.rollout.worker.RolloutWorkerCore`` (one vLLM engine)."""

import ray

from system.config import RunConfig
from system.rollout.worker import RolloutWorkerCore
from system.types import Prompt, RolloutGroup
from system.weight_broadcast import BroadcastReceiver, GroupAddress
from system.weight_payload import WeightPayload


class StaleWeightsError(RuntimeError):
    """A generate call reached a worker whose weights are older than the controller allows."""


@ray.remote
class RolloutWorker:
    def __init__(self, cfg: RunConfig, model_dir: str, worker_id: str) -> None:
        self.worker_id = worker_id
        self.core = RolloutWorkerCore(cfg, model_dir, worker_id)
        self.receiver = BroadcastReceiver()
        self.weight_sources = {"broadcast": 0, "object_store": 0}

    def ready(self) -> dict:
        return {"worker_id": self.worker_id, "policy_version": self.core.policy_version,
                "quantization": self.core.quantization_scheme, "fp8_kernel": self.core.fp8_kernel}

    def generate(self, prompts: list[Prompt], min_policy_version: int) -> list[RolloutGroup]:
        """G samples per prompt with the current weights; refuses weights older than allowed."""
        if self.core.policy_version < min_policy_version:
            raise StaleWeightsError(
                f"worker {self.worker_id} holds policy version {self.core.policy_version}, "
                f"the controller requires >= {min_policy_version}"
            )
        return self.core.generate_groups(prompts, self.core.policy_version)

    def update_weights(self, payload: WeightPayload) -> int:
        """Swap in new weights (runs between generate calls: actor calls execute one at a time)."""
        self.core.update_weights(payload)
        return self.core.policy_version

    def join_broadcast(self, address: GroupAddress, rank: int, timeout_s: float, delta: bool) -> None:
        """Become member ``rank`` of a weight-broadcast generation (received, and with ``delta``
        decoded, in the background)."""
        self.receiver.join(address, rank, timeout_s, delta)

    def update_weights_from(self, version: int, holder: list) -> str:
        """Load ``version``: the broadcast copy if it arrived, else the object store's (``holder`` is
        ``[reference]``, resolved only then). Returns where it came from."""
        payload = self.receiver.take(version)
        source = "broadcast" if payload is not None else "object_store"
        self.core.update_weights(payload if payload is not None else ray.get(holder[0]))
        self.weight_sources[source] += 1
        return source

    def stats(self) -> dict:
        """The engine's counters, and how many versions came by broadcast and from the object store."""
        return {**self.core.stats(), **{f"weights_via_{k}": n for k, n in self.weight_sources.items()}}
