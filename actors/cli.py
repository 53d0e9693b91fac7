"""The ``aisrl`` command line: ``train``, ``scale``, ``report``, ``demo-dump``, ``export``, ``submit`` and ``job``."""

import json
import math
import os
import signal
from pathlib import Path

import ray
import typer

from actors.cli_common import expand_home, fail, say, split_args
from actors.cli_jobs import job_app, submit
from actors.remote_errors import remote_error
from system.config import ConfigError, RunConfig, check_output_dir, resolve_config
from system.config.advice import config_warnings
from system.config.environment import apply_environment
from system.config.loading import type_switch_notes
from system.config.paths import check_input_paths, with_absolute_paths
from system.config.resume import resume_config
from system.config.rollout import MAX_ROLLOUT_WORKERS
from system.report.demo_dump import make_demo_dump
from system.report.dump import DumpError, save_dump

app = typer.Typer(add_completion=False, no_args_is_help=True, help="aisrl: asynchronous RL with measured train-inference mismatch.")


def failure_text(exc: BaseException) -> str:
    """What went wrong, for the console: a remote task's own error in one line (``RayTaskError``'s
    text is the whole remote traceback, ~60 lines), which actor method raised it; everything with
    ``--verbose``."""
    if os.environ.get("AISRL_VERBOSE", "") not in ("", "0"):
        return str(exc)
    return remote_error(exc)


def _training_failed(exc: BaseException, run_dir: str) -> None:
    """Exit 1 with the failure in one line and, when there is a checkpoint to continue from, the resume command.
    The calls the failure abandoned (the other ranks' steps, generate calls) end in errors of their
    own during the shutdown; Ray would print each as an "Unhandled error" traceback, so without
    ``--verbose`` those are silenced from here on (Ray reads the variable at every such error)."""
    if os.environ.get("AISRL_VERBOSE", "") in ("", "0"):
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
    say(failure_text(exc), "training failed:", "bold red")
    from system.run_state import latest_run_checkpoint

    if latest_run_checkpoint(run_dir) is not None:  # else --resume would only be refused
        say(f"resume from the last complete checkpoint: aisrl train --resume {run_dir}")
    raise typer.Exit(code=1) from None


def _out_path(value: str) -> Path:
    """``--out``: a path, never the empty string (an unset shell variable: it read as the current directory)."""
    if not value.strip():
        raise typer.BadParameter("empty: give the report's directory")
    return expand_home(Path(value))


