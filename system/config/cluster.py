"""Config of the asynchronous pipeline (staleness bound) and of the Ray cluster it runs on."""

from pydantic import Field, field_validator

from system.config.base import StrictModel

MAX_LAG = 1024
"""The largest staleness bound: every step record counts the samples at each lag from 0 to ``max_lag``
(``staleness/sequences_lag_<k>``), so a probe's ``max_lag=10**18`` passed ``--dry-run`` and would have failed
the first step allocating those counts. AReaL-style off-policy runs use single digits; a large value
meaning "unbounded" still fits."""


class AsyncConfig(StrictModel):
    max_lag: int = Field(default=1, ge=0, le=MAX_LAG)
    """A sample may be generated with weights at most this many policy versions behind the learner; 0 = synchronous on-policy."""
    queue_ahead: bool = False
    """With ``max_lag >= 1``: submit the next step as soon as its batch is complete, while the running step
    trains, so the learner goes on without a driver round trip (5-15 ms less per step with simulated
    engines). The trade: batches are taken as soon as they are admissible, so they hold fewer lag-0
    samples (the ablation's drift regime, max_lag 1: 33 % of trained samples at lag 0 without it,
    about 2 % with it). Off by default, so runs keep the freshness the measured results had."""


RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "TPU", "memory", "object_store_memory", "accelerator_type")
"""Resource names Ray defines itself (``node:<ip>`` and ``accelerator_type:<type>`` too), refused as a role's marker resource."""


class RayConfig(StrictModel):
    address: str | None = None
    """Cluster to join (``auto`` or ``ray://...``); unset = start a private local cluster bound to 127.0.0.1."""
    num_cpus: int | None = Field(default=None, ge=1)
    """Logical CPUs of a local cluster (unset = enough for every actor)."""
    object_store_gib: float = Field(default=1.0, ge=0.1, le=65536.0)
    """Object-store memory of a local cluster, 0.1 GiB (Ray needs at least 75 MiB) to 64 TiB."""
    include_dashboard: bool = False
    """Start the dashboard of a local cluster (on loopback)."""
    rollout_resource: str = "rollout"
    """Custom resource that marks nodes for rollout workers (ignored when no node offers it)."""
    learner_resource: str = "learner"
    """Custom resource that marks nodes for learner ranks (ignored when no node offers it)."""
    rollout_gpus: float = Field(default=0.0, ge=0.0)
    """GPUs each rollout worker reserves (1 on GPU clusters)."""
    learner_gpus: float = Field(default=0.0, ge=0.0)
    """GPUs each learner rank reserves (1 on GPU clusters)."""

    @field_validator("rollout_resource", "learner_resource")
    @classmethod
    def _a_custom_resource(cls, value: str, info) -> str:
        """Ray's own resources cannot be requested by name (``CPU`` and ``GPU`` go as ``num_cpus`` /
        ``num_gpus``, a node's ``node:<ip>`` pins one node): Ray refused them only once the cluster had
        started, without naming the field (a review's find)."""
        if not value.strip():
            raise ValueError(f"ray.{info.field_name} must name a custom resource, got an empty name")
        if value in RAY_BUILTIN_RESOURCES or value.startswith(("node:", "accelerator_type:")):
            raise ValueError(f"ray.{info.field_name}={value!r} is one of Ray's own resources, which an actor "
                             "cannot request by name: give the custom resource that marks the nodes (e.g. "
                             f"{cls.model_fields[info.field_name].default!r}); the CPUs and GPUs are reserved "
                             "by num_cpus and ray.rollout_gpus / ray.learner_gpus")
        return value

    @field_validator("address")
    @classmethod
    def _a_cluster_address(cls, value: str | None) -> str | None:
        """A dashboard URL here failed only at ``ray.init``, whose message blamed ``RAY_ADDRESS`` (``aisrl
        submit`` and ``aisrl job`` take that URL with ``--address``, so it is an easy slip)."""
        if value is not None and value.split("://")[0].lower() in ("http", "https"):
            raise ValueError(f"{value!r} is a dashboard (Jobs API) URL, which `aisrl submit --address` takes; "
                             "ray.address is the cluster's GCS address (host:port, e.g. 127.0.0.1:6379), "
                             "ray://host:10001 or auto")
        return value
