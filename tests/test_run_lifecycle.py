"""The run's lifecycle at its edges (found by a probe of real runs, 2026-11-27): a step record the
correction service cannot write stops the run; SIGTERM during start-up cleans up like Ctrl-C; a
remote failure is one line on the console; ``aisrl scale`` has a ceiling; a run directory whose parts
are of the wrong kind is refused before anything starts."""

import logging
import os
import signal
import time
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from actors.cli import app, failure_text
from actors.control import RunControl
from actors.remote_errors import remote_error
from actors.step_records import RecordsInFlight, RecordsLostError
from actors.stop_signals import Terminated, terminate_raises
from system import run_state
from system.config import ConfigError, resolve_config
from system.config.rollout import MAX_ROLLOUT_WORKERS


@ray.remote(num_cpus=0)
class _Sink:
    def write(self, step: int) -> int:
        if step == 3:
            raise IsADirectoryError(21, "Is a directory", "/run/metrics.jsonl")
        if step == 5:
            raise ValueError("bad shard")
        return step


def test_a_record_the_service_cannot_write_stops_the_run(loopback_ray):
    """The probe's run with metrics.jsonl replaced by a directory wrote no record, published
    checkpoints 4, 6, 8 and exited 0; Ray only printed 'Unhandled error' blocks."""
    sink, records = _Sink.remote(), RecordsInFlight()
    for step in (1, 2):
        records.sent(step, sink.write.remote(step))
    records.check(wait=True)  # both written: nothing raised, nothing left
    records.sent(3, sink.write.remote(3))
    records.sent(4, sink.write.remote(4))
    with pytest.raises(RecordsLostError, match=r"the record of step 3 could not be written \(IsADirectoryError: .*"
                                               r"metrics\.jsonl"):
        records.check(wait=True)


def test_sigterm_during_start_up_raises_like_ctrl_c_and_the_cli_says_so(monkeypatch):
    """SIGTERM before the loop started ran Ray's stack-dumping handler: exit 134, actors orphaned."""
    before = signal.getsignal(signal.SIGTERM)
    restore = terminate_raises()
    try:
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at the next bytecode, long before this ends
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) == before

    import actors.trainer as trainer_module

    def stopped_at_start(*args, **kwargs):
        raise Terminated("SIGTERM during start-up")

    monkeypatch.setattr(trainer_module, "Trainer", stopped_at_start)
    monkeypatch.setenv("AISRL_VERBOSE", "1")
    result = CliRunner().invoke(app, ["train", "max_steps=1", "output_dir=/tmp/never-made-by-this-test"])
    assert result.exit_code == 143
    assert "stopped by SIGTERM during start-up: nothing was trained" in " ".join(result.output.split())


@pytest.mark.parametrize("sig, steps, code, said", [
    (signal.SIGTERM, 2, 143, "stopped by SIGTERM after step 2 of 5: 2 steps in {out}; final reward/mean 0.250; "
                             "report none (no dump yet: report.dump_every=0); continue with aisrl train --resume {out}"),
    (signal.SIGINT, 2, 130, "stopped by Ctrl-C after step 2 of 5: 2 steps in {out}"),
    (signal.SIGTERM, 5, 0, "done: 5 steps in {out}"),  # the signal came during the last step: the run is whole
    (None, 5, 0, "done: 5 steps in {out}")])
def test_a_run_a_signal_stopped_after_a_step_says_so_and_exits_as_signalled(monkeypatch, tmp_path, sig, steps,
                                                                            code, said):
    """A probe: SIGTERM (or a first Ctrl-C) ended the run after its step with "done:" and exit 0, as a
    finished run ends. A stand-in trainer takes the signal as ``Trainer.run`` does (``stop_on_signals``)."""
    import threading

    import actors.trainer as trainer_module
    from actors.stop_signals import stop_on_signals

    class SignalledRun:
        def __init__(self, cfg, **kwargs):
            self.step, self.report_path = 0, None

        def run(self):
            restore = stop_on_signals(threading.Event())
            try:
                if sig is not None:
                    os.kill(os.getpid(), sig)
            finally:
                restore()
            self.step = steps
            return {"reward/mean": 0.25}

        def shutdown(self):
            pass

    monkeypatch.setattr(trainer_module, "Trainer", SignalledRun)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "max_steps=5", f"output_dir={out}", "report.dump_every=0"])
    assert result.exit_code == code, result.output
    assert said.format(out=out) in " ".join(result.output.split()), result.output