def load_run_config(presets: list[str], overrides: list[str], resume: Path | None) -> tuple[RunConfig, list[str]]:
    """The run's config and the console notes on fields a ``type`` switch reset (``type_switch_notes``)."""
    if resume is not None:
        cfg = resume_config(resume, presets, overrides)
        presets = [str(resume / "config.json"), *presets]
    else:
        cfg = resolve_config(presets, overrides)
    return cfg, type_switch_notes(presets, overrides, cfg)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    args: list[str] = typer.Argument(None, help="Presets (configs/*.yaml, applied left to right) and dotted.key=value overrides."),
    dry_run: bool = typer.Option(False, "--dry-run", help='Validate, print {"config": resolved config, "placement": plan} as one JSON object; start nothing.'),
    resume: Path = typer.Option(None, "--resume", callback=expand_home, help="Continue the run in this directory from its last complete checkpoint."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start a new run in an output_dir that holds one, deleting the old run's files."),
    verbose: bool = typer.Option(False, "--verbose", help="Show the libraries' own logs, warnings and progress bars (Ray, vLLM, torch)."),
) -> None:
    """Train: rollout workers, FSDP2 learner and correction service on Ray (a private local cluster unless ray.address is set)."""
    try:
        if resume is not None and overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces it: pass one of them")
        presets, overrides = split_args(args or [])
        # absolute: the actors' working directory is not this one (on a joined cluster, the raylet's)
        cfg, switch_notes = load_run_config(presets, overrides, resume)
        cfg = with_absolute_paths(cfg)
        cfg, env_notes = apply_environment(cfg, os.environ, overrides)
        env_notes = [*switch_notes, *env_notes]
        check_output_dir(cfg.output_dir, "output_dir")
        check_input_paths(cfg)
        from actors.cluster import check_local_dirs
        from system.models.tiny import default_cache_dir

        check_local_dirs(cfg, default_cache_dir())
    except ConfigError as exc:
        fail(str(exc))
    for note in env_notes:  # on stderr: a dry run's stdout stays one JSON document
        say(note, "note:", "yellow")
    if dry_run:
        from system.run_state import (
            check_new_run_dir,
            check_no_replaced_run,
            check_not_nested,
            checkpoint_to_resume,
        )

        try:  # what the run would refuse (only checks: nothing is moved or deleted)
            if resume is not None:
                check_no_replaced_run(cfg.output_dir)
                ckpt, _, skipped = checkpoint_to_resume(cfg.output_dir, cfg.max_steps)
                for reason in skipped:  # on stderr, as the run says it (a probe: the dry run did not)
                    say(f"checkpoint {reason}; falling back to an older one", "warning:", "yellow")
                say(f"the run would resume from {ckpt}", "note:", "yellow")
            elif overwrite:
                check_no_replaced_run(cfg.output_dir)
                check_not_nested(cfg.output_dir)
            else:
                check_new_run_dir(cfg.output_dir, overwrite=False)
        except ValueError as exc:  # CheckpointError is one
            fail(str(exc))
        from actors.placement import dry_run_plan

        try:
            plan = dry_run_plan(cfg)
        except ValueError as exc:  # what the run refuses once its private cluster is up
            fail(str(exc))
        for warning in config_warnings(cfg):  # on stderr: stdout stays one JSON document
            say(warning, "warning:", "yellow")
        print(json.dumps({"config": cfg.model_dump(mode="json", by_alias=True), "placement": plan}, indent=2))
        return
    if verbose:
        os.environ["AISRL_VERBOSE"] = "1"
    from actors.cluster import check_address, quiet_workers, stop_session
    from actors.stop_signals import stopped_by
    from actors.trainer import Trainer

    if cfg.ray.address is not None:  # before the model build: an address nobody answers on fails now
        try:
            check_address(cfg.ray.address)
        except ValueError as exc:
            fail(str(exc))

    quiet_workers()  # this process too: the model build's progress bars, library warnings

    trainer, own_session = None, not ray.is_initialized()  # a caller's session (a notebook's) is theirs to end
    try:
        trainer = Trainer(cfg, resume=resume is not None, overwrite=overwrite)
        last = trainer.run()
    except ray.exceptions.RayError as exc:  # before ValueError: a remote ValueError is both
        _training_failed(exc, cfg.output_dir)
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM before the loop started (stop_signals.Terminated)
        from actors.stop_signals import Terminated, sigterm_received

        _stopped(isinstance(exc, Terminated) or sigterm_received(),
                 "" if trainer is not None else " during start-up: nothing was trained")
    except (RuntimeError, OSError) as exc:  # OSError: a full disk or a file that cannot be written here
        _training_failed(exc, cfg.output_dir)
    finally:
        try:
            if trainer is not None:
                trainer.shutdown()
        finally:
            if own_session:
                stop_session()
    report = trainer.report_path or f"none (no dump yet: report.dump_every={cfg.report.dump_every})"
    summary = (f"{trainer.step} steps in {cfg.output_dir}; final reward/mean {last.get('reward/mean', float('nan')):.3f}; "
               f"report {report}")
    signum = stopped_by()
    if signum is None or trainer.step >= cfg.max_steps:
        say(summary, "done:", "green")
        return
    # stopped after a step (final checkpoint, report, W&B finished), exit status as below: a script tells it
    # from a finished run (a probe: both ended "done:", exit 0)
    _stopped(signum == signal.SIGTERM, f" after step {trainer.step} of {cfg.max_steps}: {summary}; "
                                       f"continue with aisrl train --resume {cfg.output_dir}")


