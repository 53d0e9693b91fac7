"""The rollout workers of a job: launch, replace, resize; track each one's weights and in-flight call.

Worker calls are all made from the controller's rollout loop. A worker holds up to
``rollout.calls_per_worker`` generate calls (the running one and the ones queued behind it; Ray
runs them in the order sent, and queues calls on an actor that is still starting); weights are
offered beside them (``actors.rollout_worker``). A worker is *starting* until its ``ready`` call
returns; a *retiring* worker gets no new prompts and leaves once idle.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray

from actors.cluster import actor_env
from actors.placement import RoleOptions
from actors.rollout_worker import RolloutWorker
from actors.runtime import RAY, RayRuntime
from system.config import RunConfig
from system.types import Prompt

log = logging.getLogger(__name__)



@dataclass
class GenerateCall:
    ref: ray.ObjectRef
    prompts: list[Prompt]


@dataclass
class WorkerSlot:
    worker_id: str
    handle: ray.actor.ActorHandle
    starting: ray.ObjectRef | None
    launched_at: float
    policy_version: int = 0
    """The newest version offered to the worker (its next call adopts it)."""
    quantization: str = ""
    fp8_kernel: dict | None = None
    calls: list[GenerateCall] = field(default_factory=list)
    """Generate calls sent and not yet returned, oldest (running) first."""
    retiring: bool = False
    idle_since: float | None = None
    """When the worker last became idle (ready, or its last call returned); None while it generates."""

    def inflight_prompts(self) -> list[Prompt]:
        return [p for call in self.calls for p in call.prompts]


class RolloutPool:
    def __init__(self, cfg: RunConfig, model_dir: str, options: RoleOptions, actor_cls=RolloutWorker,
                 runtime: RayRuntime = RAY, fp8_kernel_pins: dict[str, str] | None = None,
                 tmp_dir: str | None = None) -> None:
        """``actor_cls``: the Ray actor class of a worker (a simulated engine in orchestration benchmarks);
        ``runtime``: the Ray calls (``actors.runtime``; an in-process stand-in in controller tests);
        ``fp8_kernel_pins``: the FP8 kernel a resumed run chose before on each kind of CPU; ``tmp_dir``:
        the workers' ``TMPDIR`` (the run's, on the driver's node, removed after the run: each vLLM engine
        leaves a ``vllm_dist_*`` rendezvous file there, which a killed worker never removes; a probe found
        187 in /tmp. A worker on another node, where it is missing, uses its own /tmp)."""
        self.tmp_dir = tmp_dir
        self.cfg = cfg
        self.runtime = runtime
        self.actor_cls = actor_cls
        self.model_dir = model_dir
        self.options = options
        self.slots: dict[str, WorkerSlot] = {}
        self._next_id = 0
        self.failures = 0
        self.replacement_seconds: list[float] = []
        self.started: dict[str, tuple[str, dict | None]] = {}
        """``worker id -> (quantization scheme, FP8 kernel decision)`` of every worker that became ready
        during the run (replacements and scaled-up ones included)."""
        self.fp8_kernel_pins: dict[str, str] = dict(fp8_kernel_pins or {})
        """``cpu_identity -> kernel``: the first choice on each kind of CPU in this run (a resumed one's
        earlier attempts included, forced choices too); every worker launched after it gets it, so
        ``auto`` keeps it. (Workers launched together on a kind of CPU the run has not seen yet, e.g. a
        scale-up onto a new node type, each choose for themselves; the first to be up sets the pin.)"""
        self.on_ready: Callable[[], None] | None = None
        """Called after each worker becomes ready (the trainer rewrites ``rollout_workers.json``)."""

    def launch(self, count: int) -> list[WorkerSlot]:
        """Create ``count`` workers without waiting; each is *starting* until its ``ready`` returns."""
        new = []
        env = actor_env(**({"TMPDIR": self.tmp_dir} if self.tmp_dir else {}))
        for _ in range(count):
            wid = f"rollout-{self._next_id}"
            self._next_id += 1
            handle = self.actor_cls.options(**self.options.actor_options(), runtime_env=env).remote(
                self.cfg, self.model_dir, wid, dict(self.fp8_kernel_pins))
            slot = WorkerSlot(wid, handle, handle.ready.remote(), time.monotonic())
            self.slots[wid] = slot
            new.append(slot)
        return new

    def launch_first(self, count: int) -> list[WorkerSlot]:
        """Launch the first of the run's ``count`` workers without waiting (they start while the learner
        ranks do); :meth:`start` waits for them and launches the rest.

        A new run of FP8 CPU workers choosing their kernel (``rollout.fp8_kernel=auto``) launches one
        worker first and the rest once it is up, with its choice pinned: workers probing at once could land
        on either side of the kernel threshold and run the same CPU with different kernels."""
        r = self.cfg.rollout
        first = 1 if (count > 1 and r.quantization == "fp8" and r.fp8_kernel == "auto"
                      and not self.options.num_gpus and not self.fp8_kernel_pins) else count
        return self.launch(first)

    def start(self, count: int, launched: list[WorkerSlot] | None = None) -> list[WorkerSlot]:
        """Have ``count`` workers up (the run's first): ``launched`` (from :meth:`launch_first`, else
        launched here), waited for, then the rest launched and waited for."""
        first = self.launch_first(count) if launched is None else launched
        self._wait_ready(first)
        rest = self.launch(count - len(first))
        self._wait_ready(rest)
        return first + rest

    def _wait_ready(self, slots: list[WorkerSlot]) -> None:
        for slot, info in zip(slots, self.runtime.get([s.starting for s in slots]), strict=True):
            self.mark_ready(slot, info)

    def mark_ready(self, slot: WorkerSlot, info: dict) -> None:
        slot.starting = None
        slot.quantization = info["quantization"]
        slot.fp8_kernel = info.get("fp8_kernel")
        if slot.fp8_kernel and slot.fp8_kernel.get("warning"):
            log.warning("rollout worker %s: %s", slot.worker_id, slot.fp8_kernel["warning"])
        if slot.fp8_kernel and slot.fp8_kernel.get("cpu"):
            self.fp8_kernel_pins.setdefault(slot.fp8_kernel["cpu"], slot.fp8_kernel["kernel"])
        slot.policy_version = max(slot.policy_version, info["policy_version"])
        slot.idle_since = time.monotonic()
        self.started[slot.worker_id] = (slot.quantization, slot.fp8_kernel)
        if self.on_ready is not None:
            self.on_ready()

    def workers_record(self) -> dict:
        """What ``rollout_workers.json`` holds: the requested quantization, and the scheme and FP8 kernel
        decision of every worker that became ready so far (a mixed cluster's nodes may choose differently)."""
        started = dict(self.started)
        return {"requested": self.cfg.rollout.quantization, "running": {w: q for w, (q, _) in started.items()},
                "fp8_kernel": {w: k for w, (_, k) in started.items() if k is not None},
                "fp8_kernel_pins": dict(self.fp8_kernel_pins)}

    def summary(self) -> str:
        """The console's line on the workers up so far: the schemes that ran and each FP8 kernel."""
        record = self.workers_record()
        return f"requested {record['requested']}, running {record['running']}" + "".join(
            f" ({w}: FP8 kernel {k['kernel']}" + (", kept from this run" if k.get("pinned") else "")
            + (f", {k['fp8_vs_bf16']:.2g}x BF16 matmul speed)" if k.get("fp8_vs_bf16") else ")")
            for w, k in record["fp8_kernel"].items())

    def slots_now(self) -> list[WorkerSlot]:
        """A snapshot of the slots: the train thread reads them while the rollout loop changes them."""
        return list(self.slots.copy().values())

    def live(self) -> list[WorkerSlot]:
        return [s for s in self.slots_now() if not s.retiring]

    def ready(self) -> list[WorkerSlot]:
        return [s for s in self.slots_now() if s.starting is None]

    def with_room(self) -> list[WorkerSlot]:
        """Ready, not retiring workers holding fewer than ``rollout.calls_per_worker`` calls."""
        depth = self.cfg.rollout.calls_per_worker
        return [s for s in self.slots_now() if s.starting is None and not s.retiring and len(s.calls) < depth]

    def busy(self) -> list[WorkerSlot]:
        return [s for s in self.slots_now() if s.calls]

    def pending_refs(self) -> list[ray.ObjectRef]:
        refs = []
        for s in self.slots_now():
            if s.starting is not None:
                refs.append(s.starting)
            refs.extend(call.ref for call in s.calls)
        return refs

    def by_ref(self, ref: ray.ObjectRef) -> WorkerSlot:
        return next(s for s in self.slots_now() if ref == s.starting or any(c.ref == ref for c in s.calls))

    def retire(self, count: int, starting_only: bool = False) -> None:
        """Mark ``count`` workers retiring, idle and starting ones first (only starting ones if asked)."""
        order = sorted(self.live(), key=lambda s: (bool(s.calls), s.starting is None))
        if starting_only:
            order = [s for s in order if s.starting is not None]
        for slot in order[:count]:
            slot.retiring = True

    def remove(self, slot: WorkerSlot) -> None:
        self.slots.pop(slot.worker_id, None)
        self.runtime.kill(slot.handle)

    def shutdown(self) -> None:
        for slot in self.slots_now():
            self.remove(slot)