def test_sigterm_inside_ray_init_and_during_cleanup(caplog):
    """A review: ``ray.init`` installs its own SIGTERM handler (``sys.exit(15)``) while it starts the
    cluster, so a SIGTERM then ended the CLI with exit 15 and no word; and after the loop the start-up
    handler raised inside the shutdown, leaving actors and the W&B run behind."""
    from actors.stop_signals import as_terminated, defer_signals, sigterm_received

    before = signal.getsignal(signal.SIGTERM)  # the test process's own, given back at the end
    try:
        terminate_raises()  # a fresh start: no SIGTERM noted
        assert not sigterm_received()
        assert isinstance(as_terminated(SystemExit(signal.SIGTERM)), Terminated) and sigterm_received()
        other = SystemExit(2)
        assert as_terminated(other) is other
        restore = defer_signals()
        os.kill(os.getpid(), signal.SIGTERM)  # noted, nothing raised: the cleanup goes on
        time.sleep(0.2)
        restore()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert "SIGTERM: finishing the shutdown first" in caplog.text


def test_a_remote_value_error_is_a_training_failure_in_one_line(loopback_ray, monkeypatch):
    """A review: a remote ValueError (what ray.get raises is a RayTaskError that is also a ValueError)
    was taken for a config error: exit 2, the 60-line remote traceback, no resume hint."""
    import actors.trainer as trainer_module

    def remote_value_error(*args, **kwargs):
        ray.get(_Sink.remote().write.remote(5))

    monkeypatch.setattr(trainer_module, "Trainer", remote_value_error)
    monkeypatch.delenv("AISRL_VERBOSE", raising=False)
    result = CliRunner().invoke(app, ["train", "max_steps=1", "output_dir=/tmp/never-made-by-this-test"])
    assert result.exit_code == 1
    assert "training failed: ValueError: bad shard (in _Sink.write)" in " ".join(result.output.split())
    # the session was this module's, not the command's: it is still there (aisrl train ends only its own)
    assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 8


def test_a_remote_failure_is_one_line_naming_the_actor_method(monkeypatch):
    monkeypatch.delenv("AISRL_VERBOSE", raising=False)
    inner = ray.exceptions.RayTaskError("LearnerRank.step", "Traceback ...\n" * 60,
                                        FileExistsError(17, "File exists", "/run/dumps"))
    outer = ray.exceptions.RayTaskError("LearnerGroup.step", "Traceback ...\n" * 60, inner)
    assert failure_text(outer) == "FileExistsError: [Errno 17] File exists: '/run/dumps' (in LearnerRank.step)"
    assert failure_text(RuntimeError("plain")) == "plain"
    monkeypatch.setenv("AISRL_VERBOSE", "1")
    assert failure_text(outer) == str(outer)  # everything with --verbose


@ray.remote(num_cpus=0)
class _Service:
    def process(self):
        raise FileExistsError(17, "File exists", "/run/dumps")


@ray.remote(num_cpus=0)
class _Rank:
    def step(self, service):
        return ray.get(service.process.remote())


def test_an_error_raised_on_through_a_second_actor_names_the_actor_that_raised_it(loopback_ray):
    """Found by a probe: a dumps directory the correction service could not write failed the run
    "(in LearnerRank.step)": rank 0 calls the service, and Ray hands the driver one RayTaskError
    whose text lists both tasks (``ray::_Rank.step()`` first, then ``ray::_Service.process()``)."""
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(_Rank.remote().step.remote(_Service.remote()))
    assert remote_error(err.value) == "FileExistsError: [Errno 17] File exists: '/run/dumps' (in _Service.process)"


def test_scale_and_the_worker_count_have_a_ceiling(tmp_path):
    """``aisrl scale DIR --workers 99999999999999999999`` was accepted: the rollout loop launched
    actors until the driver and the GCS held 6 GB each, and SIGTERM could no longer stop the run."""
    board = RunControl.__ray_metadata__.modified_class(1, ceiling=8)
    assert board.set_workers(8) == 8 and board.desired() == 8
    for bad in (9, -1, 10**20):
        with pytest.raises(ValueError, match=r"--workers must be in 0 \.\. 8 \(rollout\.max_workers"):
            board.set_workers(bad)
    result = CliRunner().invoke(app, ["scale", str(tmp_path), "--workers", "99999999999999999999"])
    assert result.exit_code == 2 and str(MAX_ROLLOUT_WORKERS) in result.output
    for key in ("rollout.num_workers", "rollout.max_workers"):
        with pytest.raises(ConfigError, match=rf"{key}: Input should be less than or equal to 4096"):
            resolve_config([], [f"{key}=5000"])


