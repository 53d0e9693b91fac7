"""Resolve a RunConfig: schema defaults, then YAML presets left to right, then dotted overrides.

A later layer deep-merges into the earlier ones, except that a mapping whose ``type`` changes
replaces the earlier mapping whole (switching ``correction.method.type`` drops the old
method's thresholds instead of failing on them).
"""

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from system.config.run import RunConfig


class ConfigError(ValueError):
    """A user error in a preset or an override; the message names the file or dotted key."""


def _merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in layer.items():
        old = out.get(key)
        switches_type = (
            isinstance(old, dict) and isinstance(value, dict)
            and "type" in value and value.get("type") != old.get("type")
        )
        if isinstance(old, dict) and isinstance(value, dict) and not switches_type:
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


def read_preset(path: str | Path) -> dict[str, Any]:
    """Load one YAML preset as a mapping, naming the file on any error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"preset {str(p)!r}: no such file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"preset {str(p)!r}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"preset {str(p)!r}: top level must be a mapping, got {type(data).__name__}")
    return data


def parse_override(text: str) -> dict[str, Any]:
    """``a.b.c=value`` -> ``{"a": {"b": {"c": value}}}``, the value parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: expected dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from exc
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {path}: {err['msg']}")
    return "invalid config:\n" + "\n".join(lines)


def resolve_config(presets: list[str | Path] = (), overrides: list[str] = ()) -> RunConfig:
    """Compose presets and overrides into a validated RunConfig (raises ConfigError)."""
    merged: dict[str, Any] = RunConfig().model_dump(mode="json", by_alias=True)
    for path in presets:
        merged = _merge(merged, read_preset(path))
    for text in overrides:
        merged = _merge(merged, parse_override(text))
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def dump_config(config: RunConfig) -> str:
    """The resolved config as indented JSON, keys as users write them (``async``, not ``async_``)."""
    return json.dumps(config.model_dump(mode="json", by_alias=True), indent=2)


def load_resolved(path: str | Path) -> RunConfig:
    """Read back a ``config.json`` written by :func:`dump_config`."""
    try:
        return RunConfig.model_validate_json(Path(path).read_text())
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None
