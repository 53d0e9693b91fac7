"""Where each role runs: rollout workers on nodes offering the rollout resource, learner ranks on learner nodes.

With neither resource in the cluster, every role shares whatever node has room (one machine),
except that ``rollout.follow_cluster`` always pins rollout workers to the rollout resource on a
cluster joined with ``ray.address`` (they wait for, and the Ray autoscaler provisions, nodes that offer it).
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
    following = cfg.rollout.follow_cluster and cfg.ray.address is not None  # a private cluster has no such nodes
    pin_rollout = res.get(cfg.ray.rollout_resource) or (cluster_resources is not None and following)
    rollout_res = {cfg.ray.rollout_resource: 1.0} if pin_rollout else {}
    learner_res = {cfg.ray.learner_resource: 1.0} if res.get(cfg.ray.learner_resource) else {}
    return [
        RoleOptions("rollout_worker", cfg.rollout.num_workers, 1.0, cfg.ray.rollout_gpus, rollout_res),
        RoleOptions("learner_rank", cfg.learner.num_ranks, 1.0, cfg.ray.learner_gpus, learner_res),
        RoleOptions("correction_service", 1, 0.0, 0.0, {}),
    ]


def actor_needs(role: RoleOptions) -> dict[str, float]:
    """What one actor of ``role`` reserves, by Ray resource name (zero amounts left out)."""
    needs = {"CPU": role.num_cpus, "GPU": role.num_gpus, **role.resources}
    return {k: float(v) for k, v in needs.items() if v > 0}


def placement_hint(role: RoleOptions, cluster: dict[str, float], remedy: str) -> str:
    """What ``role``'s actors reserve (:func:`actor_needs`) against what ``cluster`` (``ray.cluster_resources()``)
    has in all, and ``remedy`` when that is too little: the likely cause of a start that does not come."""
    needs = actor_needs(role)
    parts = [f"{role.count} x {amount:g} {key} (the cluster has {cluster.get(key, 0.0):g} in all)"
             for key, amount in needs.items()]
    short = any(role.count * amount > cluster.get(key, 0.0) + 1e-9 for key, amount in needs.items())
    advice = (f"too little: {remedy}" if short else
              "enough in all, unless other actors hold it; or a rank is slow to start (a model download)")
    return f"the ranks reserve {', '.join(parts) or 'nothing'}: {advice}"


def room_for(needs: dict[str, float], available: dict[str, float]) -> int | None:
    """How many more actors that each reserve ``needs`` fit in ``available`` now:
    ``min over k of floor(available[k] / needs[k])``; None when they reserve nothing (no limit)."""
    fits = [int(available.get(k, 0.0) / v + 1e-9) for k, v in needs.items() if v > 0]
    return min(fits) if fits else None


def scale_up_note(more: int, needs: dict[str, float], available: dict[str, float], private: bool) -> str | None:
    """What ``aisrl scale`` says when ``more`` new rollout workers do not all fit in the cluster now
    (None when they do): the room, what each worker takes, and whether the cluster can grow."""
    room = room_for(needs, available)
    if room is None or room >= more:
        return None
    free = ", ".join(f"{k} {available.get(k, 0.0):g}" for k in needs)
    each = ", ".join(f"{k} {v:g}" for k, v in needs.items())
    later = ("this run's private cluster never grows (its CPUs were set at start from rollout.num_workers, "
             "or ray.num_cpus): start the run with the count it needs, or on a Ray cluster" if private else
             "until the cluster offers them (nodes that join, or the autoscaler's)")
    return (f"the cluster has room for {room} more now (free: {free}; each worker takes {each}); "
            f"the other {more - room} wait: {later}")


def describe_plan(plan: list[RoleOptions]) -> list[dict]:
    return [asdict(r) for r in plan]


def required_cpus(plan: list[RoleOptions]) -> int:
    return int(sum(r.count * max(r.num_cpus, 0.0) for r in plan)) + 1


def rollout_capacity(cluster_resources: dict[str, float], cfg: RunConfig) -> int:
    """Rollout workers the cluster's rollout resource holds (one unit each); 0 if no node offers it."""
    return int(cluster_resources.get(cfg.ray.rollout_resource, 0.0) + 1e-9)


