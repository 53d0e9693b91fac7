"""Start or join the Ray cluster; a private local cluster binds to 127.0.0.1 with no public dashboard."""

import logging
import os
import socket
import sys
from pathlib import Path

import ray

from actors.ray_internals import LOOPBACK_NODE, quiet_worker_deaths, set_local_only
from actors.stop_signals import defer_signals
from system.config import RunConfig, check_output_dir
from system.config.cluster import RayConfig

log = logging.getLogger(__name__)


TASK_EVENTS_ENV = "RAY_task_events_max_num_task_in_gcs"
PRIVATE_TASK_EVENTS = 10_000
"""Task events a private cluster's GCS keeps (Ray's default: 100,000; a value in the environment wins).
The GCS keeps an event record of every task for the dashboard and ``ray list tasks``. Measured (AMD
EPYC, the simulated trainer of ``bench_orchestration.py`` with no compute): at Ray's default its memory
grew ~25 KB a step, 54 -> 302 MiB over 10,000 steps without levelling off (probe 7 saw 49 -> 77 MiB over
700 real steps); at 10,000 it levelled at 88-93 MiB from step 3,000 to 12,000 (2,000: 59-61 MiB)."""

PRESTART_ENV = "RAY_prestart_worker_first_driver"
"""Ray's system-config switch (read from the environment by the raylet a private cluster starts; checked
on ray 2.55-2.60) for starting idle Python workers when the first driver connects. A private cluster
starts with it off (a value in the environment wins): every aisrl actor has a ``runtime_env`` of its
own (:func:`actor_env`), so no actor can take one of those workers, which each imported ``ray`` for
nothing while the ranks and the rollout workers started. Measured on a 2-core AMD EPYC VM: a private
cluster idle for 75 s used 15.6 CPU seconds in all, 4.1 of them in its two idle workers; with the
switch off neither starts."""


def private_cluster_environment() -> None:
    """The settings of a private cluster this process is about to start: every server on 127.0.0.1
    (:func:`use_loopback_only`), and, unless the environment already has them, :data:`TASK_EVENTS_ENV`
    and :data:`PRESTART_ENV` (its GCS and raylet read them at start)."""
    use_loopback_only()
    os.environ.setdefault(TASK_EVENTS_ENV, str(PRIVATE_TASK_EVENTS))
    os.environ.setdefault(PRESTART_ENV, "0")


def connect(cfg: RayConfig, num_cpus: int, runtime_env: dict | None = None) -> None:
    """Join ``cfg.address`` if set, else start a private cluster on loopback (never an existing one)
    with ``num_cpus`` logical CPUs (the placement plan's need) unless ``ray.num_cpus`` says otherwise."""
    if ray.is_initialized():
        return
    if cfg.address is not None:
        join(cfg.address, runtime_env=runtime_env)
        # aisrl's own line (Ray's "Connecting to existing Ray cluster" is shown with --verbose only)
        log.warning("joined the Ray cluster at %s (ray.address=%s)", ray.get_runtime_context().gcs_address,
                    cfg.address)
        return
    private_cluster_environment()
    quiet_workers()
    ray.init(
        address="local",
        num_cpus=cfg.num_cpus if cfg.num_cpus is not None else max(num_cpus, 1),
        object_store_memory=int(cfg.object_store_gib * 2**30),
        include_dashboard=cfg.include_dashboard,
        dashboard_host="127.0.0.1",
        **LOOPBACK_NODE,
        runtime_env=runtime_env,
        log_to_driver=True,
        logging_level=logging.INFO if verbose() else logging.ERROR,
    )


def stop_session() -> None:
    """End this process's Ray session now (a private cluster: its processes stop with it), a Ctrl-C or
    SIGTERM meanwhile noted instead of raised: raised inside ``ray.shutdown``, as Ray's exit hook would
    run it, it left the cluster's dashboard and runtime-env agents running after the CLI had exited."""
    restore = defer_signals()
    try:
        ray.shutdown()
    finally:
        restore()


