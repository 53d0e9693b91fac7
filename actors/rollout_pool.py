"""The rollout workers of a job: start, replace and resize them; track each one's weights and in-flight call.

Worker calls are all made from the controller's rollout loop, so a weight push queued on a
worker always runs before the generate call submitted after it (Ray keeps per-caller order).
"""

from dataclasses import dataclass, field

import ray

from actors.placement import RoleOptions
from actors.rollout_worker import RolloutWorker
from system.config import RunConfig
from system.types import Prompt


@dataclass
class WorkerSlot:
    worker_id: str
    handle: ray.actor.ActorHandle
    policy_version: int = 0
    inflight: ray.ObjectRef | None = None
    inflight_prompts: list[Prompt] = field(default_factory=list)
    retiring: bool = False


class RolloutPool:
    def __init__(self, cfg: RunConfig, model_dir: str, options: RoleOptions, actor_cls=RolloutWorker) -> None:
        """``actor_cls``: the Ray actor class of a worker (a simulated engine in orchestration benchmarks)."""
        self.cfg = cfg
        self.actor_cls = actor_cls
        self.model_dir = model_dir
        self.options = options
        self.slots: dict[str, WorkerSlot] = {}
        self._next_id = 0

    def start(self, count: int) -> list[WorkerSlot]:
        """Start ``count`` workers (holding the initial weights, version 0) and wait until they are up."""
        new = []
        for _ in range(count):
            wid = f"rollout-{self._next_id}"
            self._next_id += 1
            handle = self.actor_cls.options(**self.options.actor_options()).remote(
                self.cfg, self.model_dir, wid)
            new.append(WorkerSlot(wid, handle))
        infos = ray.get([s.handle.ready.remote() for s in new])
        for slot, info in zip(new, infos, strict=True):
            slot.policy_version = info["policy_version"]
            slot.quantization = info["quantization"]
            self.slots[slot.worker_id] = slot
        return new

    def idle(self) -> list[WorkerSlot]:
        return [s for s in self.slots.values() if s.inflight is None and not s.retiring]

    def busy(self) -> list[WorkerSlot]:
        return [s for s in self.slots.values() if s.inflight is not None]

    def by_ref(self, ref: ray.ObjectRef) -> WorkerSlot:
        return next(s for s in self.slots.values() if s.inflight == ref)

    def remove(self, slot: WorkerSlot) -> None:
        self.slots.pop(slot.worker_id, None)
        ray.kill(slot.handle, no_restart=True)

    def shutdown(self) -> None:
        for slot in list(self.slots.values()):
            self.remove(slot)
