"""Start or join the Ray cluster; a private local cluster binds to 127.0.0.1 with no public dashboard."""

import logging
import os

import ray

from actors.ray_internals import set_local_only
from system.config.cluster import RayConfig


def connect(cfg: RayConfig, num_cpus: int, runtime_env: dict | None = None) -> None:
    """Join ``cfg.address`` if set, else start a private cluster on loopback (never an existing one)
    with ``num_cpus`` logical CPUs (the placement plan's need) unless ``ray.num_cpus`` says otherwise."""
    if ray.is_initialized():
        return
    if cfg.address is not None:
        join(cfg.address, runtime_env=runtime_env)
        return
    use_loopback_only()
    quiet_workers()
    ray.init(
        address="local",
        num_cpus=cfg.num_cpus if cfg.num_cpus is not None else max(num_cpus, 1),
        object_store_memory=int(cfg.object_store_gib * 2**30),
        include_dashboard=cfg.include_dashboard,
        dashboard_host="127.0.0.1",
        _node_ip_address="127.0.0.1",
        runtime_env=runtime_env,
        log_to_driver=True,
        logging_level=logging.INFO if verbose() else logging.ERROR,
    )


QUIET_ENV = {
    "PYTHONWARNINGS": "ignore",  # Python warnings (FutureWarning, DeprecationWarning) of libraries
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ warnings (NUMA binding, ...)
    "TQDM_DISABLE": "1",  # progress bars (weight loading in transformers and vLLM)
    "TRANSFORMERS_VERBOSITY": "error",
    "VLLM_LOGGING_LEVEL": "ERROR",
}
"""Environment of a private cluster's processes (inherited from this driver) unless ``AISRL_VERBOSE=1``
(``aisrl train --verbose``): the console keeps aisrl's own lines, errors and tracebacks."""


def verbose() -> bool:
    return os.environ.get("AISRL_VERBOSE", "") not in ("", "0")


def quiet_workers() -> None:
    """Set :data:`QUIET_ENV` (values the user set win) before a private cluster starts."""
    if not verbose():
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)


def join(address: str, **init_kwargs) -> None:
    """Connect to a running cluster. One bound to loopback (an address on 127.0.0.1, or a head
    started with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, whose jobs inherit the variable) is
    joined in local-only mode, so this driver does not announce the machine's interface address."""
    host = address.split("://")[-1].rsplit(":", 1)[0]
    if host in ("127.0.0.1", "localhost") or os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
        use_loopback_only()
    else:
        set_local_only(False)
    ray.init(address=address, log_to_driver=True, **init_kwargs)


def use_loopback_only() -> None:
    """Make a private cluster bind every server to 127.0.0.1.

    Ray picks the node address from the network interface unless its "local only" mode is on
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``). The variable is read once, when ``ray`` is first
    imported, so the already-read constant is set too; the variable itself is inherited by the
    cluster's processes.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    set_local_only(True)
