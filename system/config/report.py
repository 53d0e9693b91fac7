"""Config of metric sinks, W&B and the batch dumps behind the mismatch report."""

from typing import Literal

from pydantic import Field, field_validator

from system.config.base import MAX_TIMEOUT_S, StrictModel

_PROJECT_FORBIDDEN = "/\\#?%:"


class WandbConfig(StrictModel):
    mode: Literal["offline", "online", "disabled"] = "offline"
    """``offline`` writes ``wandb/offline-run-*`` for a later ``wandb sync``; ``online`` needs ``WANDB_API_KEY`` in the environment."""
    project: str = "aisrl"
    """W&B project: 1-128 characters, none of ``/ \\ # ? % :`` (W&B refuses those at start, which
    would leave a run without its W&B record)."""
    entity: str | None = None
    """W&B entity (team or user); unset = the key's default."""
    run_name: str | None = None
    """Run name; unset = the run directory's name."""
    init_timeout_s: float = Field(default=30.0, gt=0.0, le=MAX_TIMEOUT_S)
    """Give up starting W&B after this long (training goes on without it)."""

    @field_validator("project")
    @classmethod
    def _project_name(cls, value: str) -> str:
        bad = sorted({c for c in value if c in _PROJECT_FORBIDDEN})
        if not value or len(value) > 128 or bad:
            raise ValueError(f"a W&B project name has 1-128 characters and none of {' '.join(_PROJECT_FORBIDDEN)}"
                             + (f" (found {' '.join(bad)})" if bad else f" (it has {len(value)})"))
        return value


class ReportConfig(StrictModel):
    dump_every: int = Field(default=10, ge=0)
    """Write a batch dump (and log the ratio histogram and worst sequences to W&B) every this many steps;
    0 = none during the run. The last step trained is always dumped at the end, so every run that
    trained a step has a dump and a report."""
    console: bool = True
    """Show the live progress display."""
    stall_warning_s: float = Field(default=300.0, gt=0.0, le=MAX_TIMEOUT_S)
    """Say on the console when the driver has waited this long for a step's batch or for the running
    step (and again every this long): a hung rollout worker, learner rank or correction service
    otherwise stalls a run without a word."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Weights & Biases sink."""
