"""``aisrl submit`` and ``aisrl job status|stop|logs``: runs on a Ray cluster through its Jobs API
(``actors/jobs.py`` does the work; registered on the ``aisrl`` app by ``actors/cli.py``)."""

import math
import os
import sys
from pathlib import Path

import typer

from actors.cli_common import fail, say, split_args
from actors.cluster import verbose as cluster_verbose
from system.config import ConfigError, RunConfig
from system.config.environment import wandb_mode_from

job_app = typer.Typer(no_args_is_help=True, help="Status, stop and logs of a submitted job.")
ADDRESS_HELP = "The cluster's dashboard URL (Ray Jobs API), e.g. http://127.0.0.1:8265."


def submit(
    args: list[str] = typer.Argument(None, help="Presets and dotted.key=value overrides, as for `train`."),
    address: str = typer.Option(..., "--address", help=ADDRESS_HELP),
    follow: bool = typer.Option(False, "--follow", help="Stream the job's logs until it ends; exit 1 unless it SUCCEEDED."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Run `aisrl train --dry-run` on the cluster (checks the image and the shipped config)."),
    stop_wait_s: int = typer.Option(300, "--stop-wait-s", min=0, help="On `job stop`, seconds between SIGTERM (finish the step, drain the rollouts for up to 60 s, checkpoint) and SIGKILL; as the RayJob."),
    resume: str = typer.Option(None, "--resume", help="Continue this run directory (a path on the cluster) from its last complete checkpoint; ARGS are overrides only."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a run already in output_dir on the cluster (its files are deleted), as `aisrl train --overwrite`."),
    verbose: bool = typer.Option(False, "--verbose", help="Keep the libraries' own logs, warnings and progress bars in the job's log (`aisrl train --verbose` on the cluster), and Ray's INFO lines on this console."),
) -> None:
    """Validate the config here, then run `aisrl train` on a running Ray cluster as a Ray job."""
    import signal

    # SIGTERM (a scheduler, `timeout`) unwinds like Ctrl-C does, so the staged copy of the checkout is
    # removed (a probe found /tmp/aisrl-submit-* left behind, 4 MB each)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if verbose:  # Ray's client lines too (actors.job_console)
        os.environ["AISRL_VERBOSE"] = "1"
    try:
        _stage_and_submit(args, address, follow, dry_run, stop_wait_s, resume, overwrite, verbose)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stage_and_submit(args, address, follow, dry_run, stop_wait_s, resume, overwrite, verbose) -> None:
    import tempfile

    from actors import jobs

    try:
        jobs.check_address(address)
        presets, overrides = split_args(args or [])
        mode = wandb_mode_from(os.environ, overrides)
        if mode is not None:  # this shell's variable would not reach the job (the cluster's environment runs it)
            overrides = [*overrides, f"report.wandb.mode={mode}"]
            say(f"note: WANDB_MODE={os.environ['WANDB_MODE']} here: the job gets report.wandb.mode={mode}")
        if resume is not None:
            if presets or dry_run or overwrite:
                raise ConfigError("--resume takes dotted overrides only (the run's config.json is its preset), "
                                  "no --dry-run or --overwrite")
            cfg, overrides = jobs.resolve_resume(resume, overrides)
            if cfg is None:
                say(f"note: {resume} is not readable here; the cluster validates its config.json")
            _submit_notes(cfg)
            with tempfile.TemporaryDirectory(prefix="aisrl-submit-") as staging:
                sub = jobs.submit_resume(address, resume, overrides, Path(staging), stop_wait_s=stop_wait_s,
                                         verbose=verbose)
        else:
            cfg = jobs.resolve_for_cluster(presets, overrides)
            _submit_notes(cfg)
            with tempfile.TemporaryDirectory(prefix="aisrl-submit-") as staging:
                sub = jobs.submit(address, cfg, Path(staging), dry_run=dry_run, stop_wait_s=stop_wait_s,
                                  overwrite=overwrite, verbose=verbose)
    except (ConfigError, jobs.JobError) as exc:
        fail(str(exc))
    say(f"{sub.job_id}: {sub.entrypoint}", "submitted", "bold")
    print(sub.job_id)
    if follow:
        _follow(address, sub.job_id, ray_info=verbose or cluster_verbose())


def _submit_notes(cfg: RunConfig | None) -> None:
    """What the user should know about a job, said before it is submitted (relative paths, W&B key)."""
    from actors import jobs

    for warning in jobs.placement_warnings(cfg) if cfg is not None else []:
        say(warning, "warning:", "yellow")
    token, source = jobs.find_auth_token()
    if token is None and not source.endswith("RAY_AUTH_MODE=disabled"):
        say("no Ray auth token found ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token): the job goes "
            "without one, which only a cluster with token authentication off accepts (one that runs jobs from "
            "anyone who reaches its dashboard port)", "warning:", "yellow")
    if cfg is not None and cfg.report.wandb.mode == "online":
        say("note: report.wandb.mode=online; the cluster must provide WANDB_API_KEY (it is never sent with the job)")


def _follow(address: str, job_id: str, ray_info: bool = True) -> None:
    """Stream the job's log (without Ray's INFO lines unless ``ray_info``) and exit with its outcome."""
    from actors import jobs

    try:
        final = jobs.follow(address, job_id, ray_info=ray_info)
    except KeyboardInterrupt:
        say(f"stopped following; the job keeps running (aisrl job stop {job_id} --address {address})")
        raise typer.Exit(code=130) from None
    except jobs.JobError as exc:
        fail(str(exc))
    say(f"job {job_id}: {final}")
    if final != "SUCCEEDED":
        raise typer.Exit(code=1)


def _job_id(value: str) -> str:
    """A job id is one word (an unset shell variable gave "": the API then answered with its job list)."""
    if not value.strip() or any(c.isspace() for c in value):
        raise typer.BadParameter(f"{value!r}: a job id (raysubmit_...) as `aisrl submit` printed it")
    return value


def _wait_seconds(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise typer.BadParameter(f"{value}: seconds, a finite number >= 0")
    return value


@job_app.command("status")
def job_status(job_id: str = typer.Argument(..., callback=_job_id), address: str = typer.Option(..., "--address", help=ADDRESS_HELP)) -> None:
    """Print the job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED) and its message."""
    from actors import jobs

    try:
        state, message = jobs.status(address, job_id)
    except jobs.JobError as exc:
        fail(str(exc))
    print(f"{job_id} {state}" + (f": {message}" if message else ""))


@job_app.command("stop")
def job_stop(
    job_id: str = typer.Argument(..., callback=_job_id),
    address: str = typer.Option(..., "--address", help=ADDRESS_HELP),
    timeout_s: float = typer.Option(330.0, "--timeout-s", callback=_wait_seconds,
                                    help="How long to wait for the job to end (the stop is sent either way); "
                                         "30 s past the default stop wait (submit --stop-wait-s 300), so a job "
                                         "Ray kills at its stop wait is seen ended, not still RUNNING."),
) -> None:
    """Stop the job: SIGTERM (training finishes its step and checkpoints), SIGKILL after the job's stop wait."""
    from actors import jobs

    try:
        final = jobs.stop(address, job_id, timeout_s)
    except jobs.JobError as exc:
        fail(str(exc))
    print(f"{job_id} {final}")


@job_app.command("logs")
def job_logs(
    job_id: str = typer.Argument(..., callback=_job_id),
    address: str = typer.Option(..., "--address", help=ADDRESS_HELP),
    follow: bool = typer.Option(False, "--follow", help="Stream until the job ends; exit 1 unless it SUCCEEDED."),
) -> None:
    """Print the job's logs (the entry point's stdout and stderr)."""
    from actors import jobs

    if follow:
        _follow(address, job_id)
        return
    try:
        text = jobs.logs(address, job_id)
    except jobs.JobError as exc:
        fail(str(exc))
    print(text, end="")