def _stopped(sigterm: bool, how: str) -> None:
    """``stopped by SIGTERM<how>`` (or Ctrl-C), and the exit status a shell gives a process that signal
    stopped: 143 (SIGTERM) or 130 (Ctrl-C)."""
    say(f"by {'SIGTERM' if sigterm else 'Ctrl-C'}{how}", "stopped", "bold red")
    raise typer.Exit(code=143 if sigterm else 130)


@app.command()
def scale(
    run_dir: Path = typer.Argument(..., callback=expand_home, help="The running job's output_dir (holds control.json)."),
    workers: int = typer.Option(..., "--workers", min=0, max=MAX_ROLLOUT_WORKERS,
                                help="Rollout workers to run from now on (at most rollout.max_workers, or 4096)."),
    address: str = typer.Option(None, "--address", help="Cluster address (default: the one in control.json)."),
) -> None:
    """Change the number of rollout workers of a running job; training continues."""
    from actors.control import find_control
    from actors.placement import scale_up_note

    try:
        control = find_control(run_dir, address)
        before = ray.get(control.status.remote())["desired_workers"]
        free = ray.available_resources()  # before the run's loop starts placing the new workers
        ray.get(control.set_workers.remote(workers))
        status = ray.get(control.status.remote())
    except ValueError as exc:  # a RayTaskError of the board's ValueError is one too
        refused = getattr(exc, "cause", None)  # the board refusing the count: the user's error, its message only
        fail(str(refused) if isinstance(refused, ValueError) else failure_text(exc))
    progress = (f"job at step {status['step']}/{status['max_steps']}, {status['workers_ready']} ready now"
                if {"step", "max_steps", "workers_ready"} <= status.keys() else "the job has not finished a step yet")
    say(f"rollout workers -> {workers}; {progress}")
    if workers > before and "worker_needs" in status:  # a board of a run started before it had facts: none
        note = scale_up_note(workers - before, status["worker_needs"], free,
                             bool(status.get("private_cluster")))
        if note:
            say(note, "warning:", "yellow")


