"""The W&B sink (the only ``wandb`` import). W&B trouble never stops training: it is said once.

Offline mode by default writes ``wandb/offline-run-*`` under the run directory for a later
``wandb sync``. The API key is read by wandb from the environment; it never enters the config.
"""

import logging
import os
from pathlib import Path

import numpy as np
import wandb

from system.report.sinks import NullSink

log = logging.getLogger(__name__)


class WandbSink(NullSink):
    def __init__(self, mode: str, project: str, run_dir: str | Path, config: dict,
                 entity: str | None = None, name: str | None = None, resume_id: str | None = None,
                 init_timeout_s: float = 30.0) -> None:
        self.run = None
        self.failed = False
        self._run_id = resume_id
        if mode == "disabled":
            return
        try:
            os.environ.setdefault("WANDB_SILENT", "true")
            # Our own helper process: a WANDB_SERVICE inherited from a parent that uses W&B (a
            # notebook, a test runner, the driver of a Ray job) would tie this run to its helper.
            os.environ.pop("WANDB_SERVICE", None)
            self.run = wandb.init(
                mode=mode, project=project, entity=entity, name=name or Path(run_dir).name,
                dir=str(run_dir), config=config, id=resume_id, resume="allow" if resume_id else None,
                settings=wandb.Settings(console="off", x_disable_stats=True, init_timeout=init_timeout_s),
            )
            self._run_id = self.run.id
        except Exception as exc:  # noqa: BLE001 - any W&B failure must leave training running
            self._fail("start", exc)

    @property
    def run_id(self) -> str | None:
        """The W&B run's id, kept after a failure so a resumed job continues the same run."""
        return self._run_id

    def _fail(self, what: str, exc: Exception) -> None:
        if not self.failed:
            log.warning("W&B failed to %s (%s: %s); training continues, metrics stay in metrics.jsonl",
                        what, type(exc).__name__, exc)
        self.failed = True
        self.run = None

    def _call(self, what: str, payload: dict, step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log(payload, step=step)
        except Exception as exc:  # noqa: BLE001
            self._fail(what, exc)

    def log(self, step, metrics):
        self._call("log", {k: v for k, v in metrics.items() if v is not None}, step)

    def log_histogram(self, step, name, values):
        if self.run is not None:
            self._call("log a histogram", {name: wandb.Histogram(np.asarray(values), num_bins=64)}, step)

    def log_table(self, step, name, columns, rows):
        if self.run is not None:
            self._call("log a table", {name: wandb.Table(columns=columns, data=rows)}, step)

    def close(self):
        if self.run is not None:
            try:
                self.run.finish()
            except Exception as exc:  # noqa: BLE001
                self._fail("finish", exc)
            self.run = None
