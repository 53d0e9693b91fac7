"""When the correction trains nothing: consecutive steps whose applied weights keep no token.

A step keeps nothing when ``correction/keep_token_frac`` (valid tokens whose applied weight,
omega with AIS, is > 0, over all valid tokens; ``method_statistics``) is exactly 0: every term of
its loss is multiplied by 0, so it moves the policy only through AdamW's momentum and weight
decay. One such step can be chance (a small batch beyond a tight band); ``limit + 1`` of them in a
row is a band that no longer fits the mismatch, and the run stops with an error instead of spending
its steps on nothing and exiting 0 (``correction.max_nothing_kept_steps``; None never stops).
A batch without a valid token (``keep_token_frac`` None) neither counts nor breaks the streak.
"""

import math


class NothingKeptError(RuntimeError):
    """More than ``correction.max_nothing_kept_steps`` consecutive steps kept no token."""


class NothingKeptGuard:
    """Counts consecutive steps that kept no token; :meth:`observe` raises once there are more than ``limit``."""

    def __init__(self, limit: int | None, method: str = "") -> None:
        self.limit = limit
        self.method = method  # the configured method, for the message (``seq-mis hi=3.0``)
        self.streak = 0
        """Consecutive steps that kept no token, up to the last one observed."""
        self.first_step: int | None = None
        """The step the streak began at (a batch without a valid token in it is skipped, not counted)."""

    def state_dict(self) -> dict:
        """The streak, for a checkpoint: a run resumed in the middle of a streak goes on counting it (a
        fresh guard at every resume could never stop a run checkpointed more often than ``limit``)."""
        return {"streak": self.streak, "first_step": self.first_step}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore :meth:`state_dict`'s streak (None: a checkpoint of a run before it was saved; no streak)."""
        state = state or {}
        self.streak, self.first_step = int(state.get("streak", 0)), state.get("first_step")

    def observe(self, step: int, correction_metrics: dict) -> None:
        keep = correction_metrics.get("correction/keep_token_frac")
        if keep is None:
            return
        if keep != 0:
            self.streak, self.first_step = 0, None
            return
        self.streak += 1
        if self.first_step is None:
            self.first_step = step
        if self.limit is not None and self.streak > self.limit:
            kl = correction_metrics.get("mismatch/kl_k1")
            outside = correction_metrics.get("mismatch/frac_outside_5x")
            raise NothingKeptError(
                f"the correction kept no token for {self.streak} consecutive steps (steps {self.first_step}"
                f"-{step}; method {self.method or '?'}; step {step}: kl_k1 {_fmt(kl)}, tokens outside 5x "
                f"{_fmt(outside)}): those steps trained nothing. Widen correction.method's band, or lower the "
                f"mismatch (async.max_lag, rollout.quantization); correction.max_nothing_kept_steps={self.limit} "
                "(null: never stop)")


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    value = float(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)
