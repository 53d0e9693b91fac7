"""Checks of output directories before a command starts anything (nothing is created here)."""

import os
from pathlib import Path

from system.config.loading import ConfigError


def check_output_dir(path: str | Path, what: str = "output_dir") -> None:
    """Raise ConfigError, naming ``what``, unless ``path`` is a writable directory or can be created.

    Refused: an existing non-directory, a broken symbolic link, a path below a non-directory,
    and a directory (or the nearest existing parent of a new one) that this user cannot write.
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
            return
        parent = p.absolute().parent
        while not os.path.lexists(parent):  # ends at the root, which exists
            parent = parent.parent
        if not parent.is_dir():
            raise ConfigError(f"{what} {str(p)!r} cannot be created: {str(parent)!r} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} {str(p)!r} cannot be created: {str(parent)!r} is not writable")
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, ...
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{what} {str(p)!r} is not a usable directory: {exc}") from None
