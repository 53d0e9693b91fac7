"""A run's metric hub: streams metrics to JSONL + W&B, writes batch dumps and the final report.

One object per job owns the W&B run. ``stream`` and ``dump`` gather a step's metrics and media as
they appear; ``finish_step`` sends them to the live sinks (W&B) in one call and writes the step's
single ``metrics.jsonl`` record, the union of everything gathered for that step. So the live sinks
receive steps in the order the driver finishes them: with ``async.queue_ahead`` the next step's
correction metrics exist before this step's record arrives (the learner calls the service
directly), and W&B ignores a step logged after a later one.
"""

from pathlib import Path

import numpy as np

from system.config.report import ReportConfig
from system.correction.ratios import valid_tokens
from system.report.dump import save_batch_dump
from system.report.sinks import FanOutSink, JsonlSink, MetricSink
from system.report.wandb_sink import WandbSink
from system.types import CorrectionInput

WORST_SEQUENCES = 16


class RunLogger:
    def __init__(self, run_dir: str | Path, cfg: ReportConfig, run_config: dict,
                 wandb_run_id: str | None = None, extra_sinks: list[MetricSink] = (),
                 live_sent_through: int = 0) -> None:
        """``live_sent_through``: a resumed run's last step that its abandoned attempt already sent to the
        W&B run it continues (``wandb_run_id``); the steps re-trained up to it go to ``metrics.jsonl``
        only. W&B keeps one value per step, the first attempt's: sent again, every chart drawn against
        ``train/step`` had two points at each of those steps (found by a probe: 347 conflicting values
        after a resume that re-trained 6 steps). ``metrics.jsonl`` keeps the values of the attempt that
        continued."""
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.jsonl = JsonlSink(self.run_dir / "metrics.jsonl")
        w = cfg.wandb
        self.wandb = WandbSink(w.mode, w.project, self.run_dir, run_config, entity=w.entity,
                               name=w.run_name, resume_id=wandb_run_id, init_timeout_s=w.init_timeout_s)
        self.live = FanOutSink([self.wandb, *extra_sinks])
        self._live_skip_through = live_sent_through if wandb_run_id is not None else 0
        self._finished_through = 0  # the last step whose record was sent
        self._media: dict[int, list] = {}  # step -> [(sink method name, args), ...]
        self.last_dump: Path | None = None

    @property
    def wandb_run_id(self) -> str | None:
        return self.wandb.run_id

    def finish_step(self, step: int, metrics: dict) -> dict:
        """Send the step's metrics and media to the live sinks, write its JSONL record; return the record."""
        record = dict(metrics)
        media = self._media.pop(step, [])
        if step > self._live_skip_through:
            self.live.log(step, record)
            for method, args in media:
                getattr(self.live, method)(step, *args)
        self._finished_through = max(self._finished_through, step)
        if self.cfg.wandb.mode != "disabled":  # 0 once W&B failed (the run goes on, metrics stay here)
            record["report/wandb_live"] = int(self.wandb.run is not None)
        self.jsonl.log(step, record)
        return record

    def alert(self, title: str, text: str, step: int) -> bool:
        """A W&B alert for ``step`` (``WandbSink.alert``), unless the W&B run has that step already: a
        resumed run re-training it raised the stopped attempt's alarm a second time."""
        if step <= self._live_skip_through:
            self.wandb.replay_alert(title, step)
            return False
        return self.wandb.alert(title, text, step=step)

    def should_dump(self, step: int) -> bool:
        return self.cfg.dump_every > 0 and step % self.cfg.dump_every == 0

    def dump(self, step: int, batch: CorrectionInput, token_ratios: np.ndarray,
             token_text: np.ndarray | None = None) -> Path:
        """Write ``dumps/step_XXXXXX.npz`` and log the ratio histogram and the worst sequences: with the
        step's record, or now when the record was sent already (the last step, dumped when the run
        ends: its media were queued behind a record that had left, and never reached W&B)."""
        path = save_batch_dump(self.run_dir / "dumps" / f"step_{step:06d}.npz", batch, token_text)
        self.last_dump = path
        media = [("log_histogram", ("mismatch/token_ratio", token_ratios)),
                 ("log_table", ("mismatch/worst_sequences", *worst_sequences_table(batch)))]
        if step > self._finished_through:
            self._media.setdefault(step, []).extend(media)
        elif step > self._live_skip_through:
            for method, args in media:
                getattr(self.live, method)(step, *args)
        return path

    def close(self) -> None:
        self.jsonl.close()
        self.live.close()


def worst_sequences_table(batch: CorrectionInput) -> tuple[list[str], list[list]]:
    """Columns and rows of the sequences with the largest mean |proximal - behaviour| over their valid
    tokens (``length``: how many, as in ``samples.json``)."""
    valid = valid_tokens(batch.mask_BT, batch.behaviour_BT, batch.proximal_BT)
    with np.errstate(invalid="ignore"):
        d = np.where(valid, batch.proximal_BT.astype(np.float64) - batch.behaviour_BT, 0.0)
    n_valid = valid.sum(1)
    n = np.maximum(n_valid, 1)
    mean_abs = np.abs(d).sum(1) / n
    order = np.argsort(-mean_abs, kind="stable")[:WORST_SEQUENCES]
    cols = ["uid", "mean_abs_diff", "max_abs_diff", "length", "lag", "reward", "response"]
    rows = [[batch.uids[i], float(mean_abs[i]), float(np.abs(d[i]).max()), int(n_valid[i]), int(batch.lag_B[i]),
             float(batch.reward_B[i]), batch.response_texts[i]] for i in order]
    return cols, rows
