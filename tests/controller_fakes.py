"""In-process stand-ins for rollout worker handles and the Ray calls (``actors.runtime``'s interface), so
the rollout loop and pool run with no Ray cluster: a worker handle runs each call the moment it is made
and returns a completed reference (``tests/test_controller_logic.py``, ``tests/test_fp8_kernel_pins.py``).
Published "weights" are the version number itself; a fake worker adopts it."""

import numpy as np

from system.rollout.weight_mailbox import with_weights_wait
from system.types import Completion, RolloutGroup, frozen_array


class WorkerDied(RuntimeError):
    pass


class CallFailed(RuntimeError):
    """A call that raised (Ray's ``RayTaskError`` in a job)."""


class Ref:
    """A call that already ran: its value, or the error reading it raises; or, made by a worker told to
    ``hold`` its calls, one that runs only when released (``ready`` False until then)."""

    def __init__(self, value=None, error: BaseException | None = None, run=None) -> None:
        self.value, self.error, self.run = value, error, run
        self.ready = run is None

    def release(self) -> None:
        try:
            self.value = self.run()
        except (WorkerDied, CallFailed) as exc:  # a held call that raises ends as a failed call
            self.error = exc
        self.ready = True

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


class Method:
    def __init__(self, fn, held: list | None = None) -> None:
        self.fn, self.held = fn, held

    def remote(self, *args):
        if self.held is not None and self.held[0]:  # held: runs (with the weights of that moment) on release
            ref = Ref(run=lambda: self.fn(*args))
            self.held.append(ref)
            return ref
        try:
            return Ref(self.fn(*args))
        except WorkerDied as exc:
            return Ref(error=exc)


class FakeWorker:
    """A rollout worker handle: ``ready``, ``generate`` and ``offer_weights``, each logged (an offer is
    loaded at once: every call here has returned before the next is made, so the worker is idle)."""

    def __init__(self, cfg, model_dir: str, worker_id: str, log: list, fp8_kernel: dict | None = None) -> None:
        self.cfg, self.worker_id, self.log = cfg, worker_id, log
        self.version, self.dead, self.killed = 0, False, False
        self.held: list = [False]  # [hold new generate calls?, the held calls in order...]
        self.min_versions: list[int] = []  # what each generate call required
        self.waited_s = 0.0  # the wait this worker reports with each call's groups
        self.ready = Method(lambda: {"worker_id": worker_id, "policy_version": 0, "quantization": "fake",
                                     "fp8_kernel": fp8_kernel})
        self.generate = Method(self._generate, self.held)
        self.offer_weights = Method(self._offer)

    def _offer(self, version: int, holder: list) -> None:
        assert holder == [version]  # published "weights" are the version number, passed unresolved
        self.log.append(("update", self.worker_id, version))
        self.version = version

    def _generate(self, prompts, min_version: int) -> list[RolloutGroup]:
        if self.dead:
            raise WorkerDied(f"{self.worker_id} died")
        self.log.append(("generate", self.worker_id, self.version, [p.prompt_id for p in prompts]))
        self.min_versions.append(min_version)
        return with_weights_wait([RolloutGroup(p, tuple(
            Completion(p.prompt_id, j, frozen_array([1], np.int32), frozen_array([2, 3], np.int32),
                       frozen_array([-0.5, -0.5], np.float32), "23", 0.0, self.version, "stop", self.worker_id)
            for j in range(self.cfg.rollout.group_size)), self.version, self.worker_id) for p in prompts],
            self.waited_s)


class FakeWorkerClass:
    """``actor_cls.options(...).remote(cfg, model_dir, worker_id, fp8_kernel_pins)`` -> a ``FakeWorker``."""

    def __init__(self, kernel_of=None) -> None:
        self.log: list = []
        self.handles: dict[str, FakeWorker] = {}
        self.pins: dict[str, dict] = {}  # the FP8 kernel pins each worker was started with
        self.kernel_of = kernel_of or (lambda worker_id, pins: None)  # the FP8 decision a worker reports
        self.options_seen: list[dict] = []  # the actor options of each launch

    def options(self, **kwargs) -> "FakeWorkerClass":
        self.options_seen.append(kwargs)
        return self

    def remote(self, cfg, model_dir: str, worker_id: str, fp8_kernel_pins: dict | None = None) -> FakeWorker:
        self.pins[worker_id] = fp8_kernel_pins
        self.handles[worker_id] = FakeWorker(cfg, model_dir, worker_id, self.log,
                                             self.kernel_of(worker_id, fp8_kernel_pins or {}))
        return self.handles[worker_id]


class InProcessRuntime:
    """``actors.runtime.RayRuntime``'s interface over completed references."""

    actor_died = WorkerDied
    task_failed = CallFailed

    def finished(self, refs, wait: bool) -> list:
        if wait:  # waiting as long as it takes: held calls run now, in order
            for r in refs:
                if not r.ready:
                    r.release()
        return [r for r in refs if r.ready]

    def wait(self, refs, timeout):
        ready = [r for r in refs if r.ready][:1]
        return ready, [r for r in refs if r not in ready]

    def poll(self, ref) -> bool:
        return ref.ready

    def get(self, ref_or_refs, timeout=None):
        if isinstance(ref_or_refs, list):
            return [r.result() for r in ref_or_refs]
        return ref_or_refs.result()

    def cluster_resources(self) -> dict:
        return {}

    def kill(self, handle) -> None:
        handle.killed = True