def follow_target(floor: int, capacity: int, max_workers: int | None) -> int:
    """Workers to run when following the cluster: ``max(floor, capacity)``, capped by ``max_workers``
    (never below ``floor``: the user's or ``aisrl scale``'s count wins over the cap)."""
    target = max(floor, capacity)
    if max_workers is not None:
        target = max(floor, min(target, max_workers))
    return target


def dry_run_plan(cfg: RunConfig) -> list[dict]:
    """The plan ``--dry-run`` prints. On a private local cluster it is the one that runs, and the
    shortfall the run would refuse once its cluster is up (``ValueError``) is refused here, with this
    machine's GPUs; on a cluster joined at run time its resources decide: each role says what it asks
    for there."""
    if cfg.ray.address is None:
        roles = plan_placement(cfg, None)
        local = {"CPU": cfg.ray.num_cpus or required_cpus(roles), "GPU": local_gpus(cfg)}
        check_placeable(cfg, local)
        return describe_plan(roles)
    offered = {cfg.ray.rollout_resource: 1.0, cfg.ray.learner_resource: 1.0}
    return [{**role, "resources": None, "resources_if_the_cluster_offers_them": role["resources"]}
            for role in describe_plan(plan_placement(cfg, offered))]


def local_gpus(cfg: RunConfig) -> int:
    """GPUs a private cluster started here would see (torch's count, which honours
    ``CUDA_VISIBLE_DEVICES``); 0 without asking torch when the config reserves none."""
    if not (cfg.ray.learner_gpus or cfg.ray.rollout_gpus):
        return 0
    import torch

    return torch.cuda.device_count()


def private_cluster_shortfall(cfg: RunConfig, cluster_resources: dict[str, float]) -> list[str]:
    """On a private local cluster (no ``ray.address``), what the learner ranks and rollout workers
    reserve beyond what the cluster has: nothing would ever place them, so the run would wait for ever
    (a joined cluster may still grow: not checked there). Empty when everything fits."""
    if cfg.ray.address is not None:
        return []
    r = cfg.rollout
    need = {"CPU": cfg.learner.num_ranks + r.num_workers,
            "GPU": cfg.learner.num_ranks * cfg.ray.learner_gpus + r.num_workers * cfg.ray.rollout_gpus}
    keys = {"CPU": "ray.num_cpus", "GPU": "ray.learner_gpus / ray.rollout_gpus"}
    return [f"the {cfg.learner.num_ranks} learner rank(s) and {r.num_workers} rollout worker(s) reserve {need[k]:g} "
            f"{k} but this machine's private cluster has {cluster_resources.get(k, 0.0):g} (set by {keys[k]})"
            for k in need if need[k] > cluster_resources.get(k, 0.0) + 1e-9]


def check_placeable(cfg: RunConfig, cluster_resources: dict[str, float]) -> None:
    """Raise ``ValueError`` listing :func:`private_cluster_shortfall` when it is not empty."""
    short = private_cluster_shortfall(cfg, cluster_resources)
    if short:
        raise ValueError("the roles cannot all be placed, so the run would wait for ever: " + "; ".join(short))


def gpu_shared(roles: dict[str, RoleOptions]) -> bool:
    """Whether a learner rank and a rollout worker may land on one GPU (each asks for a fraction of one).
    Then the run's first workers start only after the ranks have loaded: vLLM profiles the free GPU
    memory at engine start and fails (or sizes its KV cache wrong) when a rank allocates meanwhile."""
    learner, rollout = roles["learner_rank"].num_gpus, roles["rollout_worker"].num_gpus
    return 0 < learner < 1 and 0 < rollout < 1
