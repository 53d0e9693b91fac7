"""When training has diverged: a run of consecutive non-finite steps (``learner.max_nonfinite_steps``).

A step is non-finite when the learner skipped its update (a non-finite gradient), its loss is not
finite, or it recomputed non-finite log-probs where the rollout's are finite (a diverged model).
A step after which a parameter is NaN or infinite stops the run at once: no later step can recover
from it (its weights were already sent to the rollout workers; it is never checkpointed).
"""

import math


class TrainingDivergedError(RuntimeError):
    """Too many consecutive steps with a non-finite loss, gradient or log-prob."""


class DivergenceGuard:
    """Counts consecutive non-finite steps; :meth:`observe` raises once there are more than ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.streak = 0
        """Consecutive non-finite steps up to the last one observed (0: the last one was finite)."""

    @staticmethod
    def nonfinite(learner_metrics: dict) -> bool:
        loss = learner_metrics.get("loss", 0.0)
        return (learner_metrics.get("skipped_step", 0.0) > 0
                or int(learner_metrics.get("nonfinite_proximal_tokens", 0)) > 0
                or not math.isfinite(loss))

    def observe(self, step: int, learner_metrics: dict) -> None:
        """Count ``step``; raise :class:`TrainingDivergedError` (what happened and what to do) past the limit,
        or at once when the update left a non-finite parameter."""
        self.streak = self.streak + 1 if self.nonfinite(learner_metrics) else 0
        if learner_metrics.get("nonfinite_params", 0.0) > 0:
            raise TrainingDivergedError(
                f"training diverged: step {step}'s update left non-finite parameters (loss "
                f"{learner_metrics.get('loss', 0.0)}, grad_norm {learner_metrics.get('grad_norm')}). Lower "
                "learner.lr (or tighten learner.grad_clip); no checkpoint was written after the divergence")
        if self.streak > self.limit:
            raise TrainingDivergedError(
                f"training diverged: {self.streak} consecutive steps with a non-finite loss, gradient or log-prob "
                f"(step {step}: loss {learner_metrics.get('loss', 0.0)}, grad_norm {learner_metrics.get('grad_norm')}, "
                f"{int(learner_metrics.get('nonfinite_proximal_tokens', 0))} non-finite proximal log-probs; "
                f"learner.max_nonfinite_steps={self.limit}). Lower learner.lr (or tighten learner.grad_clip); "
                "no checkpoint was written after the divergence")
