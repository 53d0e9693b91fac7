"""The live console display: a rich progress bar with step, reward, KL, kept fraction, staleness, throughput."""

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from system.report.sinks import NullSink

_FIELDS = (
    ("reward", "reward/mean", "{:.3f}"),
    ("kl", "mismatch/kl_k1", "{:.2e}"),
    ("kept", "correction/keep_seq_frac", "{:.0%}"),
    ("lag", "staleness/lag_mean", "{:.2f}"),
    ("tok/s", "throughput/rollout_tokens_per_s", "{:.0f}"),
    ("learner waited", "time/wait_rollout", "{:.2f}s"),
    ("rollout idle", "time/rollout_idle", "{:.2f}s"),
)


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
        self.task = self.progress.add_task("train", total=max_steps, completed=start_step, info="starting")
        if self.live:
            self.progress.start()

    def log(self, step: int, metrics: dict) -> None:
        info = format_fields(metrics)
        self.progress.update(self.task, completed=step, info=info)
        if not self.live:
            self.console.print(f"step {step}  {info}")

    def close(self) -> None:
        if self.live:
            self.progress.stop()
