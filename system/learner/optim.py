"""AdamW over the (sharded) policy parameters and its learning-rate schedule.

Schedule: linear warm-up, then constant,

    lr(k) = lr * min(1, (k + 1) / warmup_steps)     (k = optimiser steps taken; lr if warmup_steps = 0)

so the first step already moves the weights and step ``warmup_steps - 1`` reaches ``lr``.
"""

import torch
from torch import nn

from system.config.learner import LearnerConfig


class LinearWarmup:
    """The multiplier of ``LambdaLR``; a class (not a lambda) so the schedule pickles."""

    def __init__(self, warmup_steps: int) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps

    def __call__(self, step: int) -> float:
        if self.warmup_steps == 0:
            return 1.0
        return min(1.0, (step + 1) / self.warmup_steps)


def build_optimizer(model: nn.Module, cfg: LearnerConfig) -> torch.optim.AdamW:
    """AdamW on every trainable parameter (DTensor shards under FSDP2; the state is sharded too)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: LearnerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``cfg.warmup_steps`` optimiser steps, then constant."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, LinearWarmup(cfg.warmup_steps))
