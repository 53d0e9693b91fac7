"""Offline validation of KubeRay manifests (used by ``tests/test_deploy_manifests.py``).

Three layers, each a function returning error strings that name the field:

1. ``schema_errors``: the CRD's OpenAPI v3 schema (``../shared/kuberay-crds``), applied the way
   the API server applies a structural schema, but strict: a field the schema does not declare
   fails (the API server would silently prune it) unless the schema says
   ``x-kubernetes-preserve-unknown-fields`` at that node. Also types (int-or-string, nullable),
   enums, required, patterns, int32 ranges, list-map key uniqueness; CEL rules other than
   transition rules (``self == oldSelf``, moot on create) cannot be evaluated and fail.
2. ``operator_errors``: what KubeRay's admission checks and webhook reject (its
   ``validation.go``): names, containers, replicas bounds, unique group names, resources set
   twice, labels, token auth needs Ray >= 2.52, RayJob modes, TTL, deadlines, runtimeEnvYAML.
3. ``policy_errors``: this project's rules: token auth on, no dashboard on a LoadBalancer /
   NodePort / ingress, the W&B key only from a secretKeyRef (never a literal value), no secret in
   runtimeEnvYAML, RayJobs shut their cluster down.

Deliberately broken manifests, made by mutating the shipped ones, must each fail for their reason.
"""

import functools
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = ROOT.parent / "shared" / "kuberay-crds"
KUBERAY = ROOT / "deploy" / "kuberay"
ENTRYPOINT = "aisrl train configs/gpu_qwen25_1p5b_gsm8k.yaml configs/multinode.yaml"

if not CRD_DIR.is_dir():
    pytest.skip(f"KubeRay CRD schemas not found at {CRD_DIR} (the repo is expected with shared/ beside it)",
                allow_module_level=True)


# -- loading -------------------------------------------------------------------------------------

class StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a manifest with one is an error."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        dupes = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if dupes:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key(s) {dupes}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=StrictLoader) if d is not None]


