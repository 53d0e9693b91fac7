"""The W&B sink (the only ``wandb`` import). W&B trouble never stops training: it is said once.

Offline mode by default writes ``wandb/offline-run-*`` under the run directory for a later
``wandb sync``. The API key is read by wandb from the environment; it never enters the config.
``wandb`` is imported when a sink with W&B on is made, so only the process that logs imports it.
"""

import logging
import os
import sys
from pathlib import Path

import numpy as np

from system.report.sinks import NullSink

log = logging.getLogger(__name__)
ALERT_EVERY_STEPS = 10
"""Default rate limit of ``WandbSink.alert``: at most one alert per title within this many steps."""


def _wandb():
    import wandb

    return wandb


def remove_process_temp_dirs() -> list[str]:
    """Remove the two process-wide temporary directories ``wandb`` makes when its modules are
    imported (media and artifact staging, under the system temp dir): wandb removes them only at
    interpreter exit, which a Ray actor stopped with its job never reaches, so every run left two
    directories in /tmp. Call once the process will log no more (the correction service's close).
    wandb internals (``MEDIA_TMP``, ``Artifact._TMP_DIR``; checked on wandb 0.31): an attribute
    that is not there is skipped. Returns the paths removed."""
    found = []
    media = sys.modules.get("wandb.sdk.data_types._private")
    found.append(getattr(media, "MEDIA_TMP", None))
    artifact = sys.modules.get("wandb.sdk.artifacts.artifact")
    found.append(getattr(getattr(artifact, "Artifact", None), "_TMP_DIR", None))
    removed = []
    for tmp in found:
        name = getattr(tmp, "name", None)
        if name and hasattr(tmp, "cleanup") and os.path.isdir(name):
            tmp.cleanup()
            removed.append(name)
    return removed


STEP_KEY = "train/step"
"""The x-axis of every chart: the training step, logged as a value with each record
(``define_metric``), not as W&B's own ``step=``, which W&B ignores (with a warning only) when it is
lower than one already logged: the last step's dump, made when the run ends, logs its media after
that step's record. A resumed run does not send again the steps its stopped attempt sent
(``RunLogger``'s ``live_sent_through``): W&B would draw two points at each."""
FINISH_TIMEOUT_S = 60.0
"""``run.finish()`` gives up uploading after this long (W&B's default waits for ever: a network lost
at the end of a run would hang the job after its final checkpoint); what is left is on disk for
``wandb sync``."""


class WandbSink(NullSink):
    def __init__(self, mode: str, project: str, run_dir: str | Path, config: dict,
                 entity: str | None = None, name: str | None = None, resume_id: str | None = None,
                 init_timeout_s: float = 30.0) -> None:
        self.run = None
        self.failed = False
        self._run_id = resume_id
        self._alerted: dict[str, int] = {}  # alert title -> step of its last alert
        self._alert_failed = False
        if mode == "disabled":
            return
        try:
            os.environ.setdefault("WANDB_SILENT", "true")
            # Our own helper process: a WANDB_SERVICE inherited from a parent that uses W&B (a
            # notebook, a test runner, the driver of a Ray job) would tie this run to its helper.
            os.environ.pop("WANDB_SERVICE", None)
            wandb = _wandb()
            self.run = wandb.init(
                mode=mode, project=project, entity=entity, name=name or Path(run_dir).name,
                dir=str(run_dir), config=config, id=resume_id, resume="allow" if resume_id else None,
                settings=wandb.Settings(console="off", x_disable_stats=True, init_timeout=init_timeout_s,
                                        finish_timeout=FINISH_TIMEOUT_S),
            )
            self._run_id = self.run.id
            # every metric against the training step, logged as a value (see STEP_KEY)
            self.run.define_metric(STEP_KEY)
            self.run.define_metric("*", step_metric=STEP_KEY)
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

    def _call(self, what: str, payload, step: int) -> None:
        """``payload``: a dict, or a function building it (its errors, e.g. a histogram of non-finite
        values, are W&B failures too: said once, never raised into training)."""
        if self.run is None:
            return
        try:
            self.run.log({**(payload() if callable(payload) else payload), STEP_KEY: step})
        except Exception as exc:  # noqa: BLE001
            self._fail(what, exc)

    def log(self, step, metrics):
        self._call("log", {k: v for k, v in metrics.items() if v is not None}, step)

    def log_histogram(self, step, name, values):
        self._call("log a histogram", lambda: {name: _wandb().Histogram(np.asarray(values), num_bins=64)}, step)

    def log_table(self, step, name, columns, rows):
        self._call("log a table", lambda: {name: _wandb().Table(columns=columns, data=rows)}, step)

    def alert_state(self) -> dict[str, int]:
        """``{title: step of its last alert}``, for a checkpoint: a resumed run keeps the rate limit (a
        review found a second alert for one cause within ``ALERT_EVERY_STEPS`` after a resume)."""
        return dict(self._alerted)

    def load_alert_state(self, state: dict | None) -> None:
        self._alerted = {str(k): int(v) for k, v in (state or {}).items()}

    def replay_alert(self, title: str, step: int, min_steps: int = ALERT_EVERY_STEPS) -> None:
        """An alarm at a ``step`` the W&B run holds already (a resumed run re-training the stopped attempt's
        steps): nothing is sent, but the rate limit counts it as that attempt did (it sent an alert here
        unless one for ``title`` came within ``min_steps``). Found by a review: an alarm at step 12 after a
        checkpoint at 10 was alerted by the first attempt, and the resumed run alerted it again at 15."""
        last = self._alerted.get(title)
        if last is None or step - last >= min_steps:
            self._alerted[title] = step

    def alert(self, title: str, text: str, step: int | None = None, min_steps: int = ALERT_EVERY_STEPS) -> bool:
        """A W&B alert (``wandb.alert`` on this run, level WARN); True when sent. Rate limit: one per
        ``title`` (use one title per cause) within ``min_steps`` steps. Never raises: a failure is
        said once and later alerts are still tried (the run keeps logging either way)."""
        if self.run is None:
            return False
        last = self._alerted.get(title)
        if step is not None and last is not None and step - last < min_steps:
            return False
        try:
            self.run.alert(title=title, text=text, level=_wandb().AlertLevel.WARN)
        except Exception as exc:  # noqa: BLE001 - an alert is a courtesy, never a failure of the run
            if not self._alert_failed:
                log.warning("W&B alert failed (%s: %s); the alarm stays in the console and metrics.jsonl",
                            type(exc).__name__, exc)
            self._alert_failed = True
            return False
        if step is not None:
            self._alerted[title] = step
        return True

    def close(self):
        if self.run is not None:
            try:
                self.run.finish()
            except Exception as exc:  # noqa: BLE001
                self._fail("finish", exc)
            self.run = None
