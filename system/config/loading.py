"""Resolve a RunConfig: schema defaults, then YAML presets left to right, then dotted overrides.

A later layer deep-merges into the earlier ones, except that a mapping whose ``type`` changes
replaces the earlier mapping whole (switching ``correction.method.type`` drops the old
method's thresholds instead of failing on them).

The dotted overrides form one layer: they are first gathered into one nested mapping, so their
order does not matter (``correction.method.hi=2 correction.method.type=icepop`` is an icepop
with hi = 2, as is the reverse). A key given twice takes its last value; an override that sets
a key below another override's non-mapping value is an error.
"""

import difflib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from system.config.run import RunConfig


class ConfigError(ValueError):
    """A user error in a preset or an override; the message names the file or dotted key."""


def _merge(base: dict[str, Any], layer: dict[str, Any], switched: list | None = None,
           at: tuple[str, ...] = ()) -> dict[str, Any]:
    """``layer`` deep-merged into ``base``; ``switched`` collects ``(path, old mapping, new mapping)`` for
    every mapping a ``type`` change replaced whole."""
    out = dict(base)
    for key, value in layer.items():
        old = out.get(key)
        switches_type = (
            isinstance(old, dict) and isinstance(value, dict)
            and "type" in value and value.get("type") != old.get("type")
        )
        if isinstance(old, dict) and isinstance(value, dict) and not switches_type:
            out[key] = _merge(old, value, switched, (*at, key))
        else:
            if switches_type and switched is not None:
                switched.append(((*at, key), old, value))
            out[key] = value
    return out


_MERGE_TAG = "tag:yaml.org,2002:merge"
_YAML11_SURPRISE = re.compile(r"[-+]?(0[0-7_]+|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?)")
"""YAML 1.1 numbers that read as something else than they look: ``017`` is octal 15, ``1:30`` base 60
(90). YAML 1.2 dropped both; PyYAML still reads them so."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last
    silently, so a preset's earlier value would vanish without a word), and YAML 1.1's octal and
    base-60 numbers (``max_steps=1:30`` became 90). Merge keys (``<<: *anchor``) work as in YAML."""

    def _refuse_yaml11_number(self, node, kind: str):
        if _YAML11_SURPRISE.fullmatch(node.value):
            value = (super().construct_yaml_int if kind == "int" else super().construct_yaml_float)(node)
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} is a YAML 1.1 {'octal' if ':' not in node.value else 'base-60'} "
                f"number ({value}): write it in decimal, or quote it if it is text", node.start_mark)

    def construct_yaml_int(self, node):
        self._refuse_yaml11_number(node, "int")
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        self._refuse_yaml11_number(node, "float")
        return super().construct_yaml_float(node)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # ``<<``: the merged keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class raises its own error
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"key {key!r} appears twice (line {first.line + 1}, column {first.column + 1} and "
                    f"line {key_node.start_mark.line + 1}, column {key_node.start_mark.column + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _UniqueKeyLoader.construct_yaml_float)


def _load_yaml(text: str):
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _unique_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice (as the YAML loader does)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ConfigError(f"key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def read_preset(path: str | Path) -> dict[str, Any]:
    """Load one YAML preset as a mapping, naming the file on any error."""
    p = Path(path)
    try:
        if not p.is_file():
            what = "a directory" if p.is_dir() else "not a regular file" if p.exists() else "no such file"
            raise ConfigError(f"preset {str(p)!r}: {what}")
        text = p.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:  # unreadable, a name too long, not UTF-8
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"preset {str(p)!r}: cannot read it: {exc}") from None
    if p.suffix.lower() == ".json":  # a run's config.json, or a user's JSON: read as JSON (YAML reads a
        # JSON escape outside the BMP as two lone surrogates, and refuses JSON indented with tabs)
        try:
            data = json.loads(text, object_pairs_hook=_unique_json_keys) if text.strip() else None
        except (json.JSONDecodeError, ConfigError) as exc:
            raise ConfigError(f"preset {str(p)!r}: invalid JSON: {exc}") from None
    else:
        try:
            data = _load_yaml(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"preset {str(p)!r}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"preset {str(p)!r}: top level must be a mapping, got {type(data).__name__}")
    return data


_COMMENT = re.compile(r"(^|\s)#")
"""Where YAML would start a comment: a ``#`` first or after white space."""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one clause: what it expected and the column (an override is one line)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if not problem:
        return " ".join(str(exc).split())
    return f"{problem} at character {mark.column + 1} of the value" if mark is not None else problem


def _split_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``a.b.c=value`` -> ``(("a", "b", "c"), value)``, the value parsed as YAML, except that a ``#`` is
    part of the value: a plain YAML scalar would end at `` #`` (a comment), which on a command line
    silently cut ``prompt_template=... end with #### and the number`` after "with". A quoted value,
    a flow list or a flow mapping (``{...}``) is read by YAML, which keeps a ``#`` inside quotes."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: expected dotted.key=value")
    try:
        value = _load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({_yaml_problem(exc)}); a text value "
                          f"with YAML's special characters goes in quotes: \"{key}='...'\"") from None
    if _COMMENT.search(raw) and not raw.lstrip().startswith(("'", '"', "[", "{")):
        value = raw.strip()  # a plain scalar YAML would cut at the "comment": the text as typed
    return tuple(key.split(".")), value