@functools.cache
def crd_schemas() -> dict[str, dict]:
    """``{kind: openAPIV3Schema}`` of the served ``ray.io/v1`` version of each CRD."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"]]
        out[crd["spec"]["names"]["kind"]] = v1["schema"]["openAPIV3Schema"]
    return out


def shipped() -> list[tuple[str, dict]]:
    return [(f"{p.name}#{i}", d) for p in sorted(KUBERAY.glob("*.yaml")) for i, d in enumerate(load_docs(p))]


def shipped_kind(kind: str) -> dict:
    [doc] = [d for _, d in shipped() if d.get("kind") == kind]
    return doc


# -- 1. the CRD schema, strictly -----------------------------------------------------------------

# The CRDs declare the root ``metadata`` as a bare object (the API server checks ObjectMeta itself).
OBJECT_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}
TRANSITION_RULES = {"self == oldSelf"}
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
PY_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


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


# -- 2. KubeRay's admission rules ----------------------------------------------------------------

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
MAX_NAME = {"RayCluster": 53, "RayJob": 47}
RAY_START_RESOURCE_KEYS = ("num-cpus", "num-gpus", "memory", "resources")


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def groups(spec: dict) -> list[tuple[str, dict]]:
    """``(label, group)`` for the head and each worker group (label names the group in errors)."""
    workers = spec.get("workerGroupSpecs") or []
    return [("headGroupSpec", spec.get("headGroupSpec") or {})] + [
        (f"worker group {g.get('groupName')}", g) for g in workers if isinstance(g, dict)]


def label_errors(labels: dict, where: str) -> list[str]:
    errors = []
    for key, val in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if not (LABEL_NAME.fullmatch(name) and len(name) <= 63) or (prefix and not DNS1123_SUBDOMAIN.fullmatch(prefix)):
            errors.append(f"{where}: invalid label key {key!r}")
        if not isinstance(val, str) or len(val) > 63 or (val and not LABEL_NAME.fullmatch(val)):
            errors.append(f"{where}: invalid label value {val!r} for {key!r}")
    return errors


def group_errors(label: str, group: dict) -> list[str]:
    errors = []
    if not ((group.get("template") or {}).get("spec") or {}).get("containers"):
        errors.append(f"{label}: needs at least one container")
    params = group.get("rayStartParams") or {}
    if group.get("resources") and any(params.get(k) for k in RAY_START_RESOURCE_KEYS):
        errors.append(f"{label}: resources set in both rayStartParams and resources; use one")
    if "labels" in params:
        errors.append(f"{label}: rayStartParams['labels'] is not supported; use the group's labels field")
    return errors + label_errors(group.get("labels"), label)


def replica_errors(spec: dict) -> list[str]:
    errors = []
    autoscaling = spec.get("enableInTreeAutoscaling") is True
    for label, g in groups(spec)[1:]:
        low, high, n = g.get("minReplicas"), g.get("maxReplicas"), g.get("replicas")
        if not autoscaling and (low is None or high is None):
            errors.append(f"{label}: must set both minReplicas and maxReplicas when autoscaling is disabled")
        if not all(is_int(x) for x in (low, high, n)):
            continue
        if low < 0 or high < 0:
            errors.append(f"{label}: negative minReplicas/maxReplicas")
        if low > high:
            errors.append(f"{label}: minReplicas {low} greater than maxReplicas {high}")
        elif not low <= n <= high:
            errors.append(f"{label}: replicas {n} outside [minReplicas {low}, maxReplicas {high}]")
    names = [g.get("groupName") for _, g in groups(spec)[1:]]
    errors += [f"worker group names must be unique: {n!r} repeats" for n in sorted({n for n in names if names.count(n) > 1}, key=str)]
    return errors


def version_tuple(text) -> tuple[int, ...] | None:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""))
    return tuple(int(x or 0) for x in match.groups()) if match else None


def cluster_errors(spec: dict) -> list[str]:
    errors = [e for label, g in groups(spec) for e in group_errors(label, g)] + replica_errors(spec)
    if (spec.get("authOptions") or {}).get("mode") == "token":
        version = version_tuple(spec.get("rayVersion"))
        if version is None or version < (2, 52, 0):
            errors.append(f"authOptions.mode is 'token' but rayVersion {spec.get('rayVersion')!r} is not >= 2.52.0")
    return errors


def job_errors(spec: dict) -> list[str]:
    errors, mode = [], spec.get("submissionMode", "K8sJobMode")
    shutdown = spec.get("shutdownAfterJobFinishes") is True
    ttl, deadline, backoff = spec.get("ttlSecondsAfterFinished", 0), spec.get("activeDeadlineSeconds"), spec.get("backoffLimit")
    if mode not in SUBMISSION_MODES:
        errors.append(f"submissionMode {mode!r} is not one of {SUBMISSION_MODES}")
    if is_int(ttl) and ttl < 0:
        errors.append("ttlSecondsAfterFinished must be non-negative")
    if is_int(ttl) and ttl > 0 and not shutdown:
        errors.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true")
    if spec.get("suspend") and not shutdown:
        errors.append("suspend needs shutdownAfterJobFinishes: true")
    if not spec.get("rayClusterSpec") and not spec.get("clusterSelector"):
        errors.append("one of rayClusterSpec or clusterSelector must be set")
    if spec.get("clusterSelector") and mode == "SidecarMode":
        errors.append("clusterSelector is not supported in SidecarMode")
    if mode == "InteractiveMode" and is_int(backoff) and backoff > 0:
        errors.append("backoffLimit is incompatible with InteractiveMode")
    if mode == "SidecarMode" and (spec.get("submitterPodTemplate") or spec.get("submitterConfig")):
        errors.append("SidecarMode supports neither submitterPodTemplate nor submitterConfig")
    if is_int(deadline) and deadline <= 0:
        errors.append("activeDeadlineSeconds must be a positive integer")
    if is_int(backoff) and backoff < 0:
        errors.append("backoffLimit must be non-negative")
    return errors + runtime_env_errors(spec)


def runtime_env(spec: dict) -> dict:
    """The parsed runtimeEnvYAML (raises yaml.YAMLError / ValueError)."""
    parsed = yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}
    if not isinstance(parsed, dict):
        raise ValueError(f"top level is a {kind_of(parsed)}, not a mapping")
    return parsed


def runtime_env_errors(spec: dict) -> list[str]:
    try:
        runtime_env(spec)
    except (yaml.YAMLError, ValueError) as exc:
        return [f"runtimeEnvYAML: not a valid YAML mapping: {str(exc).splitlines()[0]}"]
    return []


def operator_errors(doc: dict) -> list[str]:
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    name = str((doc.get("metadata") or {}).get("name", ""))
    errors = []
    if not DNS1035.fullmatch(name) or len(name) > MAX_NAME.get(kind, 53):
        errors.append(f"metadata.name {name!r}: must be a DNS-1035 label of at most {MAX_NAME.get(kind, 53)} characters")
    if kind == "RayJob":
        errors += job_errors(spec)
        spec = spec.get("rayClusterSpec") or {}
    return errors + (cluster_errors(spec) if spec else [])


# -- 3. this project's policy --------------------------------------------------------------------

SECRET_MARKERS = ("API_KEY", "TOKEN", "SECRET", "PASSWORD")
EXPOSED = ("LoadBalancer", "NodePort")


def containers(spec: dict) -> list[tuple[str, dict]]:
    return [(f"{label} container {c.get('name')}", c) for label, g in groups(spec)
            for c in ((g.get("template") or {}).get("spec") or {}).get("containers") or []]


def secret_env_errors(spec: dict) -> list[str]:
    errors = []
    for where, container in containers(spec):
        env = {e.get("name"): e for e in container.get("env") or []}
        for name, var in env.items():
            if any(m in str(name).upper() for m in SECRET_MARKERS) and "value" in var:
                errors.append(f"{where}: {name} has a literal value; take it from a secretKeyRef")
        wandb = env.get("WANDB_API_KEY")
        if wandb is None or not (wandb.get("valueFrom") or {}).get("secretKeyRef"):
            errors.append(f"{where}: WANDB_API_KEY must come from env.valueFrom.secretKeyRef")
    return errors


def exposure_errors(spec: dict) -> list[str]:
    head = spec.get("headGroupSpec") or {}
    errors = []
    if head.get("serviceType") in EXPOSED:
        errors.append(f"headGroupSpec.serviceType {head['serviceType']} exposes the dashboard; use ClusterIP")
    service_type = ((head.get("headService") or {}).get("spec") or {}).get("type")
    if service_type in EXPOSED:
        errors.append(f"headGroupSpec.headService.spec.type {service_type} exposes the dashboard; use ClusterIP")
    if head.get("enableIngress") is True:
        errors.append("headGroupSpec.enableIngress exposes the dashboard; reach it with kubectl port-forward")
    return errors


def policy_errors(doc: dict) -> list[str]:
    spec, errors = doc.get("spec") or {}, []
    if doc.get("kind") == "RayJob":
        if spec.get("shutdownAfterJobFinishes") is not True:
            errors.append("RayJob: shutdownAfterJobFinishes must be true (the cluster is deleted after the run)")
        try:
            env_vars = runtime_env(spec).get("env_vars") or {}
        except (yaml.YAMLError, ValueError):
            env_vars = {}
        errors += [f"runtimeEnvYAML.env_vars.{n}: secrets must not go into the runtime env (the Jobs API shows it)"
                   for n in env_vars if any(m in str(n).upper() for m in SECRET_MARKERS)]
        spec = spec.get("rayClusterSpec") or {}
    if not spec:
        return errors
    if (spec.get("authOptions") or {}).get("mode") != "token":
        errors.append("authOptions.mode must be 'token' (Ray token authentication)")
    return errors + exposure_errors(spec) + secret_env_errors(spec)


def all_errors(doc: dict) -> list[str]:
    return schema_errors(doc) + operator_errors(doc) + policy_errors(doc)


# -- the shipped manifests -----------------------------------------------------------------------
