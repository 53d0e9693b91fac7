"""The job: build every role, run the train loop against the rollout loop, checkpoint, report.

Each step (drawn in ``actors.controller``): take a batch -> put it -> one call to the learner
group (proximal log-probs, the correction service, the update, the export; version + 1), and
publish at once the reference its weights will have (offered while the step runs) -> wait for the
step (the one blocking call) -> check, without waiting, that the earlier records were written ->
the step record to the service and the progress to the control board, neither awaited ->
checkpoint when due (after waiting for every record sent).
When the next batch is ready before the running step ends, the next step is submitted then and
waits in the learners' queue (``SubmittedStep.queued_ahead``).
"""

import logging
import os
import threading
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors import cluster
from actors.control import create_control, remove_control_file
from actors.controller import RolloutLoop
from actors.correction_service import CorrectionService
from actors.learner_worker import LearnerGroup, LearnerRank, gather
from actors.placement import check_placeable, gpu_shared, plan_placement, required_cpus
from actors.rollout_pool import RolloutPool
from actors.rollout_worker import RolloutWorker
from actors.run_checkpoint import (
    controller_snapshot,
    load_learner_half,
    restore_controller,
    set_aside_after_checkpoint,
)
from actors.run_temp import make_run_temp, remove_run_temp
from actors.shared_state import SharedState, take_batch
from actors.step_records import RecordsInFlight, RolloutSince, SubmittedStep, step_record
from actors.stop_signals import as_terminated, defer_signals, stop_on_signals, terminate_raises
from actors.weight_sync import build_transport
from system import controller_state, metrics_file, run_state
from system.config import RunConfig, dump_config
from system.config.advice import config_warnings
from system.correction.nothing_kept import NothingKeptError, NothingKeptGuard
from system.data.buffer import TrajectoryBuffer
from system.data.context_fit import fit_dataset_prompts
from system.data.prompt_source import build_prompt_source
from system.data.sampler import PromptSampler
from system.learner.collate import collate_groups
from system.learner.divergence import DivergenceGuard, TrainingDivergedError
from system.losses.advantages import SCALE_BY_STD
from system.models.model_dir import resolve_model_dir
from system.report.console_sink import ConsoleSink

log = logging.getLogger(__name__)

REPORTED_FAILURES = (NothingKeptError, TrainingDivergedError)
"""The guards' stops: the run still gets its last batch's dump and the report (``Trainer._report_failed_run``)."""


