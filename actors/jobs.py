"""Ray Jobs for ``aisrl``: submit ``aisrl train`` to a running cluster, then watch, stop or read the job.

``submit`` resolves and validates the config here first (nothing is sent when it is invalid),
copies the project (without ``.venv``, ``runs``, ``wandb``, ``.git``, caches) into a staging
directory together with the resolved config as ``aisrl_job_config.json``, and submits
``aisrl train aisrl_job_config.json`` with that directory as the job's working directory, so
the cluster runs exactly the config that was validated.

Secrets never travel with the job: the runtime environment's ``env_vars`` (visible in the Jobs
API and its logs) and the shipped config must not carry ``WANDB_API_KEY`` or any other key,
token or password; the cluster provides them (a Kubernetes secret, the nodes' environment).

Token authentication (Ray >= 2.52, on by default for new clusters in 2.60): the client sends
``Authorization: Bearer <token>`` with the token Ray itself would use, in Ray's precedence:
``$RAY_AUTH_TOKEN``, then the file ``$RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``.
``RAY_AUTH_MODE=disabled`` in the client's environment sends none.
"""

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import TextIO
from urllib.parse import urlparse

import aiohttp
import requests
from ray.exceptions import AuthenticationError
from ray.job_submission import JobStatus, JobSubmissionClient

from actors import ray_internals
from actors.cluster import QUIET_ENV, verbose
from actors.job_console import quiet_client_loggers, without_ray_info
from actors.ray_internals import TimedJobSubmissionClient
from system.config import RunConfig, dump_config, resolve_config
from system.config.resume import resume_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CONFIG = "aisrl_job_config.json"
"""The resolved config's file name in the job's working directory (the entry point's preset)."""
ROOT_EXCLUDES = frozenset({".venv", "venv", ".git", "runs", "wandb", "build", "dist", ".cache", ".whl", ".gl"})
"""Top-level entries of the project that are never shipped."""
ANYWHERE_EXCLUDES = ("__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".mypy_cache",
                     ".hypothesis", "*.egg-info", ".env", ".env.*", ".netrc", ".DS_Store")
"""Names never shipped at any depth (caches, and files that usually hold credentials)."""
SECRET_ENV_VARS = frozenset({"WANDB_API_KEY", "RAY_AUTH_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
SECRET_MARKERS = ("API_KEY", "TOKEN", "SECRET", "PASSWORD")
TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})


class JobError(RuntimeError):
    """A submission or Jobs API failure, worded for the user (names the address or the field)."""


# -- authentication and the client ---------------------------------------------------------------

def find_auth_token() -> tuple[str | None, str]:
    """The cluster token as Ray looks it up, and where it came from (for error messages)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None, "no token sent: RAY_AUTH_MODE=disabled"
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return _one_token(os.environ["RAY_AUTH_TOKEN"], "$RAY_AUTH_TOKEN"), "token from $RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        token = _read_token(Path(path), f"RAY_AUTH_TOKEN_PATH={path}")
        if not token:
            raise JobError(f"RAY_AUTH_TOKEN_PATH={path}: the token file is empty")
        return token, f"token from {path}"
    default = Path.home() / ".ray" / "auth_token"
    if default.is_file():
        token = _read_token(default, str(default))
        if token:
            return token, f"token from {default}"
    return None, "no token found: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"


def _read_token(path: Path, where: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # never shows the file's content
        raise JobError(f"{where}: cannot read the token file ({type(exc).__name__}: "
                       f"{exc.strerror if isinstance(exc, OSError) else 'not UTF-8 text'})") from None
    return _one_token(text, where) if text.strip() else ""


def _one_token(text: str, where: str) -> str:
    """The token, stripped; refused (never echoed) when it is not one printable line: an HTTP header
    cannot carry it, and the HTTP library's error would print it."""
    token = text.strip()
    if not token.isprintable() or any(c.isspace() for c in token):
        raise JobError(f"{where}: the token must be one line without spaces (it holds {len(token.splitlines())} "
                       "lines or white space); the token itself is not shown")
    return token


