"""The correction service actor: one per job, owns the run's metric sinks (JSONL, W&B) and the dumps."""

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import ray

from actors.cluster import verbose
from system.config import RunConfig, dump_config
from system.correction.service import CorrectionCore
from system.learner.batch import pack_response
from system.models.hf_files import token_names
from system.report.dump import newest_dump, token_text_grid
from system.report.dump_in_flight import DumpInFlight
from system.report.mismatch_report import write_report
from system.report.run_logger import RunLogger
from system.report.wandb_sink import remove_process_temp_dirs
from system.types import CorrectionInput, StepRecord


@ray.remote
class CorrectionService:
    def __init__(self, cfg: RunConfig, run_dir: str, model_dir: str, wandb_run_id: str | None = None,
                 wandb_sent_through: int = 0) -> None:
        if not verbose():  # a log file the disk cannot take (W&B's debug.log on a full disk): no traceback per record
            logging.raiseExceptions = False
        self.core = CorrectionCore(cfg.correction)
        self.logger = RunLogger(run_dir, cfg.report, json.loads(dump_config(cfg)), wandb_run_id,
                                live_sent_through=wandb_sent_through)
        # the tokenizer only names dumped tokens: loaded beside the first steps, so the service is ready for
        # the first batch without it (from tokenizer.json alone where there is one: transformers' import took
        # 10 s of a slow 2-core VM's CPU, and held the GIL against the first steps' corrections)
        loader = ThreadPoolExecutor(1, thread_name_prefix="aisrl-tokenizer")
        self._token_names = loader.submit(token_names, model_dir)
        loader.shutdown(wait=False)
        self.run_dir = Path(run_dir)
        self._undumped: tuple[int, CorrectionInput, np.ndarray] | None = None  # the last batch, until dumped
        # a step's dump is written beside the learners' update, not before its weights go back (a review: on
        # a dump step rank 0, and every rank after it, waited for the npz, ~10 us a token); at most one in
        # flight, and the step's record waits for it (its media go with the record). The lock keeps the
        # sinks to one thread at a time.
        self._dumping = DumpInFlight(self._dump)
        self._sinks = threading.Lock()

    def ready(self) -> None:
        """Answers once the service is built (its imports, sinks and W&B run), so a run's start waits
        for it beside the workers' and its first step does not."""

    def wandb_run_id(self) -> str | None:
        return self.logger.wandb_run_id

    def process(self, step: int, holder: list, proximal_N: np.ndarray, learner_version: int) -> tuple[np.ndarray, dict]:
        """Weights for the global batch (AIS's omega when on) and the correction's metrics (they reach the
        sinks with the step's record, ``finish_step``); a dump every ``report.dump_every`` steps. Called by
        learner rank 0 once per step; the batch itself is read here from the object store (``holder`` =
        [its reference]), never re-sent. The proximal log-probs come, and the weights go back, packed:
        one float32 per response token (``system.learner.batch.pack_response``)."""
        started = time.perf_counter()
        batch = ray.get(holder[0]).correction_input(proximal_N, learner_version)
        result = self.core.process(batch.behaviour_BT, batch.proximal_BT, batch.mask_BT, batch.lag_B, batch.advantage_B)
        # the service's own share of rank 0's time/correction (the rest is the call's round trip)
        result.metrics["time/correction_service"] = time.perf_counter() - started
        if result.alarm:  # drift alarm (correction.alarm): one console line, a W&B alert rate-limited per cause
            logging.getLogger(__name__).warning("step %d: %s", step, result.alarm)
            with self._sinks:
                self.logger.alert(f"aisrl drift alarm: {result.alarm_cause}", result.alarm, step)
        self._undumped = (step, batch, result.token_ratios)
        if self.logger.should_dump(step):
            undumped, self._undumped = self._undumped, None
            self._dumping.start(*undumped)  # after the previous one: one batch held for a dump at a time
        return pack_response(result.weights_BT, batch.mask_BT), result.metrics  # 0 off the mask: nothing lost

    def _dump(self, step: int, batch: CorrectionInput, token_ratios: np.ndarray) -> None:
        token_text = token_text_grid(self._token_names.result(), batch.response_ids_BT, batch.mask_BT)
        with self._sinks:
            self.logger.dump(step, batch, token_ratios, token_text)

    def _dump_undumped(self) -> None:
        self._dumping.wait()
        step, batch, token_ratios = self._undumped
        self._undumped = None
        self._dump(step, batch, token_ratios)

    def finish_step(self, record: StepRecord) -> None:
        """Write the step's record (the driver sends it without waiting for this call), after the step's dump
        if it has one (a dump that failed fails this call: the driver's check names it)."""
        self._dumping.wait(through=record.step)
        with self._sinks:
            self.logger.finish_step(record.step, record.metrics())

    def write_report(self, step: int | None = None) -> str | None:
        """The HTML report of the last step, into ``<run>/report``: the last step is dumped now if
        ``report.dump_every`` skipped it, so every run that trained a step has a dump and a report.
        A process that dumped nothing (a resumed run already at its last step) reports the newest
        dump up to ``step`` (the run's step: a later one is an abandoned attempt's)."""
        self._dumping.wait()
        if self._undumped is not None:
            self._dump_undumped()
        if self.logger.last_dump is None:
            self.logger.last_dump = newest_dump(self.run_dir / "dumps", step)
            if self.logger.last_dump is None:
                return None
        write_report(self.logger.last_dump, self.run_dir / "report")
        return str(self.run_dir / "report" / "report.html")

    def state_dict(self) -> dict:
        """The state a checkpoint keeps; the metrics written so far (every record up to the checkpoint's
        step: the driver's calls arrive in order) are made durable first, and so is a dump in flight."""
        self._dumping.wait()
        self.logger.jsonl.sync()
        return {**self.core.state_dict(), "wandb_alerts": self.logger.wandb.alert_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.core.load_state_dict(sd)
        self.logger.wandb.load_alert_state(sd.get("wandb_alerts"))  # absent in checkpoints before it existed

    def close(self) -> None:
        """The run's sinks closed; this process logs no more, so wandb's temporary directories go too."""
        try:
            self._dumping.close()
        finally:
            self.logger.close()
        remove_process_temp_dirs()