@app.command()
def report(
    dump: Path = typer.Argument(..., callback=expand_home, help="A batch dump (.npz, CORRECTION_SPEC.md section 6)."),
    out: str = typer.Option(..., "--out", "-o", callback=_out_path, help="Directory for summary.json, samples.json, report.html."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a report already in --out."),
) -> None:
    """Write the mismatch report of one batch dump.

    A report already in ``--out`` is kept (exit 2) unless ``--overwrite``, as ``demo-dump`` and
    ``export`` keep what they would replace (a probe: a second report replaced the first silently).

    Exit 2 with a message naming the file and the key on a dump that cannot be used (not an
    .npz archive, a missing key, mismatched shapes, no rows, a negative lag). Log-probs above
    zero stay valid tokens and are counted (``logp_above_zero`` in summary.json, and said).
    A batch without a valid token (all masked, or every log-prob non-finite) is legal: the
    report is written with every diagnostic null, and the exit code is 0.
    """
    from system.report.mismatch_report import REPORT_FILES, summary_line, write_report

    try:
        check_output_dir(out, "--out")
    except ConfigError as exc:
        fail(str(exc))
    held = sorted(name for name in REPORT_FILES if os.path.isfile(os.path.join(out, name)))
    if held and not overwrite:
        fail(f"--out {out} already holds a report ({', '.join(held)}): pass --overwrite to replace it")
    try:
        summary = write_report(dump, out)
    except DumpError as exc:
        fail(str(exc))
    except OSError as exc:  # writing the report: a name taken by a directory, a read-only place, a full disk
        fail(f"--out {out}: cannot write the report ({exc.strerror or type(exc).__name__}"
              f"{': ' + str(exc.filename) if exc.filename else ''})")
    say(f"to {out}/report.html: {summary_line(summary)}", "report written", "green")
    import gc

    gc.freeze()  # the process ends here: exit then skips collecting torch's import-time objects (~0.3 s)


@app.command("demo-dump")
def demo_dump(
    path: Path = typer.Argument(..., callback=expand_home, help="Where to write the .npz."),
    sequences: int = typer.Option(64, min=1, help="Responses in the batch."),
    max_len: int = typer.Option(48, min=1, help="Padded response length."),
    sigma: float = typer.Option(0.05, min=0.0, help="Per-token log-ratio noise at lag 0 (grows with lag)."),
    seed: int = typer.Option(0, min=0, help="Random seed."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing file at PATH."),
) -> None:
    """Write a synthetic batch dump with a controlled mismatch (for trying the report).

    Exit 2 with a message on a path that cannot be written, an existing file (unless --overwrite: it may
    be a run's dump) or a batch too large to build (over 10^8 positions)."""
    if not math.isfinite(sigma):
        fail(f"--sigma must be finite, got {sigma}")
    if sequences * max_len > 10**8:
        fail(f"--sequences x --max-len = {sequences * max_len} positions: at most 10^8 for a demo dump")
    if not path.name or path.is_dir():
        fail(f"path {str(path)!r}: give a file name for the .npz (it names a directory)")
    if path.exists() and not overwrite:
        fail(f"path {str(path)!r} exists: pass --overwrite to replace it (a run's dumps/step_*.npz would be lost)")
    try:
        check_output_dir(path.parent, "path's directory")
    except ConfigError as exc:
        fail(str(exc))
    try:
        save_dump(path, **make_demo_dump(sequences, max_len, sigma=sigma, seed=seed))
    except OSError as exc:
        fail(f"path {path}: cannot write the dump ({exc.strerror or type(exc).__name__})")
    say(f"wrote {path}")


@app.command()
def export(
    run_dir: Path = typer.Argument(..., callback=expand_home, help="The run's output_dir."),
    out: str = typer.Option(..., "--out", "-o", callback=_out_path, help="Directory for the Hugging Face model."),
    step: int = typer.Option(None, "--step", min=1, help="The checkpoint of this step (default: the newest)."),
    dtype: str = typer.Option("bfloat16", "--dtype",
                              help="bfloat16 (the precision it trained and was served in) or float32 (the master weights)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is not an empty directory."),
) -> None:
    """Write a run's trained policy (a checkpoint) as a Hugging Face model directory.

    For from_pretrained, vLLM and the rest: safetensors weights, config and tokenizer, and
    aisrl_export.json (run, step, policy version). Exit 2 with a message naming the run, checkpoint or
    parameter when it cannot be done (no complete checkpoint, damaged shards, another model's shapes)."""
    from actors.cluster import quiet_workers
    from system.learner.hf_export import ExportError, export_policy

    if dtype not in ("bfloat16", "float32"):
        fail(f"--dtype {dtype!r}: bfloat16 or float32")
    quiet_workers()  # no progress bars of the model's load and write
    try:
        info = export_policy(run_dir, out, step, dtype, overwrite)
    except (ExportError, ConfigError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"--out {out}: cannot write the model ({exc.strerror or type(exc).__name__}"
             f"{': ' + str(exc.filename) if exc.filename else ''})")
    say(f"step {info['step']} (policy version {info['policy_version']}) of {run_dir} to {out} ({dtype})",
        "exported", "green")


# -- Cluster jobs (Ray Jobs API): ``aisrl submit`` and ``aisrl job status|stop|logs``, in actors/cli_jobs.py

app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(submit)
app.add_typer(job_app, name="job")


if __name__ == "__main__":  # python -m actors.cli, as the aisrl script
    app()