def check_address(address: str) -> str:
    """The dashboard URL of the cluster (``http(s)://host:port``), without a trailing slash."""
    example = "expected the cluster's dashboard URL, e.g. http://127.0.0.1:8265"
    try:
        parsed = urlparse(address)
        port = parsed.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise JobError(f"--address {address!r}: {exc}; {example}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise JobError(f"--address {address!r}: {example}")
    if port == 0:
        raise JobError(f"--address {address!r}: port 0; {example}")
    return address.rstrip("/")


@contextmanager
def job_api(address: str) -> Iterator[JobSubmissionClient]:
    """A Jobs API client that sends the token; errors come out as :class:`JobError`. Ray's client INFO
    lines stay off the console unless ``AISRL_VERBOSE`` (``actors.job_console``)."""
    if not verbose():
        quiet_client_loggers()
    token, source = find_auth_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        yield TimedJobSubmissionClient(check_address(address), headers=headers)
    except requests.exceptions.Timeout:
        connect_s, read_s = ray_internals.JOBS_API_TIMEOUT_S
        raise JobError(f"{address}: the Ray Jobs API did not answer (connect {connect_s:g} s, read {read_s:g} s): "
                       "is the head stuck, or the port forwarded to something else?") from None
    except aiohttp.ClientError as exc:  # the log stream (--follow): its websocket is refused
        raise JobError(f"{address}: the job's log stream failed: {' '.join(str(exc).split())[:300]}") from None
    except AuthenticationError as exc:
        server_says = " ".join(exc.message.split("\n\n")[0].split())  # e.g. "Authentication failed: Forbidden: ..."
        raise JobError(f"{address}: authentication failed ({source}). {server_says}") from None
    except ConnectionError as exc:
        raise JobError(f"{address}: cannot reach the Ray Jobs API: {exc}") from None
    except RuntimeError as exc:  # the SDK's wording for HTTP errors (unknown job id, ...)
        if isinstance(exc, JobError):
            raise
        raise JobError(f"{address}: {exc}") from None


# -- what is shipped -----------------------------------------------------------------------------

def resolve_for_cluster(presets: list[str], overrides: list[str]) -> RunConfig:
    """Validate presets + overrides; a config with no ``ray.address`` joins the job's cluster (``auto``)."""
    cfg = resolve_config(presets, overrides)
    if cfg.ray.address is None:
        cfg = resolve_config(presets, [*overrides, "ray.address=auto"])
    return cfg


def resolve_resume(run_dir: str, overrides: list[str]) -> tuple[RunConfig | None, list[str]]:
    """Validate a ``--resume`` submission here; (the resolved config if ``run_dir`` is readable
    here, else None, and the overrides the job gets).

    The job runs ``aisrl train --resume RUN_DIR [overrides]`` on the cluster, where the run's
    ``config.json`` is the preset. When ``run_dir`` is on this machine too (one machine, or a
    mounted shared volume) the whole config is validated and a complete checkpoint must exist;
    otherwise the overrides alone are checked against the schema defaults (a typo fails here;
    so does an override valid only under the saved config's variant types: give those after
    mounting the run directory) and the saved config on the cluster. ``run_dir`` must be absolute. The
    job joins its cluster: ``ray.address=auto`` unless the overrides set ``ray.address``.
    """
    if not Path(run_dir).is_absolute():
        raise JobError(f"--resume {run_dir}: give the run directory as an absolute path on the cluster's "
                       "shared storage (the job runs in a temporary working directory)")
    if any(o.startswith("output_dir=") for o in overrides):
        raise JobError("--resume: the run directory is the output_dir; drop the output_dir= override")
    extra = list(overrides)
    if not any(o.startswith("ray.address=") for o in extra):
        extra.append("ray.address=auto")
    saved = Path(run_dir) / "config.json"
    if saved.is_file():
        from system.run_state import latest_run_checkpoint

        if latest_run_checkpoint(run_dir) is None:
            raise JobError(f"--resume {run_dir}: no complete checkpoint under {Path(run_dir) / 'checkpoints'}")
        # as ``aisrl train --resume`` will on the cluster: the saved config, the overrides, what must not change
        return resume_config(Path(run_dir), [], extra), extra
    resolve_config([], extra)
    return None, extra


def placement_warnings(cfg: RunConfig, project: Path = PROJECT_ROOT) -> list[str]:
    """What will not be where the user expects on the cluster: a relative path is resolved in the
    job's temporary working directory (a copy of this checkout) on the head node."""
    warnings = []
    if not Path(cfg.output_dir).is_absolute():
        warnings.append(f"output_dir {cfg.output_dir!r} is relative: on the cluster it lands in the job's temporary "
                        "working directory on the head node; use an absolute path on shared storage, e.g. "
                        "output_dir=/app/runs/NAME")
    data_path = getattr(cfg.data.task, "path", None)
    if data_path is not None and not Path(data_path).is_absolute():
        shipped = is_shipped(project, data_path)
        warnings.append(
            f"data.task.path {data_path!r} is relative: on the cluster it is read from the job's working directory, "
            + ("this checkout's copy, uploaded with the job" if shipped else
               "a copy of this checkout, which has no such file, so the job will fail to find it")
            + f"; to read the cluster's data volume give an absolute path, e.g. data.task.path=/app/{data_path}")
    warnings += home_path_warnings(cfg)
    return warnings


def home_path_warnings(cfg: RunConfig, home: Path | None = None) -> list[str]:
    """A path under this machine's home directory (``~`` is expanded here, at validation) is shipped as
    that absolute path, which the cluster's nodes, whose home is usually another, may not have (a
    review's find: ``output_dir=~/runs/x`` became ``/root/runs/x`` with no word said)."""
    home = (home or Path.home()).resolve()
    if home == Path(home.anchor):  # a home at the root would flag every path
        return []
    said = []
    for field, value in (("output_dir", cfg.output_dir), ("data.task.path", getattr(cfg.data.task, "path", None))):
        if value is not None and Path(value).is_absolute() and Path(value).resolve().is_relative_to(home):
            said.append(f"{field} {value!r} is under this machine's home directory ({home}; a '~' is expanded here): "
                        "the job uses that same path on the cluster, whose home may be another; give the "
                        "cluster's path")
    return said


def is_shipped(project: Path, relative: str) -> bool:
    """Whether the checkout's file ``relative`` reaches the job: there, inside the checkout, under none of
    the excludes, and matched by no ``.gitignore`` pattern (Ray's upload of the working directory leaves
    those out; ``git check-ignore --no-index`` asks the same patterns, tracked or not)."""
    path = project / relative
    if not path.is_file() or not path.resolve().is_relative_to(project.resolve()):
        return False
    parts = path.resolve().relative_to(project.resolve()).parts
    if parts[0] in ROOT_EXCLUDES or any(fnmatch(p, pat) for p in parts for pat in ANYWHERE_EXCLUDES):
        return False
    try:
        checked = subprocess.run(["git", "check-ignore", "-q", "--no-index", "--", str(Path(*parts))], cwd=project,
                                 capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no git here: the patterns are not checked
        return True
    return checked.returncode != 0  # 0: ignored; 1: not ignored; 128: not a git checkout


def _ignore(root: Path):
    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = {n for n in names if any(fnmatch(n, pattern) for pattern in ANYWHERE_EXCLUDES)}
        if Path(directory) == root:
            skip |= ROOT_EXCLUDES.intersection(names)
        return skip
    return ignore


def stage_working_dir(cfg: RunConfig | None, staging: Path, project: Path = PROJECT_ROOT) -> Path:
    """Copy the project into ``staging`` (minus the excludes) and write the resolved config there
    (none for a ``--resume`` job, whose preset is the run's own ``config.json``)."""
    if not (project / "pyproject.toml").is_file():
        raise JobError(f"{project}: not an aisrl source checkout (no pyproject.toml); submit from a checkout")
    try:
        shutil.copytree(project, staging, ignore=_ignore(project), symlinks=True, dirs_exist_ok=True)
    except (shutil.Error, OSError) as exc:  # an unreadable file, a FIFO or socket in the checkout
        errors = exc.args[0] if isinstance(exc, shutil.Error) and isinstance(exc.args[0], list) else [exc]
        first = errors[0]
        what = f"{first[0]}: {first[2]}" if isinstance(first, tuple) and len(first) == 3 else str(first)
        raise JobError(f"cannot copy the checkout {project} to ship it with the job ({len(errors)} file(s); "
                       f"first: {what}); remove or fix that file, or add it to .gitignore") from None
    if cfg is not None:
        (staging / SHIPPED_CONFIG).write_text(dump_config(cfg), encoding="utf-8")
    return staging


def check_no_secrets(runtime_env: dict, config_text: str) -> None:
    """Refuse a runtime env or config that would publish a credential through the Jobs API."""
    for name in runtime_env.get("env_vars") or {}:
        if name in SECRET_ENV_VARS or any(m in name.upper() for m in SECRET_MARKERS):
            raise JobError(f"runtime_env.env_vars.{name}: secrets must not be sent with the job; "
                           "the cluster must provide them (Kubernetes secret or node environment)")
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name, "")
        if len(value) >= 8 and value in config_text:
            raise JobError(f"the resolved config contains the value of ${name}; remove it from the presets/overrides")


def build_runtime_env(working_dir: Path, stop_wait_s: int, config_text: str | None = None,
                      verbose: bool = False) -> dict:
    """The job's runtime env: the staged working dir, how long ``job stop`` waits after SIGTERM, and
    (unless ``verbose``) ``actors.cluster.QUIET_ENV``, so the job's log holds aisrl's lines, Ray's and
    the errors, without the libraries' warnings and progress bars (as ``aisrl train`` on its own
    private cluster); they reach the job's driver and every actor it starts."""
    env_vars = {"RAY_JOB_STOP_WAIT_TIME_S": str(stop_wait_s), **({} if verbose else QUIET_ENV)}
    env = {"working_dir": str(working_dir), "env_vars": env_vars}
    check_no_secrets(env, config_text if config_text is not None else (working_dir / SHIPPED_CONFIG).read_text(encoding="utf-8"))
    return env


def entrypoint(dry_run: bool = False, resume: str | None = None, overrides: list[str] = (),
               overwrite: bool = False, verbose: bool = False) -> str:
    """The command the cluster runs in the job's working directory (``overwrite``: replace a run
    already in ``output_dir``, as ``aisrl train --overwrite``; ``verbose``: ``--verbose``)."""
    flags = " --verbose" if verbose else ""
    if resume is not None:
        return " ".join([f"aisrl train{flags} --resume", shlex.quote(resume), *map(shlex.quote, overrides)])
    return (f"aisrl train{flags}{' --dry-run' if dry_run else ''}{' --overwrite' if overwrite else ''} "
            f"{SHIPPED_CONFIG}")


# -- the Jobs API --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Submitted:
    job_id: str
    entrypoint: str
    runtime_env: dict


def submit(address: str, cfg: RunConfig, staging: Path, *, dry_run: bool = False, stop_wait_s: int = 300,
           overwrite: bool = False, verbose: bool = False) -> Submitted:
    """Stage the working dir in ``staging`` (an empty directory), submit, return the job id. An absolute
    ``output_dir`` readable here (shared storage) that holds a run is refused here, before anything is
    sent, unless ``overwrite`` (the job's own refusal named ``aisrl train --resume``)."""
    address = check_address(address)
    if not (overwrite or dry_run) and Path(cfg.output_dir).is_absolute() and Path(cfg.output_dir).is_dir():
        from system.run_state import check_new_run_dir

        try:
            check_new_run_dir(cfg.output_dir, overwrite=False, command="aisrl submit")
        except ValueError as exc:
            raise JobError(str(exc)) from None
    runtime_env = build_runtime_env(stage_working_dir(cfg, staging), stop_wait_s, verbose=verbose)
    command = entrypoint(dry_run, overwrite=overwrite, verbose=verbose)
    metadata = {"aisrl.output_dir": cfg.output_dir, "aisrl.max_steps": str(cfg.max_steps)}
    with job_api(address) as client:
        job_id = client.submit_job(entrypoint=command, runtime_env=runtime_env, metadata=metadata)
    return Submitted(job_id, command, runtime_env)


def submit_resume(address: str, run_dir: str, overrides: list[str], staging: Path, *, stop_wait_s: int = 300,
                  verbose: bool = False) -> Submitted:
    """Submit ``aisrl train --resume run_dir [overrides]`` (validate first with :func:`resolve_resume`)."""
    address = check_address(address)
    command = entrypoint(resume=run_dir, overrides=overrides, verbose=verbose)
    runtime_env = build_runtime_env(stage_working_dir(None, staging), stop_wait_s, config_text=command, verbose=verbose)
    metadata = {"aisrl.output_dir": run_dir, "aisrl.resume": "true"}
    with job_api(address) as client:
        job_id = client.submit_job(entrypoint=command, runtime_env=runtime_env, metadata=metadata)
    return Submitted(job_id, command, runtime_env)


def status(address: str, job_id: str) -> tuple[JobStatus, str]:
    """The job's status and the Jobs API's message about it."""
    with job_api(address) as client:
        info = client.get_job_info(job_id)
    return info.status, info.message or ""


def logs(address: str, job_id: str) -> str:
    with job_api(address) as client:
        return client.get_job_logs(job_id)


def stop(address: str, job_id: str, timeout_s: float = 60.0) -> JobStatus:
    """Ask the job to stop (SIGTERM, SIGKILL after its ``RAY_JOB_STOP_WAIT_TIME_S``); wait for the end."""
    with job_api(address) as client:
        client.stop_job(job_id)
    try:
        return wait(address, job_id, timeout_s)
    except JobError as exc:
        raise JobError(f"stop sent; {exc}") from None


def wait(address: str, job_id: str, timeout_s: float, poll_s: float = 0.5) -> JobStatus:
    """Poll until the job is SUCCEEDED, FAILED or STOPPED; raise JobError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with job_api(address) as client:
        while (current := client.get_job_status(job_id)) not in TERMINAL:
            if time.monotonic() > deadline:
                raise JobError(f"job {job_id} still {current} after {timeout_s:g} s (it may still end: "
                               f"aisrl job status {job_id} --address {address})")
            time.sleep(poll_s)
    return current


def follow(address: str, job_id: str, out: TextIO = sys.stdout, ray_info: bool = True) -> JobStatus:
    """Stream the job's logs to ``out`` until it ends; return its final status. ``ray_info`` False leaves
    out the lines Ray's job supervisor logs at INFO (``actors.job_console``)."""
    with job_api(address) as client:
        client.get_job_status(job_id)  # an unknown id: the API's "does not exist", not a refused websocket
        asyncio.run(_tail(client, job_id, out, ray_info))
    return wait(address, job_id, timeout_s=60.0)


async def _tail(client: JobSubmissionClient, job_id: str, out: TextIO, ray_info: bool) -> None:
    chunks = client.tail_job_logs(job_id)
    async for chunk in chunks if ray_info else without_ray_info(chunks):
        out.write(chunk)
        out.flush()
