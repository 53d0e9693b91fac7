"""Where each role runs: rollout workers on nodes offering the rollout resource, learner ranks on learner nodes.

With neither resource in the cluster, every role shares whatever node has room (one machine).
The plan is plain data so ``--dry-run`` can print it before anything is allocated.
"""

from dataclasses import asdict, dataclass

from system.config import RunConfig


@dataclass(frozen=True)
class RoleOptions:
    """Ray actor options for one role."""

    role: str
    count: int
    num_cpus: float
    num_gpus: float
    resources: dict[str, float]

    def actor_options(self) -> dict:
        opts = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            opts["resources"] = dict(self.resources)
        return opts


def plan_placement(cfg: RunConfig, cluster_resources: dict[str, float] | None) -> list[RoleOptions]:
    """The actor options of every role; ``cluster_resources`` None = a private local cluster."""
    res = cluster_resources or {}
    rollout_res = {cfg.ray.rollout_resource: 1.0} if res.get(cfg.ray.rollout_resource) else {}
    learner_res = {cfg.ray.learner_resource: 1.0} if res.get(cfg.ray.learner_resource) else {}
    return [
        RoleOptions("rollout_worker", cfg.rollout.num_workers, 1.0, cfg.ray.rollout_gpus, rollout_res),
        RoleOptions("learner_rank", cfg.learner.num_ranks, 1.0, cfg.ray.learner_gpus, learner_res),
        RoleOptions("correction_service", 1, 0.0, 0.0, {}),
    ]


def describe_plan(plan: list[RoleOptions]) -> list[dict]:
    return [asdict(r) for r in plan]


def required_cpus(plan: list[RoleOptions]) -> int:
    return int(sum(r.count * max(r.num_cpus, 0.0) for r in plan)) + 1