def test_scale_says_when_the_new_workers_do_not_fit(loopback_ray, monkeypatch, tmp_path):
    """A real board in the module's 8-CPU cluster, as a run on a private cluster creates it; its
    workers take a resource the cluster lacks, so none of the 5 new ones fits. Scaling down says nothing."""
    import actors.control

    facts = {"private_cluster": True, "worker_needs": {"CPU": 1.0, "rollout": 1.0}}
    board = RunControl.remote(1, 8, facts)
    monkeypatch.setattr(actors.control, "find_control", lambda run_dir, address: board)
    up = CliRunner().invoke(app, ["scale", str(tmp_path), "--workers", "6"])
    said = " ".join(up.output.split())
    # before the run's first step the board has no progress: said so (it printed "job at step 0/?, ? ready now")
    assert up.exit_code == 0 and "rollout workers -> 6; the job has not finished a step yet" in said, said
    assert "room for 0 more now (free: CPU 8, rollout 0; each worker takes CPU 1, rollout 1); the other 5 wait: " \
           "this run's private cluster never grows" in said, said
    ray.get(board.report.remote({"step": 3, "max_steps": 10, "workers_ready": 1, "reward/mean": 0.5}))
    down = CliRunner().invoke(app, ["scale", str(tmp_path), "--workers", "2"])
    said = " ".join(down.output.split())
    assert down.exit_code == 0 and "room for" not in said
    assert "rollout workers -> 2; job at step 3/10, 1 ready now" in said, said
    over = CliRunner().invoke(app, ["scale", str(tmp_path), "--workers", "9"])  # above the board's ceiling, 8
    said = " ".join(over.output.split())
    assert over.exit_code == 2 and said.startswith("error: --workers must be in 0 .. 8 (rollout.max_workers"), said
    assert "ValueError" not in said and "RunControl" not in said  # the user's count, not a failure of the board
    ray.kill(board)


@pytest.mark.parametrize("name, make", [("dumps", lambda p: p.write_text("x")),
                                        ("metrics.jsonl", lambda p: p.mkdir()),
                                        ("checkpoints", lambda p: p.write_text("x"))])
def test_a_run_directory_with_a_part_of_the_wrong_kind_is_refused_before_anything_starts(tmp_path, name, make):
    """The probe's resume with ``dumps`` a file passed --dry-run, started the cluster and failed at the
    first dump with a 60-line remote traceback."""
    make(tmp_path / name)
    with pytest.raises(ValueError, match=rf"{name} is a (file|directory), not a (directory|file)"):
        run_state.check_run_parts(tmp_path)
    with pytest.raises(ValueError, match=rf"{name} is a"):
        run_state.checkpoint_to_resume(tmp_path, max_steps=10)