def combine_overrides(overrides: list[str]) -> dict[str, Any]:
    """All dotted overrides as one nested mapping, independent of their order (see the module doc).

    Shorter keys go in first, so that ``a={b: 1}`` with ``a.b=2`` gives ``b = 2`` in either order.
    """
    by_key: dict[tuple[str, ...], tuple[Any, str]] = {}
    for text in overrides:
        key, value = _split_override(text)
        by_key[key] = (value, text)  # the same key again: the last value wins
    combined: dict[str, Any] = {}
    for key in sorted(by_key, key=len):
        value, text = by_key[key]
        node = combined
        for depth in range(1, len(key)):
            node = node.setdefault(key[depth - 1], {})
            if not isinstance(node, dict):
                other = next(by_key[key[:d]][1] for d in range(depth, 0, -1) if key[:d] in by_key)
                raise ConfigError(
                    f"override {text!r} sets a key below {'.'.join(key[:depth])}, "
                    f"which override {other!r} makes {node!r}, not a mapping"
                )
        node[key[-1]] = value
    return combined


def _user_path(loc: tuple, data: Any) -> tuple[tuple[str, ...], list[str]]:
    """A validation error's location as the user writes the key, without the tag pydantic adds for a
    member of a union on ``type`` (``data.task.gsm8k.path`` is the key ``data.task.path``), and the
    tags left out, as ``data.task is gsm8k``."""
    path, tags, node = [], [], data
    for part in loc:
        if isinstance(node, dict) and part not in node and node.get("type") == part:
            tags.append(f"{'.'.join(path)} is {part}")  # the union member's tag, not a key
            continue
        path.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    return tuple(path), tags


def _lookup(data: Any, path: tuple[str, ...]) -> bool:
    node = data
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _near_key(path: tuple[str, ...], merged: dict, unknown: set[tuple[str, ...]]) -> str | None:
    """The known key beside an unknown ``path`` whose name is closest to it (``difflib``, ratio >= 0.75),
    dotted; None when none is that close (a probe: ``max_step`` was refused without a hint)."""
    node: Any = merged
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not path or not isinstance(node, dict):
        return None
    known = [key for key in node if (*path[:-1], key) not in unknown]
    close = difflib.get_close_matches(path[-1], known, n=1, cutoff=0.75)
    return ".".join((*path[:-1], close[0])) if close else None


def _describe(exc: ValidationError, merged: dict, layers: list[tuple[str, dict]]) -> str:
    """One line per error: the dotted key as the user writes it, pydantic's message, a hint where YAML
    read a string field's value as another type, and the layer (preset or override) that set the key."""
    lines = []
    errors = exc.errors()
    unknown = {_user_path(e["loc"], merged)[0] for e in errors if e["type"] == "extra_forbidden"}
    for err in errors:
        path, tags = _user_path(err["loc"], merged)
        line = f"  {'.'.join(path) or '(top level)'}: {err['msg']}"
        if err["type"] == "extra_forbidden":  # tags: maybe a key of another member of the union
            notes = [", ".join(tags)] if tags else []
            if near := _near_key(path, merged, unknown):
                notes.append(f"did you mean {near}?")
            line += f" ({'; '.join(notes)})" if notes else ""
        value = err.get("input")
        if err["type"] == "string_type" and (isinstance(value, bool | int | float | dict | list)
                                             or type(value).__name__ in ("date", "datetime")):
            line += (f" (YAML read the value as {type(value).__name__} {value!r}: quote the text, "
                     f"\"{'.'.join(path)}='...'\")")
        source = next((name for name, layer in reversed(layers) if path and _lookup(layer, path)), None)
        if source is not None:
            line += f" [set by {source}]"
        lines.append(line)
    return "invalid config:\n" + "\n".join(lines)


