"""How new policy versions reach the rollout workers (``weight_sync.type``)."""

from typing import Annotated, Literal

from pydantic import Field

from system.config.base import MAX_TIMEOUT_S, StrictModel


class ObjectStoreSyncConfig(StrictModel):
    """Learner rank 0 puts each version's full weights in Ray's object store; every worker reads
    them from its node's store (the portable default)."""

    type: Literal["object_store"] = "object_store"
    """Selects this transport."""


MIN_SYNC_TIMEOUT_S = 0.1
"""Below this no generation could form (its workers join over TCP), and below 1 ms torch's store
timeout rounds to 0, so learner rank 0 could not even host the group's store: a probe's run with
1e-9 failed with a C++ backtrace after passing ``--dry-run``."""


class _GroupSyncConfig(StrictModel):
    """What ``collective`` and ``delta`` share: a broadcast group from learner rank 0 to the ready workers."""

    type: str  # each transport's literal (declared here so that it comes first in a dumped config)
    timeout_s: float = Field(default=60.0, ge=MIN_SYNC_TIMEOUT_S, le=MAX_TIMEOUT_S)
    """A version's transfer (and a generation's forming) that does not complete in this time fails (the
    group is then re-formed); the workers' wait for the next version between steps is not bounded by it."""
    chunk_mb: int = Field(default=64, ge=1)
    """Data goes in chunks of this many MiB (the sender's staging buffer)."""
    shared_memory: bool = True
    """When every worker of a generation sees learner rank 0's ``/dev/shm`` (same host, checked as
    they join), the data goes through a shared segment instead of gloo's sockets; otherwise (another
    node, its own container) all of it goes over gloo. The segment holds one copy of the weights."""


class CollectiveSyncConfig(_GroupSyncConfig):
    """Learner rank 0 broadcasts each version to the ready workers over a process group of their own
    (gloo on CPU: ``system.weight_broadcast``), right after its export; a worker loads the version it
    received, and falls back to the object store when it missed it (it joined since the group was
    formed, or the group broke). The group is re-formed whenever the set of ready workers changes."""

    type: Literal["collective"] = "collective"
    """Selects this transport."""


class DeltaSyncConfig(_GroupSyncConfig):
    """``collective``, but each version after the first of a generation travels as a lossy delta with
    error feedback (``system.weight_delta``: rank-``rank`` factors per matrix, int8 per column by
    default, int8 rows for the rest), and in full every ``full_every`` versions. The workers run on the reconstruction: its
    error shows up in the mismatch the correction service measures."""

    type: Literal["delta"] = "delta"
    """Selects this transport."""
    rank: int = Field(default=4, ge=1)
    """Rank of each matrix's delta (PowerSGD-style, one warm-started power iteration per version)."""
    factors: Literal["int8", "float16"] = "int8"
    """How a matrix's two factors travel: int8 with one float32 scale per column (half the bytes), or
    float16. Their rounding joins the codec error that error feedback carries to the next version."""
    full_every: int = Field(default=20, ge=1)
    """Send the full weights every this many versions (and to every new generation)."""
    full_above_error: float = Field(default=0.05, gt=0)
    """Send the full weights instead of a version's delta when the delta would leave the workers'
    reconstruction R further than this from the weights W, ``||W - R|| / ||W||`` (what
    ``weight_sync/codec_rel_error`` reports; 0.6 % on the default run, so the default 5 % fires only
    when the codec cannot follow a change; ``weight_sync/full_for_error`` counts it)."""


WeightSyncConfig = Annotated[ObjectStoreSyncConfig | CollectiveSyncConfig | DeltaSyncConfig,
                             Field(discriminator="type")]
