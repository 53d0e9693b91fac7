"""The live console display: a rich progress bar with step, reward, KL, kept fractions, staleness, throughput.

``kept`` is the correction method's kept fraction of sequences (those with at least one kept token) and
of tokens (valid tokens with a weight above 0): a token-level method (token-tis, icepop) keeps nearly
every sequence while it masks tokens, a sequence-level one masks whole sequences.

``tok/s`` on the console is the rollout rate over the last ``RATE_WINDOW`` steps (tokens generated
over their seconds: ``sum(rate_i * step_s_i) / sum(step_s_i)``), so a step in which nothing was
generated (the last one, or one the rollout side sat out under the staleness bound) does not read 0;
``metrics.jsonl`` keeps each step's own ``throughput/rollout_tokens_per_s``.
"""

from collections import deque

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from system.report.sinks import NullSink

_FIELDS = (
    ("reward", "reward/mean", "{:.3f}"),
    ("kl", "mismatch/kl_k1", "{:.2e}"),
    ("kept seq", "correction/keep_seq_frac", "{:.0%}"),
    ("tok", "correction/keep_token_frac", "{:.0%}"),
    ("lag", "staleness/lag_mean", "{:.2f}"),
    ("tok/s", "throughput/rollout_tokens_per_s", "{:.0f}"),
    ("learner waited", "time/wait_rollout", "{:.2f}s"),
    ("rollout idle", "time/rollout_idle", "{:.2f}s"),
)


RATE_WINDOW = 10
_RATE = "throughput/rollout_tokens_per_s"


def format_fields(metrics: dict) -> str:
    parts = []
    for label, key, fmt in _FIELDS:
        value = metrics.get(key)
        parts.append(f"{label} {fmt.format(value) if value is not None else '-'}")
    return "  ".join(parts)


class ConsoleSink(NullSink):
    """One progress bar over ``max_steps``; on a non-terminal it prints one line per step instead."""

    def __init__(self, max_steps: int, start_step: int = 0, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, soft_wrap=True)  # a log line stays one line (no 80-column wrap off a terminal)
        self.live = self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=self.console, disable=not self.live,
        )
        self._recent: deque[tuple[float, float]] = deque(maxlen=RATE_WINDOW)  # (tokens, seconds) per step
        self.task = self.progress.add_task("train", total=max_steps, completed=start_step, info="starting")
        if self.live:
            self.progress.start()

    def log(self, step: int, metrics: dict) -> None:
        info = format_fields({**metrics, _RATE: self._window_rate(metrics)})
        self.progress.update(self.task, completed=step, info=info)
        if not self.live:
            self.console.print(f"step {step}  {info}")

    def _window_rate(self, metrics: dict) -> float | None:
        """Rollout tokens per second over the last ``RATE_WINDOW`` steps, this one included."""
        rate, seconds = metrics.get(_RATE), metrics.get("time/step")
        if rate is None or seconds is None or not seconds > 0:
            return rate
        self._recent.append((rate * seconds, seconds))
        return sum(t for t, _ in self._recent) / sum(s for _, s in self._recent)

    def close(self) -> None:
        if self.live:
            self.progress.stop()
