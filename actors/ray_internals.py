"""The only place aisrl touches Ray internals (no public API does these); checked on ray 2.55-2.60.

- :func:`set_local_only` flips ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``. Ray reads
  ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when ``ray`` is first imported, into that constant;
  a driver that imported ``ray`` before deciding to start a private loopback-only cluster must
  set the constant too (the variable alone is inherited by the cluster's processes).
- :func:`reload_config` calls ``ray._raylet.Config.initialize("")``: Ray caches its system config
  (including ``RAY_AUTH_MODE``) at import; ``aisrl scale`` sets the run's auth mode after the
  import and must refresh it, as ``ray.init`` itself does.
"""

from ray._private import ray_constants
from ray._raylet import Config


def set_local_only(local_only: bool) -> None:
    """Servers of a cluster this process starts bind to 127.0.0.1 (True) or the interface address."""
    ray_constants.ENABLE_RAY_CLUSTER = not local_only


def reload_config() -> None:
    """Re-read Ray's system config from the environment."""
    Config.initialize("")
