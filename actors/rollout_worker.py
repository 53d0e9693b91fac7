"""Rollout worker actor: a thin shell over ``system.rollout.worker.RolloutWorkerCore`` (one vLLM engine).

Two kinds of call reach it. ``generate`` runs in the actor's default group, one call at a time in
the order sent (the controller queues the next call behind the running one). Weights are
*offered* (``offer_weights``, in the ``weights`` group, so the offer does not wait behind
generation): each generate call adopts the newest version offered by the time it starts
(``system.rollout.weight_mailbox``), and an idle worker loads an offer at once. An offer's weights
exist once they reach the object store, or earlier, once they arrive by broadcast (a worker in a
``weight_sync`` generation: rank 0 broadcasts a version before its object-store copy is written).
"""

from dataclasses import dataclass

import ray

from actors.runtime import weights_exist
from system.config import RunConfig
from system.rollout.weight_mailbox import WeightMailbox, with_weights_wait
from system.rollout.worker import RolloutWorkerCore
from system.types import Prompt, RolloutGroup
from system.weight_broadcast import GroupAddress
from system.weight_generations import BroadcastReceiver

OFFER_WAIT_S = 60.0
"""How long a generate call waits for the version it requires: the controller offers a version before it
sends a call that requires it, so this only bounds an offer that never arrives."""


@dataclass(frozen=True, eq=False)
class Offer:
    """An offered version and where the object store will hold it (``[reference]``, resolved only if it
    is loaded from there)."""

    version: int
    holder: list


class StaleWeightsError(RuntimeError):
    """A generate call reached a worker whose weights are older than the controller allows."""


class RolloutWorkerShell:
    """The rollout worker's methods (the actor is :data:`RolloutWorker`). ``core_cls`` holds the engine:
    ``RolloutWorkerCore`` (vLLM); a test's simulated core (``tests/sim_actors.SimulatedCore``) stands in
    for it where the claim is the shell's, the pool's or the weight path's, not the engine's."""

    core_cls = RolloutWorkerCore

    def __init__(self, cfg: RunConfig, model_dir: str, worker_id: str, fp8_kernel_pins: dict | None = None) -> None:
        self.worker_id = worker_id
        self.core = self.core_cls(cfg, model_dir, worker_id, fp8_kernel_pins)
        self.receiver = BroadcastReceiver()
        self.mailbox: WeightMailbox[Offer] = WeightMailbox(self.core.policy_version, self._exists)
        self.weight_sources = {"broadcast": 0, "object_store": 0}

    def ready(self) -> dict:
        return {"worker_id": self.worker_id, "policy_version": self.core.policy_version,
                "quantization": self.core.quantization_scheme, "fp8_kernel": self.core.fp8_kernel}

    def generate(self, prompts: list[Prompt], min_policy_version: int) -> list[RolloutGroup]:
        """G samples per prompt with the newest offered weights that exist; waits up to ``OFFER_WAIT_S``
        for version ``min_policy_version`` to be offered (then for it to exist), and refuses to sample
        with older weights."""
        with self.mailbox.engine:
            held = self.mailbox.adopt(self._load, min_policy_version, OFFER_WAIT_S)
            if held < min_policy_version:
                raise StaleWeightsError(f"worker {self.worker_id} holds policy version {held}, the controller "
                                        f"requires >= {min_policy_version} (not offered within {OFFER_WAIT_S:.0f} s)")
            return with_weights_wait(self.core.generate_groups(prompts, held), self.mailbox.waited_s)

    @ray.method(concurrency_group="weights")
    def offer_weights(self, version: int, holder: list) -> None:
        """Offer ``version`` (``holder`` is ``[object-store reference]``, resolved only if it is loaded
        from there; offered while the step producing it may still run); an idle worker loads it as soon
        as it exists."""
        if self.mailbox.offer(version, Offer(version, holder)):
            self.mailbox.adopt_if_idle(self._load)  # an idle worker: now, or once its weights exist

    def _exists(self, offer: Offer, timeout_s: float | None) -> bool:
        """Whether ``offer``'s weights arrived by broadcast or exist in the object store (waiting up to
        ``timeout_s``; None: as long as it takes)."""
        return self.receiver.exists(offer.version, lambda t: weights_exist(offer.holder, t), timeout_s)

    def _load(self, version: int, offer: Offer) -> None:
        """The broadcast copy of ``version`` if it arrived, else the object store's."""
        payload = self.receiver.take(version)
        source = "broadcast" if payload is not None else "object_store"
        self.core.update_weights(payload if payload is not None else ray.get(offer.holder[0]))
        self.weight_sources[source] += 1

    @ray.method(concurrency_group="weights")
    def join_broadcast(self, address: GroupAddress, rank: int, timeout_s: float, delta: bool) -> None:
        """Become member ``rank`` of a weight-broadcast generation (received, and with ``delta``
        decoded, in the background)."""
        self.receiver.join(address, rank, timeout_s, delta)

    def stats(self) -> dict:
        """The engine's counters, and how many versions came by broadcast and from the object store."""
        return {**self.core.stats(), **{f"weights_via_{k}": n for k, n in self.weight_sources.items()}}


@ray.remote(concurrency_groups={"weights": 1})
class RolloutWorker(RolloutWorkerShell):
    """The rollout worker actor (its processes titled ``ray::RolloutWorker``)."""
