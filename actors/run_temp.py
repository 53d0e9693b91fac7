"""The run's temporary directory: the ``TMPDIR`` of its correction service and rollout workers.

On the driver's node, removed when the run stops, so what those processes leave in their temp dir
goes with it: W&B a directory per logged table and its socket directory (until an interpreter exit
a Ray actor never reaches; a probe found 47 in /tmp), each vLLM engine a ``vllm_dist_*`` rendezvous
file (a killed worker never removes its own; a probe found 187).

Except the compile cache. torch's inductor keeps its cache, including a ~155 MB precompiled C++
header, in ``$TMPDIR/torchinductor_<user>``, to be reused by every later process; under a run's own
directory it was empty at every worker start, and an engine with ``rollout.engine.enforce_eager=false``
compiled from scratch each time (on a 2-core AMD EPYC its build took 27.5 s, against 13.0 s with the
cache warm). :func:`make_run_temp` links that name to the cache of the driver's temp dir, which the
run's removal leaves in place (``shutil.rmtree`` removes a link, not what it points to).
"""

import getpass
import re
import shutil
import tempfile
from pathlib import Path


def compile_cache_name() -> str | None:
    """torch's name for its default inductor cache directory (``torch._inductor.runtime.cache_dir_utils.
    default_cache_dir``, checked on torch 2.13): ``torchinductor_`` and the user name with ``\\/:*?"<>|``
    replaced by ``_``; None when there is no user name."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        return None
    return "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)


def make_run_temp() -> str:
    """A new ``aisrl-run-*`` directory in this process's temp dir, its compile cache linked to this
    temp dir's (created when missing; without a user name or where links fail, no link)."""
    tmp = tempfile.mkdtemp(prefix="aisrl-run-")
    name = compile_cache_name()
    if name is not None:
        shared = Path(tempfile.gettempdir()) / name
        try:
            shared.mkdir(exist_ok=True)
            (Path(tmp) / name).symlink_to(shared, target_is_directory=True)
        except OSError:
            pass  # a cache that cannot be shared: each start compiles, as before
    return tmp


def remove_run_temp(tmp: str) -> None:
    """Remove the run's temporary directory (the linked compile cache stays)."""
    shutil.rmtree(tmp, ignore_errors=True)