def resolve_config(presets: list[str | Path] = (), overrides: list[str] = (),
                   fixed: tuple[str, dict[str, Any]] | None = None) -> RunConfig:
    """Compose presets and overrides into a validated RunConfig (raises ConfigError).

    ``fixed``: ``(source, mapping)``, a last layer of values that are not YAML text (a path given
    to a flag: ``("--resume", {"output_dir": "2024-01-01"})`` stays that string); errors in it are
    attributed to ``source``."""
    merged: dict[str, Any] = RunConfig().model_dump(mode="json", by_alias=True)
    layers = [(f"preset {str(path)!r}", read_preset(path)) for path in presets]
    layers.append(("the overrides", combine_overrides(list(overrides))))
    if fixed is not None:
        layers.append(fixed)
    for _, layer in layers:
        merged = _merge(merged, layer)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, merged, layers)) from None


def _at(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _type_defaults(path: tuple[str, ...], type_name: Any) -> dict[str, Any]:
    """The fields of the union member ``type_name`` at ``path`` with their defaults ({} if that alone does
    not validate)."""
    data = _merge(RunConfig().model_dump(mode="json", by_alias=True), _nested(path, {"type": type_name}))
    try:
        return _at(RunConfig.model_validate(data).model_dump(mode="json", by_alias=True), path) or {}
    except ValidationError:
        return {}


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for part in reversed(path):
        value = {part: value}
    return value


def type_switch_notes(presets: list[str | Path] = (), overrides: list[str] = (),
                      resolved: RunConfig | None = None) -> list[str]:
    """What a ``type`` switch between the layers put back to defaults, one line each, for the console.

    A mapping whose ``type`` a later layer changes is replaced whole (the module doc), so the fields an
    earlier layer set (a preset, or a resumed run's ``config.json``) and no later layer repeats take the
    new type's defaults: ``--resume DIR weight_sync.type=collective`` on a ``delta`` run with
    ``shared_memory=false`` runs with ``true``. Listed, per mapping, after its last switch: such fields
    the final type also has whose value changed, leaving out values that were the old type's own
    defaults (a resumed run's ``config.json`` holds every field). The schema's defaults are not a
    layer: ``correction.method.type=icepop`` alone reports nothing."""
    layers = [(f"preset {str(path)!r}", read_preset(path)) for path in presets]
    layers.append(("the overrides", combine_overrides(list(overrides))))
    if resolved is None:
        resolved = resolve_config(presets, overrides)
    now: Any = resolved.model_dump(mode="json", by_alias=True)
    merged: dict[str, Any] = RunConfig().model_dump(mode="json", by_alias=True)  # as resolve_config merges
    last: dict[tuple[str, ...], tuple[int, Any]] = {}  # per mapping: the layer of its last switch, the type before
    for index, (_, layer) in enumerate(layers):
        switched: list = []
        merged = _merge(merged, layer, switched)
        for path, old, _ in switched:
            last[path] = (index, old.get("type"))
    notes = []
    for path, (index, before) in last.items():
        node = _at(now, path)
        if not isinstance(node, dict):
            continue
        earlier: dict[str, Any] = {}  # what the layers before the last switch set here, the last value
        for _, layer in layers[:index]:
            if isinstance(sub := _at(layer, path), dict):
                earlier.update(sub)
        repeated = {k for _, layer in layers[index:] if isinstance(sub := _at(layer, path), dict) for k in sub}
        own = _type_defaults(path, before)
        reset = [f"{'.'.join(path)}.{k} ({json.dumps(v, default=str)} -> {json.dumps(node[k], default=str)})"
                 for k, v in earlier.items()
                 if k != "type" and k not in repeated and k in node and node[k] != v
                 and not (k in own and own[k] == v)]  # the old type's own default: nothing was set
        if reset:
            dotted, final = ".".join(path), node.get("type")
            notes.append(f"{dotted}.type {before} -> {final} ({layers[index][0]}) replaces {dotted} whole, "
                         f"so {', '.join(reset)} took {final}'s default; set {'it' if len(reset) == 1 else 'them'}"
                         " again beside the switch to keep the earlier value")
    return notes


def dump_config(config: RunConfig) -> str:
    """The resolved config as indented JSON, keys as users write them (``async``, not ``async_``)."""
    return json.dumps(config.model_dump(mode="json", by_alias=True), indent=2, ensure_ascii=False)
