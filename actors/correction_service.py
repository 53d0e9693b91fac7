"""The correction service actor: one per job, owns the run's metric sinks (JSONL, W&B) and the dumps."""

import json
import logging
from pathlib import Path

import numpy as np
import ray
from transformers import AutoTokenizer

from system.config import RunConfig, dump_config
from system.correction.service import CorrectionCore
from system.report.dump import token_text_grid
from system.report.mismatch_report import write_report
from system.report.run_logger import RunLogger


@ray.remote
class CorrectionService:
    def __init__(self, cfg: RunConfig, run_dir: str, model_dir: str, wandb_run_id: str | None = None) -> None:
        self.core = CorrectionCore(cfg.correction)
        self.logger = RunLogger(run_dir, cfg.report, json.loads(dump_config(cfg)), wandb_run_id)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.run_dir = Path(run_dir)
        self._undumped: tuple[int, dict, np.ndarray] | None = None  # the last batch, until dumped

    def wandb_run_id(self) -> str | None:
        return self.logger.wandb_run_id

    def process(self, step: int, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, dict]:
        """Weights for the global batch (AIS's omega when on); metrics streamed now (``ais/...`` every
        step); a dump every ``report.dump_every`` steps (with ``advantage``, for the report's AIS)."""
        mu, old, mask = arrays["rollout_logp"], arrays["train_logp"], arrays["response_mask"]
        result = self.core.process(mu, old, mask, arrays["lag"], arrays.get("advantage"))
        self.logger.stream(step, result.metrics)
        if result.alarm:  # drift alarm (correction.alarm): one console line, a W&B alert rate-limited per cause
            logging.getLogger(__name__).warning("step %d: %s", step, result.alarm)
            self.logger.wandb.alert(f"aisrl drift alarm: {result.alarm_cause}", result.alarm, step=step)
        self._undumped = (step, arrays, result.token_ratios)
        if self.logger.should_dump(step):
            self._dump_undumped()
        return result.weights_BT, result.metrics

    def _dump_undumped(self) -> None:
        step, arrays, token_ratios = self._undumped
        dump = dict(arrays)
        dump["token_text"] = token_text_grid(self.tokenizer.convert_ids_to_tokens,
                                             arrays["response_ids"], arrays["response_mask"])
        self.logger.dump(step, dump, token_ratios)
        self._undumped = None

    def finish_step(self, step: int, metrics: dict) -> dict:
        return self.logger.finish_step(step, metrics)

    def write_report(self) -> str | None:
        """The HTML report of the last step, into ``<run>/report``: the last step is dumped now if
        ``report.dump_every`` skipped it, so every run that trained a step has a dump and a report."""
        if self._undumped is not None:
            self._dump_undumped()
        if self.logger.last_dump is None:
            dumps = sorted((self.run_dir / "dumps").glob("step_*.npz"))
            if not dumps:
                return None
            self.logger.last_dump = dumps[-1]
        write_report(self.logger.last_dump, self.run_dir / "report")
        return str(self.run_dir / "report" / "report.html")

    def state_dict(self) -> dict:
        return self.core.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.core.load_state_dict(sd)

    def close(self) -> None:
        self.logger.close()