def test_a_control_file_that_cannot_be_removed_is_said_and_the_stop_goes_on(tmp_path, monkeypatch, caplog):
    """Found by a probe: a run directory made unwritable mid-run (``chattr +i``) failed the run with a clear
    line, then the stop's removal of ``control.json`` raised a second PermissionError whose traceback
    skipped the rest of the stop (workers, learners, the service's last records and W&B, its temp dir)."""
    from pathlib import Path

    from actors.control import remove_control_file

    (tmp_path / "control.json").write_text("{}")

    def refuse(self, missing_ok=False):
        raise PermissionError(1, "Operation not permitted", str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    with caplog.at_level(logging.WARNING):
        remove_control_file(tmp_path)  # no raise
    assert "could not remove" in caplog.text and "Operation not permitted" in caplog.text


def test_an_actor_that_died_in_its_creation_says_the_last_exception_not_the_traceback():
    """Found by probe 10: an architecture vLLM does not support (XGLM) ended with one line cut at 400
    characters inside the worker's traceback, before the cause; now the line keeps the traceback's first
    line and the last exception raised with its details (a pydantic error's are on the lines after it)."""
    died = RuntimeError(
        "The actor died because of an error raised in its creation task, ray::RolloutWorker.__init__() "
        "(pid=7, ip=127.0.0.1)\n" + "Traceback (most recent call last):\n" + "".join(
            f'  File "/venv/lib/python3.11/site-packages/vllm/m{i}.py", line {i}, in f{i}\n    g{i}()\n    ^^^^\n'
            for i in range(40))
        + "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, Model architectures ['XGLMForCausalLM'] are not supported for now. [type=value_error]\n")
    said = remote_error(died)
    assert said.startswith("The actor died because of an error raised in its creation task, "
                           "ray::RolloutWorker.__init__() (pid=7, ip=127.0.0.1): pydantic_core._pydantic_core."
                           "ValidationError: 1 validation error for ModelConfig Value error, Model architectures "
                           "['XGLMForCausalLM'] are not supported"), said
    assert "File " not in said and len(said) <= 404
    plain = RuntimeError("weights of version 3 lack lm_head.weight")  # no traceback: unchanged
    assert remote_error(plain) == "weights of version 3 lack lm_head.weight"


# ray 2.60's text when an actor's process is SIGKILLed during a task (``str(ActorDiedError)``)
DIED = ("The actor died unexpectedly before finishing this task.\n\tclass_name: LearnerRank\n\tactor_id: "
        "39bfbb0ffa2076f8b09d805101000000\n\tpid: 21316\n\tnamespace: 0f0001a1-c867-4ee6-b7b8-9e9528fa39c0\n\t"
        "ip: 127.0.0.1\nThe actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
        "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common "
        "causes include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray stop "
        "--force was called, or (3) the worker crashed unexpectedly due to SIGSEGV or another unexpected error.")


def test_a_lost_ranks_process_is_said_in_a_short_line():
    """A probe: a learner rank killed by a signal failed the run with ~420 characters of Ray's text (the
    actor's ids, namespace, a paragraph of possible causes); the exit type and detail are what it says."""
    from actors.learner_worker import _lost
    from actors.remote_errors import process_death

    assert process_death(DIED) == ("its process (pid 21316 on 127.0.0.1) died: SYSTEM_ERROR, Worker unexpectedly "
                                   "exits with a connection error code 2 (killed, out of memory, or a crash)")
    assert process_death("The actor died because it was killed by `ray.kill`.") is None  # not a process death
    user = DIED.replace("SYSTEM_ERROR", "INTENDED_USER_EXIT").replace("unexpectedly exits with a connection error "
                                                                       "code 2", "exits")
    assert process_death(user) == "its process (pid 21316 on 127.0.0.1) died: INTENDED_USER_EXIT, Worker exits"
    refs = ["rank0-ref", "rank1-ref"]
    lost = _lost(refs, "rank0-ref", ray.exceptions.ActorDiedError())
    assert str(lost).startswith("learner rank 0 of 2 was lost (ActorDiedError: ")
    said = str(_lost(refs, "rank1-ref", RuntimeError(DIED)))
    assert said == ("learner rank 1 of 2 was lost (RuntimeError: its process (pid 21316 on 127.0.0.1) died: "
                    "SYSTEM_ERROR, Worker unexpectedly exits with a connection error code 2 (killed, out of "
                    "memory, or a crash)); the sharded learner cannot continue without it, so the run stops")


def test_a_broken_rollout_loop_is_said_with_its_cause_and_actor_method(loopback_ray):
    """Found by a probe: a learner rank's OSError that ended the rollout loop reached the console as
    "the rollout loop failed: RayTaskError(OSError)()": no message, no actor method."""
    from types import SimpleNamespace

    from actors.shared_state import SharedState, take_batch

    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(_Rank.remote().step.remote(_Service.remote()))
    rollout = SimpleNamespace(error=err.value)
    with pytest.raises(RuntimeError) as failed:
        take_batch(resolve_config([], []), None, None, SharedState(0, (0, None)), 0, rollout)
    assert str(failed.value) == ("the rollout loop failed: FileExistsError: [Errno 17] File exists: '/run/dumps' "
                                 "(in _Service.process)")
    with pytest.raises(RuntimeError, match=r"^the rollout loop failed: KeyError: 'w'$"):
        take_batch(resolve_config([], []), None, None, SharedState(0, (0, None)), 0, SimpleNamespace(error=KeyError("w")))


@pytest.mark.parametrize("text, says", [
    ("", "not readable as a run's control file (Expecting value"),
    ("{}", "not a run's control file (gcs_address, actor missing or not text)"),
    ("[]", "not a run's control file (gcs_address, actor missing or not text)"),
    ('{"gcs_address": null, "actor": "a"}', "not a run's control file (gcs_address missing or not text)"),
    ('{"gcs_address": 6379, "actor": "a"}', "not a run's control file (gcs_address missing or not text)"),
    ('{"gcs_address": "127.0.0.1:1", "actor": "a", "auth_mode": null}', "not a run's control file (auth_mode missing or not text)"),
])
def test_a_damaged_control_file_is_refused_naming_it(tmp_path, text, says):
    """Found by a probe: `aisrl scale` on a control.json of {} or [] or a null address ended in a KeyError,
    TypeError or AttributeError traceback (exit 1); an empty one said the JSON error without the file."""
    (tmp_path / "control.json").write_text(text)
    result = CliRunner().invoke(app, ["scale", str(tmp_path), "--workers", "2"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and f"{tmp_path / 'control.json'}: {says}" in said, said


def test_a_run_stopped_before_its_first_step_leaves_a_checkpoint_to_resume(loopback_ray, tmp_path):
    """Found by a probe: a SIGTERM before step 1 (a scheduler preempting while the first batch is still
    generated) ended "done: 0 steps" with exit 0 and no checkpoint at the default checkpoint_every 10
    (step 0 is a multiple of it), so `--resume` was refused and a new run into the directory too."""
    from sim_actors import SimulatedRolloutWorker
    from sim_learner import SimulatedLearnerRank

    from actors.trainer import Trainer
    from system import controller_state

    cfg = resolve_config([], [f"output_dir={tmp_path / 'run'}", "max_steps=4", "checkpoint_every=2",
                              "prompts_per_step=4", "rollout.group_size=2", "model.warm_start_steps=0",
                              "report.wandb.mode=disabled", "report.console=false", "report.dump_every=0"])
    trainer = Trainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(seconds_per_call=0.05),
                      learner_cls=SimulatedLearnerRank.actor_class(train_seconds=0.01, payload_params=1000))
    trainer.stop_requested.set()  # what SIGTERM sets
    try:
        trainer.run()
    finally:
        trainer.shutdown()
        ray.kill(trainer.service, no_restart=True)
    assert trainer.step == 0
    ckpt = run_state.checkpoint_dir(tmp_path / "run", 0)  # (the simulated ranks' half is no DCP checkpoint:
    assert controller_state.read_controller_state(ckpt)["step"] == 0  # a real resume of it is run by hand)
    assert sorted(p.name for p in Path(run_state.learner_dir(ckpt)).iterdir()) == ["simulated_rank0.json",
                                                                                  "simulated_rank1.json"]


def test_a_failed_run_writes_its_ledger_as_it_stands(loopback_ray, tmp_path):
    """Found by a probe: a failed run wrote no ledger.json (its counts only in metrics.jsonl's ledger/*).
    Step 2 reports a skipped (non-finite) update and learner.max_nonfinite_steps=0 stops the run there;
    the ledger then counts step 1's and step 2's 4 prompts as trained (the failing step's update ran)
    and balances: issued = in flight + buffered + trained + dropped."""
    import json

    from sim_actors import SimulatedRolloutWorker
    from sim_learner import SimulatedLearnerRank

    from actors.trainer import Trainer
    from system.learner.divergence import TrainingDivergedError

    cfg = resolve_config([], [f"output_dir={tmp_path / 'run'}", "max_steps=6", "checkpoint_every=0",
                              "prompts_per_step=4", "rollout.group_size=2", "model.warm_start_steps=0",
                              "learner.max_nonfinite_steps=0", "report.wandb.mode=disabled",
                              "report.console=false", "report.dump_every=0"])
    trainer = Trainer(cfg, rollout_cls=SimulatedRolloutWorker.actor_class(seconds_per_call=0.05),
                      learner_cls=SimulatedLearnerRank.actor_class(train_seconds=0.01, payload_params=1000,
                                                                   nonfinite_versions=(2,)))
    try:
        with pytest.raises(TrainingDivergedError, match="1 consecutive steps"):
            trainer.run()
    finally:
        trainer.shutdown()
        ray.kill(trainer.service, no_restart=True)
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["trained"] == 2 * 4 and ledger["duplicates"] == 0
    assert ledger["issued"] == ledger["in_flight"] + ledger["buffered"] + ledger["trained"] + ledger["dropped"]
    assert ledger["issued"] > ledger["trained"]  # the next batches were being generated when it failed
