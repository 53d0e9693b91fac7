"""Paths of a run before it starts anything: output directories checked (nothing is created here),
the run's local paths made absolute, and its input files checked."""

import os
import tempfile
from pathlib import Path

from system.config.loading import ConfigError
from system.config.run import RunConfig

_LOCAL_PREFIXES = ("/", "./", "../", "~")
"""A ``model.path`` that starts with one of these is a local directory, never a hub id (``org/name``)."""


def looks_local(model_path: str) -> bool:
    """Whether a pretrained ``model.path`` names a local directory: it exists here, or is written as a
    path (``/``, ``./``, ``../``, ``~``); otherwise it is a hub id."""
    return model_path.startswith(_LOCAL_PREFIXES) or model_path in (".", "..") or os.path.exists(model_path)


def with_absolute_paths(cfg: RunConfig, cwd: str | Path | None = None) -> RunConfig:
    """``cfg`` with ``output_dir`` and a pretrained model's local ``model.path`` absolute against ``cwd``
    (default: this process's): the paths actors open. The driver hands its config to actors whose
    working directory is not the user's (on a joined cluster: wherever its raylet was started), where
    a relative path would name another place. ``data.task.path`` stays as given: only the driver reads
    it (a relative one keeps resolving against a resubmitted job's own copy of the data)."""
    base = Path(cwd) if cwd is not None else Path.cwd()

    def absolute(path: str) -> str:
        path = os.path.expanduser(path)
        return path if os.path.isabs(path) else str(base / path)

    model = cfg.model
    if model.type == "pretrained" and looks_local(model.path):
        model = model.model_copy(update={"path": absolute(model.path)})
    return cfg.model_copy(update={"output_dir": absolute(cfg.output_dir), "model": model})


def check_input_paths(cfg: RunConfig) -> None:
    """Raise ConfigError, naming the field, when a file task's ``data.task.path`` is not a file, or a
    pretrained model's local ``model.path`` is not a directory (what the run would fail on later, after
    starting its cluster: ``--dry-run`` says it too)."""
    path = getattr(cfg.data.task, "path", None)
    if path is not None and not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        where = "" if os.path.isabs(path) else f"; a relative path is read from the directory aisrl runs in, {os.getcwd()}"
        raise ConfigError(f"data.task.path: {path} {what} (a .jsonl or .parquet file{where}; on a resume "
                          "pass data.task.path=... to read it from where it is now)")
    if cfg.model.type == "pretrained" and looks_local(cfg.model.path) and not os.path.isdir(
            os.path.expanduser(cfg.model.path)):
        raise ConfigError(f"model.path: {cfg.model.path} is not a directory (a local path; a hub id is written "
                          "org/name, e.g. Qwen/Qwen2.5-1.5B-Instruct)")


def check_output_dir(path: str | Path, what: str = "output_dir") -> None:
    """Raise ConfigError, naming ``what``, unless ``path`` is a writable directory or can be created.

    Refused: an existing non-directory, a broken symbolic link, a path below a non-directory,
    and a directory (or the nearest existing parent of a new one) that this user cannot write, or
    that cannot be made: a new one is created and removed again (:func:`_try_create`).
    """
    p = Path(path)
    try:
        if p.is_symlink() and not p.exists():
            raise ConfigError(f"{what} {str(p)!r} is a broken symbolic link")
        if p.exists():
            if not p.is_dir():
                raise ConfigError(f"{what} {str(p)!r} exists and is not a directory")
            if not os.access(p, os.W_OK | os.X_OK):
                raise ConfigError(f"{what} {str(p)!r} is not writable")
            _try_write(p, what)
            return
        parent = p.absolute().parent
        while not os.path.lexists(parent):  # ends at the root, which exists
            parent = parent.parent
        if not parent.is_dir():
            raise ConfigError(f"{what} {str(p)!r} cannot be created: {str(parent)!r} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} {str(p)!r} cannot be created: {str(parent)!r} is not writable")
        _try_create(p, what)
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, ...
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{what} {str(p)!r} is not a usable directory: {exc}") from None


def _try_write(p: Path, what: str) -> None:
    """Create a file in the existing directory ``p`` and remove it again: the permission bits do not say
    everything (a probe: root's dry runs accepted ``output_dir=/proc`` and ``/sys/kernel``, where no file
    can be made)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".aisrl-write-check-", dir=p)
    except OSError as exc:
        raise ConfigError(f"{what} {str(p)!r} cannot hold files: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(name)


def _try_create(p: Path, what: str) -> None:
    """Create the missing directories down to ``p`` (below the nearest one that exists), one at a time,
    and remove again those this call created, newest first: the permission bits do not say everything (root
    may write anywhere by them, yet ``/proc/x`` cannot be created; a probe's run was refused only after
    its cluster had started). One that another process creates meanwhile is taken as it is, and kept."""
    target = Path(os.path.abspath(p))  # ``a/../b`` as the file system will read it
    missing = []
    while not os.path.lexists(target):  # ends at the root at the latest
        missing.append(target)
        target = target.parent
    made = []
    try:
        for part in reversed(missing):
            try:
                os.mkdir(part)
            except FileExistsError:
                continue  # made meanwhile by someone else: theirs
            made.append(part)
    except OSError as exc:
        raise ConfigError(f"{what} {str(p)!r} cannot be created: {exc.strerror or exc}") from None
    finally:
        for part in reversed(made):
            try:
                os.rmdir(part)
            except OSError:
                break  # someone else's file arrived meanwhile: leave it (and the directories above it)
