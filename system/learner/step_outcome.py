"""What learner rank 0 returns for a step (``system.learner.group_step.run_step``): a plain record, in a
module of its own so that a process that only reads it (the simulated ranks of the tests and
benchmarks) does not import the update's torch modules."""

from dataclasses import dataclass, field

from system.weight_payload import WeightPayload


@dataclass(frozen=True)
class StepOutcome:
    """What rank 0 returns for a step: every metric, the timings and the new weights."""

    learner: dict[str, float]
    correction: dict[str, float | int | None]
    seconds: dict[str, float]
    """``proximal``, ``correction`` (gather + starting the service call + the wait for it after the
    update's first forward + broadcast), ``update`` (without that wait), ``export``."""
    payload: WeightPayload | None
    """The new policy version's full weights (rank 0); None on the other ranks."""
    weight_sync: dict = field(default_factory=dict)
    """``weight_sync/...`` metrics of the step (the Ray shell's: payload size, broadcast bytes and seconds)."""
    weights: object = None
    """Where the rollout workers load ``payload`` from, once the caller has published it (the Ray
    shell returns the payload from rank 0's separate ``weights`` call and the driver sets this to
    its reference, ``payload`` None)."""