class Trainer:
    def __init__(self, cfg: RunConfig, resume: bool = False, rollout_cls=RolloutWorker, learner_cls=LearnerRank,
                 overwrite: bool = False) -> None:
        """``rollout_cls`` / ``learner_cls``: the actor classes of the two roles (real by default;
        benchmarks that isolate orchestration overhead pass simulated ones). A new run (no
        ``resume``) refuses an ``output_dir`` that holds a run unless ``overwrite``."""
        self.cfg = cfg
        self.actor_classes = (rollout_cls, learner_cls)
        self.run_dir = Path(cfg.output_dir)
        self.ckpt = None
        created = not os.path.lexists(self.run_dir)
        self._lock = run_state.lock_run_dir(self.run_dir)  # one process per run directory
        self._accepted_new = False  # a new run accepted into an empty directory (or one overwritten)
        self._replaced: Path | None = None  # --overwrite: the old run, set aside until this one has started
        self.stop_requested = threading.Event()  # SIGTERM / Ctrl-C during run(): stop after the step
        self.records = RecordsInFlight()
        self._restore_signals = terminate_raises()  # start-up: SIGTERM cleans up as a failed start
        try:
            self._start(resume, overwrite)
        except BaseException:
            restore_deferred = defer_signals()  # the cleanup below runs to its end
            try:  # whatever started before the failure (ranks, service, workers, the run's temp dir) first
                self._stop_parts()
            finally:
                try:
                    self._clean_failed_start(created)
                finally:
                    restore_deferred()
                    self._restore_signals()
            raise

    def _clean_failed_start(self, created: bool) -> None:
        """A refused or failed start leaves the directory free (``run_state.undo_new_run``)."""
        try:
            if self._accepted_new:
                run_state.undo_new_run(self.run_dir, self._replaced)
        finally:
            self._release_lock(remove_dir=created)

    def _release_lock(self, remove_dir: bool = False) -> None:
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            run_state.release_run_dir(lock, self.run_dir, remove_dir)

    def _start(self, resume: bool, overwrite: bool) -> None:
        cfg, saved = self.cfg, {}
        self._wandb_sent_through = 0  # a resumed run's steps its W&B run holds already (RunLogger)
        for warning in config_warnings(cfg):
            log.warning("%s", warning)
        if not resume:
            self._replaced = run_state.check_new_run_dir(self.run_dir, overwrite)
            self._accepted_new = True
        else:
            run_state.check_no_replaced_run(self.run_dir)
            self.ckpt, saved, skipped = run_state.checkpoint_to_resume(self.run_dir, cfg.max_steps)
            self._wandb_sent_through = metrics_file.wandb_sent_through(self.run_dir)  # refuses a damaged file
            for reason in skipped:
                log.warning("checkpoint %s; falling back to an older one", reason)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = str(resolve_model_dir(cfg))
        self.step = saved.get("step", 0)
        self.divergence = DivergenceGuard(cfg.learner.max_nonfinite_steps)
        self.nothing_kept = NothingKeptGuard(cfg.correction.max_nothing_kept_steps, cfg.correction.method.label())
        self._queued: SubmittedStep | None = None  # a step submitted behind the running one
        self._checkpoint_owed = False  # a due checkpoint was skipped (a non-finite step): take the next one
        saved = self._build(saved)
        # written once the run is accepted: a refused --resume leaves the directory as it was
        if self.ckpt is not None:
            set_aside_after_checkpoint(self.run_dir, saved["step"], self._wandb_sent_through)
        self._saved_step = saved.get("step")  # the checkpoint on disk for this step (None: none)
        run_state.drop_replaced(self._replaced)  # started: the replaced run goes
        self._replaced = None
        run_state.write_text_whole(self.run_dir / "config.json", dump_config(cfg))  # a kill mid-write keeps the old one

    def _build(self, saved: dict) -> dict:
        """Start every role; returns the controller state restored (``saved``, or an older checkpoint's
        when the learners could not load the chosen one)."""
        cfg = self.cfg
        # the prompts first: a data file that cannot be read, or prompts the model's context cannot hold,
        # are said before the cluster and the model load
        fitted = fit_dataset_prompts(build_prompt_source(cfg.data.task, cfg.seed), self.model_dir, cfg)
        self._skipped_prompts = {"skipped_overlong": len(fitted.skipped)} if fitted.skipped else {}
        self.sampler = PromptSampler(fitted.source, cfg.seed)
        plan = plan_placement(cfg, None)
        try:
            cluster.connect(cfg.ray, num_cpus=required_cpus(plan))
        except SystemExit as exc:  # ray.init's own SIGTERM handler exits while it starts the cluster
            raise as_terminated(exc) from None
        terminate_raises(start=False)  # again: ray.init replaced it
        check_placeable(cfg, ray.cluster_resources())
        roles = {r.role: r for r in plan_placement(cfg, ray.cluster_resources())}
        rollout_cls, learner_cls = self.actor_classes
        self.learners = LearnerGroup(cfg, self.model_dir, roles["learner_rank"], learner_cls, meet=False)
        pins = run_state.fp8_kernel_pins(self.run_dir) if self.ckpt is not None else {}
        self._tmp = make_run_temp()  # the service's and the workers' TMPDIR (actors/run_temp.py)
        self.pool = RolloutPool(cfg, self.model_dir, roles["rollout_worker"], rollout_cls, fp8_kernel_pins=pins,
                                tmp_dir=self._tmp)
        first_workers = self.pool.launch_first(cfg.rollout.num_workers) if not gpu_shared(roles) else None
        if self.ckpt is None:  # a new run: the service starts while the ranks load (6 s alone, 2-core AMD EPYC)
            self._start_service(saved)
        self.learners.meet()  # the workers launched above start meanwhile (on a GPU a rank may share: after)
        self.buffer = TrajectoryBuffer(cfg.async_.max_lag)
        self.transport = build_transport(cfg, self.learners)
        if self.ckpt is not None:  # every check of the checkpoint before the service opens the W&B run
            saved = self._restore(saved)
            self._start_service(saved)
        service_held = self.learners.use_service(self.service)
        published = (0, None)
        if self.ckpt is not None:
            ray.get(self.service.load_state_dict.remote(saved["correction"]))
            published = (self.step, self.transport.publish(self.learners, self.step))
        self.state = SharedState(self.step, published)
        self.pool.start(cfg.rollout.num_workers, first_workers)
        # built beside the workers: the first step need not wait for its imports (5.9 s of a simulated run's
        # first step on a 2-core AMD EPYC VM), and a service that cannot start fails the start, not step 1
        ray.get(self.service.ready.remote())
        gather([service_held])
        log.warning("rollout workers up: %s", self.pool.summary())
        self._write_rollout_workers()
        self.pool.on_ready = self._write_rollout_workers  # replacements and scaled-up workers too
        self.rollout = RolloutLoop(cfg, self.pool, self.sampler, self.buffer, self.state, self.transport)
        self.control = create_control(self.run_dir, cfg, roles["rollout_worker"])
        self.rollout.control = self.control
        return saved

    def _start_service(self, saved: dict) -> None:
        """Create the correction service (not awaited: ``ready`` answers once it is built), on the driver's
        node (which may offer no CPU, e.g. a KubeRay head with num-cpus 0): it writes the run directory."""
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.service = CorrectionService.options(
            num_cpus=0, scheduling_strategy=here, runtime_env=cluster.actor_env(TMPDIR=self._tmp),
        ).remote(self.cfg, str(self.run_dir), self.model_dir, saved.get("wandb_run_id"), self._wandb_sent_through)

    def _write_rollout_workers(self) -> None:
        """``rollout_workers.json``: every worker that became ready so far, and the run's FP8 kernel pins."""
        run_state.write_rollout_workers(self.run_dir, self.pool.workers_record())

    def _restore(self, saved: dict) -> dict:
        """Load the learner half of ``self.ckpt`` (falling back to an older checkpoint when the learners
        refuse it: ``actors.run_checkpoint.load_learner_half``), then the controller half. Returns the
        controller state used."""
        self.ckpt, saved = load_learner_half(self.learners, self.run_dir, self.ckpt, saved)
        self.step = saved["step"]
        restore_controller(saved, self.sampler, self.buffer, self.cfg.rollout.group_size)
        self.nothing_kept.load_state_dict(saved.get("guards", {}).get("nothing_kept"))
        return saved

    def run(self) -> dict:
        console = ConsoleSink(self.cfg.max_steps, self.step) if self.cfg.report.console else None
        # held through finish() too: a SIGTERM there (a scheduler's second one) must not cut the final
        # checkpoint or the report short (Ray's driver handler would exit at once)
        restore_signals = stop_on_signals(self.stop_requested)
        record: dict = {}
        try:
            self.rollout.thread.start()
            self._rollout_since = RolloutSince(self.state)
            self._completed_at = time.perf_counter()
            try:
                while self._queued is not None or (self.step < self.cfg.max_steps
                                                   and not self.stop_requested.is_set()):
                    done = self.train_one_step()
                    if done is None:  # stopped (SIGTERM) while waiting for a batch: no step was started
                        break
                    record = done
                    if console:
                        console.log(self.step, record)
                    due = self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0
                    if due or self._checkpoint_owed:  # skipped for a non-finite step: at the next finite one
                        self._checkpoint_owed = self.save_checkpoint() is None
            except BaseException as exc:
                self.rollout.stop.set()  # the run failed: no worker is replaced from now on
                self._write_ledger(failed=True)
                if isinstance(exc, REPORTED_FAILURES):
                    self._report_failed_run()
                raise
            finally:
                if console:
                    console.close()
            try:
                self.finish()
            except BaseException:  # the drain or the final checkpoint: the counts as they stand
                self._write_ledger(failed=True)
                raise
        finally:
            restore_signals()
        return record

    def train_one_step(self) -> dict | None:
        """Complete one step: submit it (unless it was queued ahead), queue the next one behind it when
        its batch is ready before this one ends, wait for this one, publish its weights; the record
        goes to the correction service without waiting. Returns the step's flat metrics, or None when
        a stop was requested while waiting for its batch (e.g. no rollout worker left: ``aisrl scale
        --workers 0``, a replacement that does not come up), so SIGTERM never waits for a batch."""
        current = self._queued or self._submit(self.step, give_up=self.stop_requested.is_set)
        self._queued = None
        if current is None:
            return None
        if self._may_queue_after(current.step):
            ended = current.pending.on_done(self.state.wake)  # the wait below sleeps until a batch or this
            self._queued = self._submit(current.step, give_up=lambda: ended.is_set() or self.stop_requested.is_set(),
                                        ahead=True)
        return self._complete(current)

    def _may_queue_after(self, step: int) -> bool:
        """With ``async.queue_ahead``, a next step may wait in the learners' queue behind ``step`` unless
        the run ends or checkpoints after ``step`` (the learners must then be idle at that version), or
        the pipeline is synchronous (its batch needs the weights ``step`` produces)."""
        ckpt = self._checkpoint_owed or (self.cfg.checkpoint_every and step % self.cfg.checkpoint_every == 0)
        return (self.cfg.async_.queue_ahead and self.cfg.async_.max_lag > 0 and step < self.cfg.max_steps
                and not ckpt and not self.stop_requested.is_set())

    def _submit(self, version: int, give_up, ahead: bool = False) -> "SubmittedStep | None":
        """Take the batch trained at ``version``, put it, start the step on every rank (not awaited).
        None once ``give_up()`` holds before the batch is ready (checked every 50 ms when queueing
        ``ahead`` behind the running step, else every second: a stop request)."""
        groups, waited = take_batch(self.cfg, self.buffer, self.sampler, self.state, version, self.rollout, give_up,
                                    poll_s=0.05 if ahead else 1.0, warn=not ahead)
        if not groups:
            return None
        batch = collate_groups(groups, SCALE_BY_STD[self.cfg.learner.advantage])
        pending = self.learners.submit(ray.put(batch), version + 1)
        # offered now, while the step runs: a worker adopts it the moment the object exists, without a
        # round trip through this driver after the step (``DivergenceGuard`` stops a diverging run)
        self.state.publish(version + 1, pending.weights)
        # queued ahead, the learner never waited for this batch: it was ready before the previous step ended
        return SubmittedStep(version + 1, groups, batch, 0.0 if ahead else waited, ahead, pending)

    def _complete(self, sub: "SubmittedStep") -> dict:
        outcome = sub.pending.result(self.cfg.report.stall_warning_s, f"step {sub.step}")
        self.transport.step_done(outcome.weight_sync)
        self.state.finished(sub.step)
        with self.state.cond:
            self.sampler.mark_trained([g.prompt.prompt_id for g in sub.groups])
            ledger = {**self.sampler.counts(), **self._skipped_prompts}
        self.step = sub.step
        now = time.perf_counter()
        record = step_record(sub, outcome, ledger, self._rollout_since, self.pool, self.cfg.async_.max_lag,
                             step_s=now - self._completed_at)
        self._completed_at = now
        self.records.check()  # the earlier records the service could not write stop the run
        self.records.sent(self.step, self.service.finish_step.remote(record))  # the sinks write meanwhile
        self.control.report.remote({"step": self.step, "max_steps": self.cfg.max_steps,
                                    "workers_ready": record.workers_ready, "reward/mean": record.reward_mean})
        # after its record (the step that stops a run is in metrics.jsonl); its weights were offered when
        # it was submitted, so a worker may have sampled with them before the run stops
        self.divergence.observe(self.step, outcome.learner)
        self.nothing_kept.observe(self.step, outcome.correction)
        return record.metrics()

    def save_checkpoint(self) -> Path | None:
        """Checkpoint both halves; a step that was non-finite is not checkpointed (None). The checkpoint
        a run resumed from (or saved last) is not written again: a preemption in the middle of
        rewriting it would tear the newest complete checkpoint."""
        if self.divergence.streak:
            log.warning("step %d had a non-finite loss, gradient or log-prob: not checkpointed", self.step)
            return None
        ckpt = run_state.checkpoint_dir(self.run_dir, self.step)
        if self._saved_step == self.step:
            return ckpt
        # a controller half left from an abandoned attempt must not pair with the learner half written now
        (ckpt / run_state.CONTROLLER_FILE).unlink(missing_ok=True)
        self.records.check(wait=True)  # every record up to this step written, or no checkpoint
        self.learners.save_checkpoint(run_state.learner_dir(ckpt))
        # the service's state before the lock: the rollout loop waits on that lock, and these calls
        # queue behind the step records the service is still writing
        correction = ray.get(self.service.state_dict.remote())
        wandb_run_id = ray.get(self.service.wandb_run_id.remote())
        with self.state.cond:
            state = controller_snapshot(self.step, self.sampler, self.buffer, correction, wandb_run_id,
                                        guards={"nothing_kept": self.nothing_kept.state_dict()})
        controller_state.save_controller_state(ckpt, state)
        self._saved_step = self.step
        return ckpt

    def finish(self) -> None:
        """Drain the rollout loop, checkpoint (buffer kept: a resumed run trains those groups as the
        uninterrupted run would have), then account for the unused groups and the prompts still in
        flight in the final ledger (dropped, with their reasons)."""
        self.rollout.drain(timeout=60)
        self.save_checkpoint()  # not twice for a step; step 0's too (a stop before step 1: --resume continues)
        with self.state.cond:
            for g in self.buffer.groups():
                self.sampler.mark_dropped(g.prompt.prompt_id, "unused_at_end")
            self.buffer.restore([])
            self.sampler.drop_in_flight("in_flight_at_end")  # lost or still running at the drain's end
        self._write_ledger()  # first: closing the service finishes W&B, which may wait for uploads
        self.records.check(wait=True)  # the last records too (no checkpoint may have waited for them)
        self.report_path = ray.get(self.service.write_report.remote(self.step))
        self._close_service()

    def _report_failed_run(self) -> None:
        """The last batch's dump and the report of a run that a guard stopped (nothing kept, diverged): where
        the report matters most (a review: such a run had none, though every run that trained a step is said
        to have one). Best effort: a report that fails or hangs is said, and the run's own error stands."""
        try:
            self.report_path = ray.get(self.service.write_report.remote(self.step), timeout=120)
            if self.report_path:
                log.warning("the mismatch report of the stopped run: %s", self.report_path)
        except Exception as exc:  # noqa: BLE001 - the guard's error is what the run fails with
            log.warning("no report for the stopped run (%s: %s)", type(exc).__name__, str(exc)[:200])

    def _write_ledger(self, failed: bool = False) -> None:
        with self.state.cond:
            counts = {**self.sampler.counts(), **self._skipped_prompts}
        run_state.write_ledger(self.run_dir, counts, failed)

    def _close_service(self, timeout_s: float | None = None) -> None:
        """Close the service's sinks once (after every record it was sent: one caller's calls run in
        order): the last records reach metrics.jsonl and W&B is finished."""
        if not getattr(self, "_service_closed", False):
            self._service_closed = True
            ray.get(self.service.close.remote(), timeout=timeout_s)

    def shutdown(self) -> None:
        restore_deferred = defer_signals()
        try:
            self._stop_parts()
        finally:
            try:
                self._release_lock()
            finally:
                restore_deferred()
                self._restore_signals()

    def _stop_parts(self) -> None:
        rollout = getattr(self, "rollout", None)
        if rollout is not None and rollout.thread.is_alive():
            rollout.stop.set()
            rollout.thread.join(timeout=30)
        if getattr(self, "control", None) is not None:
            ray.kill(self.control, no_restart=True)
            remove_control_file(self.run_dir)
        for part in ("pool", "learners"):
            obj = getattr(self, part, None)
            if obj is not None:
                obj.shutdown()
        if getattr(self, "service", None) is not None:
            try:  # a failing run: the records already sent still reach the sinks, W&B is finished
                self._close_service(timeout_s=30)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                log.warning("the correction service did not close (%s); its last records may be lost",
                            type(exc).__name__)
            ray.kill(self.service, no_restart=True)
        if getattr(self, "_tmp", None) is not None:
            remove_run_temp(self._tmp)

