"""Config of metric sinks, W&B and the batch dumps behind the mismatch report."""

from typing import Literal

from pydantic import Field

from system.config.base import MAX_TIMEOUT_S, StrictModel


class WandbConfig(StrictModel):
    mode: Literal["offline", "online", "disabled"] = "offline"
    """``offline`` writes ``wandb/offline-run-*`` for a later ``wandb sync``; ``online`` needs ``WANDB_API_KEY`` in the environment."""
    project: str = "aisrl"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team or user); unset = the key's default."""
    run_name: str | None = None
    """Run name; unset = the run directory's name."""
    init_timeout_s: float = Field(default=30.0, gt=0.0, le=MAX_TIMEOUT_S)
    """Give up starting W&B after this long (training goes on without it)."""


class ReportConfig(StrictModel):
    dump_every: int = Field(default=10, ge=0)
    """Write a batch dump (and log the ratio histogram and worst sequences to W&B) every this many steps; 0 = never."""
    console: bool = True
    """Show the live progress display."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Weights & Biases sink."""
