"""``WANDB_MODE`` in the environment (``system.config.environment``): honoured over presets and the
default, not over a command-line override. Found by a probe: ``WANDB_MODE=disabled`` still wrote an
offline W&B run; ``WANDB_MODE=offline`` with a preset's ``online`` tried online (and, unreachable,
kept no W&B record)."""

import json

import pytest
from typer.testing import CliRunner

from actors.cli import app
from system.config import ConfigError, resolve_config
from system.config.environment import apply_environment


def mode_of(env: dict, overrides: list[str] = ()) -> tuple[str, list[str]]:
    cfg, notes = apply_environment(resolve_config([], list(overrides)), env, list(overrides))
    return cfg.report.wandb.mode, notes


def test_the_variable_wins_over_the_default_and_is_said():
    assert mode_of({}) == ("offline", [])  # the default, nothing said
    assert mode_of({"WANDB_MODE": "offline"}) == ("offline", [])  # agrees: nothing said
    mode, [note] = mode_of({"WANDB_MODE": "disabled"})
    assert mode == "disabled"
    assert note == "WANDB_MODE=disabled in the environment: W&B runs disabled (report.wandb.mode was offline)"
    assert mode_of({"WANDB_MODE": "dryrun"})[0] == "offline" and mode_of({"WANDB_MODE": "run"})[0] == "online"
    assert mode_of({"WANDB_MODE": ""}) == ("offline", [])  # set but empty: as unset


def test_a_preset_loses_to_the_variable_and_a_command_line_override_wins_over_it(tmp_path):
    preset = tmp_path / "online.yaml"
    preset.write_text("report:\n  wandb:\n    mode: online\n")
    cfg, notes = apply_environment(resolve_config([str(preset)], []), {"WANDB_MODE": "offline"}, [])
    assert cfg.report.wandb.mode == "offline" and len(notes) == 1
    assert mode_of({"WANDB_MODE": "offline"}, ["report.wandb.mode=online"]) == ("online", [])


def test_an_unknown_mode_is_refused_naming_the_variable():
    with pytest.raises(ConfigError, match=r"WANDB_MODE='shared-ish' in the environment is not one of online"):
        mode_of({"WANDB_MODE": "shared-ish"})


def test_the_dry_run_prints_the_mode_the_run_will_use(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    result = CliRunner().invoke(app, ["train", "--dry-run", f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["report"]["wandb"]["mode"] == "disabled"
    assert "note: WANDB_MODE=disabled in the environment" in result.stderr
