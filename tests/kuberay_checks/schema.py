"""Layer 1: a manifest against its CRD's OpenAPI v3 schema, strictly (see the package docstring)."""

import json
import re

from kuberay_checks.files import crd_schemas

# The CRDs declare the root ``metadata`` as a bare object (the API server checks ObjectMeta itself).
OBJECT_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}
TRANSITION_RULES = {"self == oldSelf"}
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
PY_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'{path}["{key}"]'


def kind_of(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(value), type(value).__name__)


def type_errors(value, schema: dict, path: str) -> list[str]:
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected integer or string, got {kind_of(value)}"]
    wanted = schema.get("type")
    if wanted is None:
        return []
    if wanted == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif wanted == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, PY_TYPES[wanted])
    return [] if ok else [f"{path}: expected {wanted}, got {kind_of(value)}"]


def check(value, schema: dict, path: str) -> list[str]:
    """Errors of ``value`` against one schema node."""
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: null is not allowed"]
    errors = type_errors(value, schema, path)
    if errors:
        return errors
    if "anyOf" in schema and all(check(value, branch, path) for branch in schema["anyOf"]):
        errors.append(f"{path}: matches none of {schema['anyOf']}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        errors += object_errors(value, schema, path)
    elif isinstance(value, list):
        errors += array_errors(value, schema, path)
    else:
        errors += scalar_errors(value, schema, path)
    errors += [f"{path}: CEL rule {r['rule']!r} cannot be checked offline ({r.get('message', '')})"
               for r in schema.get("x-kubernetes-validations", []) if r["rule"] not in TRANSITION_RULES]
    return errors


def object_errors(value: dict, schema: dict, path: str) -> list[str]:
    errors = [f"{join(path, k)}: required field missing" for k in schema.get("required", []) if k not in value]
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    for key, item in value.items():
        where = join(path, key)
        if key in props:
            errors += check(item, props[key], where)
        elif isinstance(extra, dict):
            errors += check(item, extra, where)
        elif not (extra is True or preserve):
            errors.append(f"{where}: unknown field")
    return errors


def array_errors(value: list, schema: dict, path: str) -> list[str]:
    errors = []
    item_schema = schema.get("items") or {}
    for i, item in enumerate(value):
        errors += check(item, item_schema, join(path, i))
    if len(value) < schema.get("minItems", 0):
        errors.append(f"{path}: at least {schema['minItems']} item(s) required")
    list_type = schema.get("x-kubernetes-list-type")
    if list_type in ("map", "set"):
        errors += unique_errors(value, schema, item_schema, path)
    return errors


def unique_errors(value: list, schema: dict, item_schema: dict, path: str) -> list[str]:
    """``set``: items unique; ``map``: unique by the list-map keys (missing keys take their default)."""
    if schema["x-kubernetes-list-type"] == "set":
        keys = [json.dumps(v, sort_keys=True) for v in value]
    else:
        names = schema.get("x-kubernetes-list-map-keys", [])
        props = item_schema.get("properties", {})
        keys = [json.dumps({n: v.get(n, props.get(n, {}).get("default")) for n in names}, sort_keys=True)
                if isinstance(v, dict) else "" for v in value]
    return [f"{join(path, i)}: duplicate list entry {key}" for i, key in enumerate(keys) if key in keys[:i]]


def scalar_errors(value, schema: dict, path: str) -> list[str]:
    errors = []
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match the pattern {schema['pattern']}")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{path}: length {len(value)} outside [{schema.get('minLength', 0)}, {schema.get('maxLength')}]")
    elif is_int(value):
        low, high = INT_RANGES.get(schema.get("format"), (None, None))
        if "minimum" in schema:
            low = schema["minimum"] if low is None else max(low, schema["minimum"])
        if "maximum" in schema:
            high = schema["maximum"] if high is None else min(high, schema["maximum"])
        if (low is not None and value < low) or (high is not None and value > high):
            errors.append(f"{path}: {value} outside [{low}, {high}]")
    return errors


def schema_errors(doc: dict) -> list[str]:
    """The document against its CRD (chosen by ``kind``), strictly."""
    kind = doc.get("kind")
    if doc.get("apiVersion") != "ray.io/v1" or kind not in crd_schemas():
        return [f"apiVersion/kind {doc.get('apiVersion')}/{kind}: not a ray.io/v1 kind of {sorted(crd_schemas())}"]
    crd = crd_schemas()[kind]
    schema = {**crd, "properties": {**crd["properties"], "metadata": OBJECT_META}}
    return check(doc, schema, kind)