QUIET_ENV = {
    "PYTHONWARNINGS": "ignore",  # Python warnings (FutureWarning, DeprecationWarning) of libraries
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ warnings (NUMA binding, ...)
    "TQDM_DISABLE": "1",  # progress bars (weight loading in transformers and vLLM)
    "TRANSFORMERS_VERBOSITY": "error",
    "VLLM_LOGGING_LEVEL": "ERROR",
}
"""Environment of a private cluster's processes (inherited from this driver) unless ``AISRL_VERBOSE=1``
(``aisrl train --verbose``): the console keeps aisrl's own lines, errors and tracebacks."""


def actor_env(**extra: str) -> dict:
    """The ``runtime_env`` of the run's actors: :data:`QUIET_ENV` (a value this driver's environment
    sets wins; none of it with ``--verbose``), vLLM at ERROR unless the driver's environment says
    otherwise (it logs every weight reload), and ``extra``. On a private cluster the actors inherit
    the driver's environment anyway; on a joined one they start from the raylet's, and their
    libraries' warnings and progress bars reached the console (found by a probe)."""
    env = {} if verbose() else {key: os.environ.get(key, value) for key, value in QUIET_ENV.items()}
    env.setdefault("VLLM_LOGGING_LEVEL", os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"))
    return {"env_vars": {**env, **extra}}


def verbose() -> bool:
    return os.environ.get("AISRL_VERBOSE", "") not in ("", "0")


def quiet_workers() -> None:
    """Set :data:`QUIET_ENV` (values the user set win) before a private cluster starts, and quiet this
    process's progress bars (tqdm reads ``TQDM_DISABLE`` when it is imported, before this runs: the
    tiny model's build printed "Writing model shards" bars) and Ray's paragraph on every dead
    actor process (``ray_internals.quiet_worker_deaths``). Off a terminal, Ray's prefixes of the
    workers' lines (``(CorrectionService pid=...)``) carry no colour codes."""
    if not verbose():
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as transformers_logging

        disable_progress_bars()
        quiet_worker_deaths()  # aisrl says each lost worker or rank in a line of its own
        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()  # imported before TRANSFORMERS_VERBOSITY was set here
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # read by the driver as it prints each line


class ClusterUnreachableError(ValueError):
    """``ray.address`` names no cluster this process can reach (said in one line, exit 2)."""


def reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``address`` (``host:port``, ``ray://host:port``) opens within ``timeout_s``."""
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):  # [fd00::1]:6379
            return True
    except (OSError, ValueError):
        return False


def _target(address: str) -> str | None:
    """The address ``ray.init`` will dial: ``$RAY_ADDRESS`` for ``auto`` (None when unset: only
    ``ray.init`` can look a local cluster up)."""
    return (os.environ.get("RAY_ADDRESS") or None) if address == "auto" else address


def check_address(address: str, timeout_s: float = 10.0) -> str | None:
    """Raise :class:`ClusterUnreachableError` when nothing answers at ``address`` (``auto``: at
    ``$RAY_ADDRESS``) within ``timeout_s`` (``ray.init`` would retry it for ever); returns the address
    checked (None: ``auto`` without ``RAY_ADDRESS``). ``aisrl train`` calls it before the model build."""
    target = _target(address)
    if target is not None and target != "auto" and not reachable(target, timeout_s):
        via = " (from RAY_ADDRESS, which ray.address=auto reads)" if address == "auto" else ""
        raise ClusterUnreachableError(f"ray.address: nothing answers at {target}{via} within {timeout_s:g} s: "
                                      "start the cluster first (ray start --head), or fix the address")
    return target


TOKEN_HINT = ("with token authentication on (Ray's default), this process needs the cluster's token: export "
              "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) as in the shell that started the head")


def join(address: str, what: str = "ray.address", **init_kwargs) -> None:
    """Connect to a running cluster. One bound to loopback (an address on 127.0.0.1, or a head
    started with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, whose jobs inherit the variable) is
    joined in local-only mode, so this driver does not announce the machine's interface address.
    ``auto`` without a running cluster is one line (:class:`ClusterUnreachableError`); whether
    anything answers at an address is the callers' check (:func:`check_address`, :func:`reachable`).
    A refused token is one line too, naming ``what`` (the setting or flag the address came from)."""
    host = (_target(address) or address).split("://")[-1].rsplit(":", 1)[0]
    if host in ("127.0.0.1", "localhost") or os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
        use_loopback_only()
    else:
        set_local_only(False)
    try:
        # Ray's INFO lines ("Connecting to existing Ray cluster at ...") only with --verbose
        init_kwargs.setdefault("logging_level", logging.INFO if verbose() else logging.WARNING)
        ray.init(address=address, log_to_driver=True, **init_kwargs)
    except ray.exceptions.AuthenticationError as exc:  # no token here for a cluster that requires one
        first = " ".join(str(exc).split("\n\n")[0].split())[:200]
        raise ClusterUnreachableError(f"{what}={address}: authentication failed ({first}); {TOKEN_HINT}") from None
    except RuntimeError as exc:
        if "when trying to resolve node to connect to" not in str(exc):
            raise
        # found by a review: Ray's driver needs a node of the cluster on its own machine (a login node of a
        # SLURM allocation has none); Ray looks for one for a minute and raises this
        raise ClusterUnreachableError(
            f"{what}={address}: this machine runs no node of that cluster, and a Ray driver must run on one; run "
            "the command on a node of the cluster (SLURM: srun --jobid=<job> --overlap -w <head node> ...; "
            "deploy/README.md)") from None
    except ConnectionError as exc:  # "auto" with no cluster running here, or a token the cluster refused
        said = " ".join(str(exc).split())[:300]
        target = _target(address)
        if target is not None and reachable(target):  # it answers, yet refused this process: the token
            said += f"; the cluster answers at {target} but did not accept this process: {TOKEN_HINT}"
        raise ClusterUnreachableError(f"{what}={address}: {said}") from None


def use_loopback_only() -> None:
    """Make a private cluster bind every server to 127.0.0.1.

    Ray picks the node address from the network interface unless its "local only" mode is on
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``). The variable is read once, when ``ray`` is first
    imported, so the already-read constant is set too; the variable itself is inherited by the
    cluster's processes.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    set_local_only(True)


def ray_writes_auth_token() -> bool:
    """Whether starting a private cluster here makes Ray write a new auth token to ``~/.ray/auth_token``:
    token auth is Ray's default for a new local cluster (unless ``RAY_AUTH_MODE`` says otherwise), and
    it generates a token when none is given (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``) or saved."""
    mode = os.environ.get("RAY_AUTH_MODE", "token").lower()
    given = os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
    return mode == "token" and not given and not (Path.home() / ".ray" / "auth_token").exists()


def check_local_dirs(cfg: RunConfig, model_cache: Path) -> None:
    """Raise ConfigError naming the variable when a directory the run writes on this machine before its
    first step cannot be written: ``$TMPDIR`` (Ray's session files, the correction service's), the tiny
    model's cache (``model_cache``), and ``~/.ray`` when a private cluster's auth token is written there.
    (A file as TMPDIR, or an unwritable HOME, failed with 120-180-line tracebacks; found by a probe.)"""
    for var in ("RAY_TMPDIR", "TMPDIR"):  # Ray's temporary root: RAY_TMPDIR when set, else TMPDIR
        if os.environ.get(var):
            check_output_dir(os.environ[var], var)
            break
    if cfg.model.type == "tiny" and not (model_cache.is_dir() and any(model_cache.iterdir())):
        # a cache that already holds builds may be read-only (a shared one): a missing build fails by itself
        check_output_dir(model_cache, "the model cache (AISRL_CACHE_DIR, default ~/.cache/aisrl/models)")
    if cfg.ray.address is None and ray_writes_auth_token():
        check_output_dir(Path.home() / ".ray", "~/.ray (where Ray saves a private cluster's auth token; "
                                               "set HOME, or RAY_AUTH_TOKEN)")
