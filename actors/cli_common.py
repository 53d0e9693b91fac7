"""What every ``aisrl`` command shares: the console (stderr), the one-line failure, path and argument parsing."""

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from system.config import ConfigError
from system.config.base import expand_home as home_expanded

console = Console(stderr=True, soft_wrap=True)  # off a terminal rich would wrap at 80 columns mid-field


def say(text: str, label: str = "", style: str = "") -> None:
    """One line on stderr, ``label`` in ``style`` before ``text``. The text is escaped: it holds what the user
    typed (an override, a path), and rich reads ``[...]`` as markup: ``rollout.stop=[a`` in an error lost
    everything up to the next ``]``."""
    head = f"[{style}]{label}[/] " if label else ""
    console.print(head + escape(text), highlight=False)


def fail(message: str) -> None:
    say(message, "error:", "bold red")
    raise typer.Exit(code=2)


def expand_home(path: Path | None) -> Path | None:
    """``~`` expanded in a path argument: the shell leaves ``--out=~/x`` and ``"~/x"`` as they are, and
    ``output_dir=~/x`` is expanded (a literal ``./~`` directory was made; found by a probe)."""
    if path is None:
        return None
    try:
        return Path(home_expanded(str(path)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """Presets (``*.yaml`` / ``*.yml`` / ``*.json`` files) and ``dotted.key=value`` overrides. An
    existing preset file whose path holds ``=`` (``runs/lr=3e-4/base.yaml``) is a preset."""
    presets, overrides = [], []
    for arg in args:
        if arg.endswith((".yaml", ".yml", ".json")) and os.path.isfile(os.path.expanduser(arg)):
            presets.append(os.path.expanduser(arg))
        elif "=" in arg:
            overrides.append(arg)
        elif arg.endswith((".yaml", ".yml", ".json")):
            presets.append(arg)
        else:
            raise ConfigError(f"argument {arg!r} is neither a preset file (.yaml) nor a dotted.key=value override")
    return presets, overrides
