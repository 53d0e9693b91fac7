"""Config of the FSDP2 learner, its optimiser and its policy loss (PPO or CTPO, a union on ``type``)."""

from typing import Annotated, Literal

from pydantic import Field

from system.config.base import StrictModel

AdvantageType = Literal["grpo", "dr-grpo"]
"""``learner.advantage``: GRPO (divided by the group std) or Dr. GRPO (centred only)."""


class PPOLossConfig(StrictModel):
    type: Literal["ppo"] = "ppo"
    """Clipped surrogate with ``r = exp(cur - old)`` (spec section 5)."""
    eps_lo: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Lower clip: ``r >= 1 - eps_lo``."""
    eps_hi: float = Field(default=0.28, ge=0.0)
    """Upper clip: ``r <= 1 + eps_hi`` (DAPO-style asymmetric by default)."""


class CTPOLossConfig(StrictModel):
    type: Literal["ctpo"] = "ctpo"
    """Cumulative token ratio with position-adaptive clipping (spec section 4)."""
    c_lo: float = Field(default=0.025, gt=0.0)
    """Lower clip coefficient: ``lr >= -c_lo * t**p``."""
    c_hi: float = Field(default=0.05, gt=0.0)
    """Upper clip coefficient: ``lr <= c_hi * t**p``."""
    c_dual: float = Field(default=0.05, gt=0.0)
    """Dual clip for negative advantages at ``exp(c_dual * t**p)``."""
    p: float = Field(default=0.5, ge=0.0)
    """Exponent of the position-adaptive clip."""


LossConfig = Annotated[PPOLossConfig | CTPOLossConfig, Field(discriminator="type")]


class LearnerConfig(StrictModel):
    num_ranks: int = Field(default=2, ge=1)
    """R: FSDP2 ranks, one Ray actor each (gloo on CPU, NCCL on GPU)."""
    lr: float = Field(default=1e-3, gt=0.0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear learning-rate warm-up, in optimiser steps (``updates_per_batch x mini_batches`` per training
    step)."""
    grad_clip: float = Field(default=1.0, gt=0.0)
    """Global gradient-norm clip."""
    micro_batch_size: int = Field(default=128, ge=1)
    """Sequences per forward/backward on each rank."""
    updates_per_batch: int = Field(default=1, ge=1)
    """PPO epochs: passes over each batch, each of ``mini_batches`` optimiser steps; the policy version still
    advances by one per batch. The PPO / CTPO clip acts only from the second step on a batch (spec section 5)."""
    mini_batches: int = Field(default=1, ge=1)
    """Optimiser steps per epoch: step k trains the k-th run of consecutive rows of the global batch, whatever
    the number of ranks (each rank holds its part of every mini-batch: ``system.learner.batch.shard_rows``;
    sizes at most one row per rank apart), its loss normalised by that mini-batch's valid tokens /
    sequences. Choose it to divide ``prompts_per_step x group_size / num_ranks`` for updates that are
    exactly those of one process."""
    param_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """FSDP2 ``MixedPrecisionPolicy`` parameter dtype (gradients are reduced in float32)."""
    advantage: AdvantageType = "grpo"
    """GRPO (group-normalised by std) or Dr.GRPO (mean-centred only)."""
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    """How per-token losses are reduced (spec section 5)."""
    cpu_threads: int = Field(default=1, ge=1)
    """torch intra-op threads of each rank when it runs on CPU."""
    max_nonfinite_steps: int = Field(default=3, ge=0)
    """Consecutive steps whose loss or gradient is non-finite that are skipped before the run stops with an error."""
    loss: LossConfig = Field(default_factory=PPOLossConfig)
    """The policy-gradient surrogate."""
