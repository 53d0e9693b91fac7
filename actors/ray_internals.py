"""The only place aisrl touches Ray internals (no public API does these); checked on ray 2.55-2.60.

- :func:`set_local_only` flips ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``. Ray reads
  ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when ``ray`` is first imported, into that constant;
  a driver that imported ``ray`` before deciding to start a private loopback-only cluster must
  set the constant too (the variable alone is inherited by the cluster's processes).
- :func:`reload_config` calls ``ray._raylet.Config.initialize("")``: Ray caches its system config
  (including ``RAY_AUTH_MODE``) at import; ``aisrl scale`` sets the run's auth mode after the
  import and must refresh it, as ``ray.init`` itself does.
- :class:`TimedJobSubmissionClient` overrides ``JobSubmissionClient._do_request`` (the one place the
  Jobs SDK calls ``requests``) to give every request a timeout: the SDK sends none and takes none, so a
  dashboard port that accepts and never answers (a stuck head, a half-dead port-forward) hung
  ``aisrl job`` and ``aisrl submit`` for ever.
- :func:`quiet_worker_deaths` wraps ``ray._private.worker.print_to_stdstream``: the driver's error
  listener thread prints through it, for every actor process that dies, a ~900-character
  ``(raylet) A worker died or was killed ...`` paragraph whatever ``log_to_driver`` says (a probe:
  it sat between aisrl's own one-line reports of each lost worker or rank). The thread looks the
  function up at every message, so the wrapper applies from then on.
- :data:`LOOPBACK_NODE`: ``ray.init``'s underscore keyword ``_node_ip_address``, the only way to make the
  node a process starts advertise 127.0.0.1 (with :func:`set_local_only`, its servers bind there too).
"""

from ray._private import ray_constants
from ray._private import worker as ray_worker
from ray._raylet import Config
from ray.job_submission import JobSubmissionClient

LOOPBACK_NODE = {"_node_ip_address": "127.0.0.1"}
"""Keywords of a ``ray.init(address="local", ...)`` that starts a private loopback-only cluster."""

JOBS_API_TIMEOUT_S = (10.0, 60.0)
"""(connect, read) seconds of each Jobs API request: read is the longest silence between bytes."""


def set_local_only(local_only: bool) -> None:
    """Servers of a cluster this process starts bind to 127.0.0.1 (True) or the interface address."""
    ray_constants.ENABLE_RAY_CLUSTER = not local_only


def reload_config() -> None:
    """Re-read Ray's system config from the environment."""
    Config.initialize("")


WORKER_DIED = "A worker died or was killed while executing a task"
"""How Ray's raylet message on a dead actor process begins (ray 2.55-2.60)."""


def quiet_worker_deaths() -> None:
    """From now on this driver prints none of the raylet's worker-death paragraphs (aisrl says each
    loss in its own line); every other line Ray prints passes as before. Idempotent."""
    original = ray_worker.print_to_stdstream
    if hasattr(original, "aisrl_original"):
        return

    def print_to_stdstream(data, *args, **kwargs):
        lines = data.get("lines") or []
        if data.get("pid") == "raylet" and lines and all(str(x).startswith(WORKER_DIED) for x in lines):
            return None
        return original(data, *args, **kwargs)

    print_to_stdstream.aisrl_original = original
    ray_worker.print_to_stdstream = print_to_stdstream


class TimedJobSubmissionClient(JobSubmissionClient):
    """``JobSubmissionClient`` whose requests time out (``JOBS_API_TIMEOUT_S``) unless given one."""

    def _do_request(self, method, endpoint, **kwargs):
        kwargs.setdefault("timeout", JOBS_API_TIMEOUT_S)
        return super()._do_request(method, endpoint, **kwargs)
