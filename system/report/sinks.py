"""Metric sinks behind one protocol: JSONL, fan-out, null. (W&B: ``wandb_sink``; console: ``console_sink``.)

Core code returns metrics as flat ``{name: number}`` dicts; only sinks write them anywhere.
"""

import os
from pathlib import Path
from typing import Protocol

import numpy as np

from system.report import strict_json


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_histogram(self, step: int, name: str, values: np.ndarray) -> None: ...
    def log_table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None: ...
    def close(self) -> None: ...


class NullSink:
    def log(self, step, metrics): pass
    def log_histogram(self, step, name, values): pass
    def log_table(self, step, name, columns, rows): pass
    def close(self): pass


class JsonlSink(NullSink):
    """Appends one JSON object per ``log`` call to ``metrics.jsonl`` (flushed each line). The file is
    opened at the first record, by path: a resume trims the file (``metrics_file.trim_metrics`` replaces
    it) after this sink exists and before the first record."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # strict JSON at any depth: non-finite numbers as null, numpy / torch values as plain ones
        line = strict_json.dumps({"step": step, **metrics})
        if self._fh is None:
            self._fh = self.path.open("a", buffering=1)
        elif not self._still_the_file():  # written on, the records would go to a file no one can open
            raise FileNotFoundError(f"{self.path} was removed or replaced while the run wrote it: the records "
                                    f"from step {step} on have no file")
        self._fh.write(line + "\n")

    def _still_the_file(self) -> bool:
        try:
            here, open_ = os.stat(self.path), os.fstat(self._fh.fileno())
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (open_.st_dev, open_.st_ino)

    def sync(self) -> None:
        """Make every record written so far durable (``fsync``): called when a checkpoint is taken, so a
        machine crash cannot keep checkpoint k while losing the records up to step k."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


class FanOutSink(NullSink):
    """Sends every call to each child sink."""

    def __init__(self, sinks: list[MetricSink]) -> None:
        self.sinks = list(sinks)

    def log(self, step, metrics):
        for s in self.sinks:
            s.log(step, metrics)

    def log_histogram(self, step, name, values):
        for s in self.sinks:
            s.log_histogram(step, name, values)

    def log_table(self, step, name, columns, rows):
        for s in self.sinks:
            s.log_table(step, name, columns, rows)

    def close(self):
        for s in self.sinks:
            s.close()
