"""The Ray calls of the rollout loop, its pool and the step records, in one object.

``RolloutLoop``, ``RolloutPool`` and ``RecordsInFlight`` reach Ray only through a runtime: ``RAY`` in
a job, an in-process stand-in in ``tests/test_controller_logic.py`` and ``tests/test_step_records.py``,
which runs the controller's logic
(admission, weight pushes, dispatch, collection, worker loss and replacement, scaling) with no
Ray cluster. Calls on actor handles (``handle.generate.remote(...)``) are made directly: the
stand-in's handles have the same shape.
"""

import ray


class RayRuntime:
    actor_died: type[BaseException] = ray.exceptions.RayActorError
    """What a call on a dead worker raises when its result is read."""
    task_failed: type[BaseException] = ray.exceptions.RayTaskError
    """What reading the result of a call that raised raises (the call's error as its cause)."""

    @staticmethod
    def wait(refs: list, timeout: float) -> tuple[list, list]:
        """(the first ready reference, or none within ``timeout`` seconds; the rest)."""
        return ray.wait(refs, num_returns=1, timeout=timeout)

    @staticmethod
    def finished(refs: list, wait: bool) -> list:
        """The references of ``refs`` whose calls have ended (``wait``: all of them, waiting as long as it takes)."""
        return ray.wait(refs, num_returns=len(refs), timeout=None if wait else 0)[0] if refs else []

    @staticmethod
    def poll(ref) -> bool:
        """Whether ``ref`` is ready (never blocks)."""
        return bool(ray.wait([ref], timeout=0)[0])

    @staticmethod
    def get(ref_or_refs, timeout: float | None = None):
        """The results (``timeout`` 0: of calls known to have ended, never waiting)."""
        return ray.get(ref_or_refs, timeout=timeout)

    @staticmethod
    def cluster_resources() -> dict:
        return ray.cluster_resources()

    @staticmethod
    def kill(handle) -> None:
        ray.kill(handle, no_restart=True)


RAY = RayRuntime()


def weights_exist(holder: list, timeout_s: float | None) -> bool:
    """A rollout worker's ``WeightMailbox`` readiness: whether an offered version's object
    (``holder = [reference]``) exists, waiting up to ``timeout_s`` (None: until it does; the object
    of a failed step counts as existing, and loading it raises)."""
    return bool(ray.wait(holder, timeout=timeout_s, fetch_local=False)[0])
