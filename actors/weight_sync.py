"""Weight transport from the learner ranks to the rollout workers, behind one interface.

``ObjectStoreTransport`` (CPU, and the portable default): each version's full bf16 weights are
the result of learner rank 0's ``weights(version)`` call (numpy arrays, bf16 as an int16 view,
``lm_head.weight`` included), which the driver submits with the step, so they land in Ray's
object store (``publish`` puts them there itself only on a resume); every worker receives the same object reference and reads it zero-copy on its
node. The driver never copies the weights.

``CollectiveTransport`` (``weight_sync.type=collective``): rank 0 also broadcasts each version,
right after its export, to the ready workers over a process group of their own
(``system.weight_broadcast``; the data through a shared-memory segment when every worker is on
rank 0's host and sees its ``/dev/shm``, else over gloo); a worker loads the copy it received and
falls back to the object store for a version it missed. The group (a *generation*) is re-formed, without
blocking anyone, whenever the set of ready workers changes or a broadcast failed; when none is left it is
closed. A worker that retires is removed only once no generation rank 0 hosts (or is opening) holds it
(``releases``): removed earlier, it would fail the next broadcast of the workers that stay.
``weight_sync.type=delta`` is the same transport carrying lossy deltas (``system.weight_delta``).
"""

import logging
from typing import Protocol

import ray

from actors.learner_worker import LearnerGroup
from actors.rollout_pool import RolloutPool
from actors.runtime import RAY, RayRuntime
from system.config import RunConfig

log = logging.getLogger(__name__)


class WeightTransport(Protocol):
    def publish(self, learners: LearnerGroup, policy_version: int) -> object:
        """Export the learners' current weights; returns a handle workers can load from."""
        ...

    def push(self, worker: ray.actor.ActorHandle, handle: object, policy_version: int) -> ray.ObjectRef:
        """Offer the version to ``worker`` (its next generate call loads it, or it loads it now if idle;
        ``actors.rollout_worker``); returns the call's ref."""
        ...

    def maintain(self, pool: RolloutPool) -> None:
        """Called on every turn of the rollout loop (never blocks)."""
        ...

    def releases(self, worker_id: str) -> bool:
        """Whether a retiring worker may be removed now: the weight path no longer counts on it."""
        ...

    def step_done(self, weight_sync_metrics: dict) -> None:
        """What the step reported about its weight sync (called by the train loop)."""
        ...


class ObjectStoreTransport:
    name = "object_store"

    def publish(self, learners: LearnerGroup, policy_version: int) -> ray.ObjectRef:
        return learners.export_weights()

    def push(self, worker: ray.actor.ActorHandle, handle: ray.ObjectRef, policy_version: int) -> ray.ObjectRef:
        # in a list, so the reference travels unresolved: the worker reads it only if it loads this version
        # from the object store (with a collective transport it may have the broadcast copy)
        return worker.offer_weights.remote(policy_version, [handle])

    def maintain(self, pool: RolloutPool) -> None:
        pass

    def releases(self, worker_id: str) -> bool:
        return True

    def step_done(self, weight_sync_metrics: dict) -> None:
        pass


class CollectiveTransport(ObjectStoreTransport):
    name = "collective"

    def __init__(self, cfg: RunConfig, learners: LearnerGroup, runtime: RayRuntime = RAY) -> None:
        """``runtime``: the Ray calls (``actors.runtime``: ``maintain`` runs in the rollout loop)."""
        self.runtime = runtime
        self.timeout_s = cfg.weight_sync.timeout_s
        self.delta = cfg.weight_sync.type == "delta"
        self.rank0 = learners.ranks[0]
        self.generation = 0
        self.members: tuple[str, ...] = ()
        self._opening: tuple[ray.ObjectRef, list] | None = None
        self.failed_generation = -1
        """The newest generation a step reported failed (written by the train loop, read by the rollout
        loop): a number, not a flag, so a failure read while the rollout loop opens the next generation
        cannot tear that one down as it forms."""

    @property
    def reform(self) -> bool:
        """Whether the current generation failed (a new one is formed)."""
        return self.failed_generation >= self.generation > 0

    def maintain(self, pool: RolloutPool) -> None:
        if self._opening is not None:
            ref, members = self._opening
            if not self.runtime.poll(ref):
                return
            self._opening = None
            address = self.runtime.get(ref)  # None: the generation was closed, none replaces it
            for rank, slot in enumerate(members, start=1):
                slot.handle.join_broadcast.remote(address, rank, self.timeout_s, self.delta)
            self.members = tuple(s.worker_id for s in members)
            return
        # not the retiring: a generation including one would break as soon as it is removed (which
        # waits, ``releases``, until rank 0 has left the generation holding it)
        ready = sorted((s for s in pool.ready() if not s.retiring), key=lambda s: s.worker_id)
        if ready and (tuple(s.worker_id for s in ready) != self.members or self.reform):
            self.generation += 1
            self._opening = (self.rank0.open_broadcast.remote(self.generation, len(ready) + 1), ready)
        elif not ready and self.members:  # every worker left (scaled to 0): close, open none
            self._opening = (self.rank0.close_broadcast.remote(), [])

    def releases(self, worker_id: str) -> bool:
        """Not while the current generation holds the worker, or the one being opened (or closed) does
        not replace it yet: removed now, it would fail the next broadcast of the workers that stay."""
        opening = self._opening[1] if self._opening is not None else []
        return worker_id not in self.members and all(s.worker_id != worker_id for s in opening)

    def step_done(self, weight_sync_metrics: dict) -> None:
        # only a failure of the newest generation: a step that ran before it was opened may report the
        # failure of the one it replaces, which would otherwise tear the new one down as it forms
        if weight_sync_metrics.get("broadcast_failed"):
            failed = weight_sync_metrics.get("broadcast_generation", self.generation)
            if failed > self.failed_generation:  # once per generation: the console, not only the metric
                log.warning("weight broadcast generation %d failed (a receiver left, or did not join or answer "
                            "within weight_sync.timeout_s); its workers load the object store's copy while a "
                            "new generation forms", failed)
            self.failed_generation = max(self.failed_generation, failed)


def build_transport(cfg: RunConfig, learners: LearnerGroup) -> ObjectStoreTransport:
    if cfg.weight_sync.type in ("collective", "delta"):
        return CollectiveTransport(cfg, learners)
    return ObjectStoreTransport()
