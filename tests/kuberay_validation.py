"""Offline validation of KubeRay manifests (used by ``tests/test_deploy_manifests.py``).

Layers, each a function returning error strings that name the field:

1. ``schema_errors``: the CRD's OpenAPI v3 schema, applied the way the API server applies a
   structural schema, but strict: a field the schema does not declare fails (the API server would
   silently prune it) unless the schema says ``x-kubernetes-preserve-unknown-fields`` at that node.
   Also types (int-or-string, nullable), enums, required, patterns, int32 ranges, list-map key
   uniqueness; CEL rules other than transition rules (``self == oldSelf``, moot on create) cannot
   be evaluated and fail. The CRDs are not part of the repository: they are read from
   ``$AISRL_KUBERAY_CRDS``, by default ``../shared/kuberay-crds`` beside the checkout (CI has it);
   where that directory is missing, this layer alone is skipped (``HAVE_CRDS``).
2. ``operator_errors``: what KubeRay's admission checks and webhook reject (its
   ``validation.go``): names, containers, replicas bounds, unique group names, resources set
   twice, labels, token auth needs Ray >= 2.52, RayJob modes, TTL, deadlines, runtimeEnvYAML.
3. ``policy_errors``: this project's rules: token auth on, no dashboard on a LoadBalancer /
   NodePort / ingress, the W&B key only from a secretKeyRef (never a literal value), no secret in
   runtimeEnvYAML, RayJobs shut their cluster down, and every container of every pod (the
   cluster's and the RayJob's submitter) locked down: non-root as the image's user, no privilege
   escalation, all capabilities dropped, a confining seccomp profile, no host namespaces.
4. ``network_policy_errors``: a NetworkPolicy (a core kind, absent from the KubeRay CRDs) against
   the structure of ``networking.k8s.io/v1``, written out here.
5. ``isolation_errors``: across the documents of one file: a NetworkPolicy restricts ingress to
   every pod of the cluster (head and each worker group), and whatever it admits is a pod of the
   same cluster, except the RayJob's submitter and the KubeRay operator on the dashboard port.

``manifest_errors`` runs them all over one file. Deliberately broken manifests, made by mutating
the shipped ones, must each fail for their reason.
"""

import functools
import ipaddress
import json
import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = Path(os.environ.get("AISRL_KUBERAY_CRDS") or ROOT.parent / "shared" / "kuberay-crds")
HAVE_CRDS = CRD_DIR.is_dir()
needs_crds = pytest.mark.skipif(
    not HAVE_CRDS,
    reason=f"KubeRay CRD schema check: runs where {CRD_DIR} exists (../shared/kuberay-crds beside "
           "the checkout, as in CI; or set AISRL_KUBERAY_CRDS)")
KUBERAY = ROOT / "deploy" / "kuberay"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ENTRYPOINT = "aisrl train configs/gpu_qwen25_1p5b_gsm8k.yaml configs/multinode.yaml"
RAY_KINDS = ("RayCluster", "RayJob")


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
    if not HAVE_CRDS:
        raise FileNotFoundError(f"no KubeRay CRDs at {CRD_DIR} (set AISRL_KUBERAY_CRDS)")
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"]]
        out[crd["spec"]["names"]["kind"]] = v1["schema"]["openAPIV3Schema"]
    return out


def shipped_files() -> dict[str, list[dict]]:
    """``{file name: its documents}`` of ``deploy/kuberay/``."""
    return {p.name: load_docs(p) for p in sorted(KUBERAY.glob("*.yaml"))}


def shipped() -> list[tuple[str, dict]]:
    return [(f"{name}#{i}", d) for name, docs in shipped_files().items() for i, d in enumerate(docs)]


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


@functools.cache
def image_uid() -> int:
    """The uid the image runs as: the last ``USER`` of deploy/Dockerfile, which must be numeric
    (with a user name, Kubernetes cannot verify runAsNonRoot without a runAsUser)."""
    users = re.findall(r"^USER\s+(\S+)", DOCKERFILE.read_text(), flags=re.M)
    match = re.fullmatch(r"(\d+)(?::\d+)?", users[-1] if users else "")
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{DOCKERFILE}: the last USER ({users[-1:]}) is not a numeric non-root uid")
    return int(match.group(1))


def pod_specs(doc: dict) -> list[tuple[str, dict | None]]:
    """``(label, pod spec)`` of every kind of pod the document makes: each group's, and a RayJob's
    submitter (``submitterPodTemplate``; None when the RayJob leaves KubeRay's default)."""
    spec, out = doc.get("spec") or {}, []
    if doc.get("kind") == "RayJob":
        if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
            out.append(("submitterPodTemplate", (spec.get("submitterPodTemplate") or {}).get("spec")))
        spec = spec.get("rayClusterSpec")
    if spec:
        out = [(label, (g.get("template") or {}).get("spec") or {}) for label, g in groups(spec)] + out
    return out


def container_security_errors(where: str, container: dict, pod_context: dict) -> list[str]:
    """One container, its securityContext falling back to the pod's where Kubernetes does."""
    own = container.get("securityContext") or {}

    def effective(key):
        return own[key] if key in own else pod_context.get(key)

    at, errors = f"{where}: securityContext", []
    if effective("runAsNonRoot") is not True:
        errors.append(f"{at}.runAsNonRoot must be true (in the container's or the pod's securityContext)")
    if effective("runAsUser") != image_uid():
        errors.append(f"{at}.runAsUser is {effective('runAsUser')!r}; must be {image_uid()}, the image's "
                      "non-root user (deploy/Dockerfile)")
    if own.get("allowPrivilegeEscalation") is not False:
        errors.append(f"{at}.allowPrivilegeEscalation must be false (Kubernetes' default is true)")
    if own.get("privileged") is True:
        errors.append(f"{at}.privileged must not be true")
    capabilities = own.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        errors.append(f"{at}.capabilities.drop must contain ALL")
    if capabilities.get("add"):
        errors.append(f"{at}.capabilities.add must be empty, not {capabilities['add']}")
    seccomp = (effective("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        errors.append(f"{at}.seccompProfile.type is {seccomp!r}; must be RuntimeDefault or Localhost")
    return errors


def pod_security_errors(doc: dict) -> list[str]:
    errors = []
    for label, pod in pod_specs(doc):
        if pod is None:
            errors.append(f"{label} missing: KubeRay's default submitter pod has no securityContext; "
                          "give a locked-down one")
            continue
        errors += [f"{label}: {key} must not be true (it shares the node's namespace)"
                   for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key) is True]
        for key in ("initContainers", "containers"):
            for c in pod.get(key) or []:
                where = f"{label} {'initContainer' if key == 'initContainers' else 'container'} {c.get('name')}"
                errors += container_security_errors(where, c, pod.get("securityContext") or {})
    return errors


def policy_errors(doc: dict) -> list[str]:
    spec, errors = doc.get("spec") or {}, pod_security_errors(doc)
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


# -- 4. NetworkPolicy (a core kind: no CRD; networking.k8s.io/v1 written out here) ---------------

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
PROTOCOLS = ("TCP", "UDP", "SCTP")
PORT_NAME = re.compile(r"(?=.*[a-z])(?!.*--)[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def unknown_fields(obj: dict, allowed: tuple[str, ...], path: str) -> list[str]:
    return [f"{join(path, k)}: unknown field" for k in obj if k not in allowed]


def selector_errors(selector, path: str) -> list[str]:
    if not isinstance(selector, dict):
        return [f"{path}: expected object, got {kind_of(selector)}"]
    errors = unknown_fields(selector, ("matchLabels", "matchExpressions"), path)
    labels = selector.get("matchLabels") or {}
    if isinstance(labels, dict):
        errors += label_errors(labels, f"{path}.matchLabels")
    else:
        errors.append(f"{path}.matchLabels: expected object, got {kind_of(labels)}")
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        at = join(f"{path}.matchExpressions", i)
        if not isinstance(expr, dict):
            errors.append(f"{at}: expected object, got {kind_of(expr)}")
            continue
        errors += unknown_fields(expr, ("key", "operator", "values"), at)
        op, values = expr.get("operator"), expr.get("values")
        if not isinstance(expr.get("key"), str) or not expr.get("key"):
            errors.append(f"{at}.key: required field missing")
        if op not in SELECTOR_OPERATORS:
            errors.append(f"{at}.operator: {op!r} is not one of {SELECTOR_OPERATORS}")
        elif op in ("In", "NotIn") and not (isinstance(values, list) and values and all(isinstance(v, str) for v in values)):
            errors.append(f"{at}.values: {op} needs a non-empty list of strings")
        elif op in ("Exists", "DoesNotExist") and values:
            errors.append(f"{at}.values: must be empty for {op}")
    return errors


def cidr_errors(text, path: str) -> list[str]:
    try:
        ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        return [f"{path}: {text!r} is not a CIDR"]
    return [] if isinstance(text, str) and "/" in text else [f"{path}: {text!r} is not a CIDR"]


def peer_errors(peer, path: str) -> list[str]:
    if not isinstance(peer, dict):
        return [f"{path}: expected object, got {kind_of(peer)}"]
    errors = unknown_fields(peer, ("podSelector", "namespaceSelector", "ipBlock"), path)
    if not peer:
        errors.append(f"{path}: needs podSelector, namespaceSelector or ipBlock")
    errors += [e for key in ("podSelector", "namespaceSelector") if key in peer
               for e in selector_errors(peer[key], f"{path}.{key}")]
    if "ipBlock" in peer:
        if "podSelector" in peer or "namespaceSelector" in peer:
            errors.append(f"{path}.ipBlock: may not be combined with a podSelector or namespaceSelector")
        block = peer["ipBlock"] if isinstance(peer["ipBlock"], dict) else {}
        errors += unknown_fields(block, ("cidr", "except"), f"{path}.ipBlock")
        errors += cidr_errors(block.get("cidr"), f"{path}.ipBlock.cidr")
        errors += [e for i, c in enumerate(block.get("except") or []) for e in cidr_errors(c, f"{path}.ipBlock.except[{i}]")]
    return errors


def port_errors(entry, path: str) -> list[str]:
    if not isinstance(entry, dict):
        return [f"{path}: expected object, got {kind_of(entry)}"]
    errors = unknown_fields(entry, ("protocol", "port", "endPort"), path)
    if entry.get("protocol", "TCP") not in PROTOCOLS:
        errors.append(f"{path}.protocol: {entry['protocol']!r} is not one of {PROTOCOLS}")
    port, end = entry.get("port"), entry.get("endPort")
    if is_int(port):
        if not 1 <= port <= 65535:
            errors.append(f"{path}.port: {port} outside [1, 65535]")
    elif isinstance(port, str):
        if not (len(port) <= 15 and PORT_NAME.fullmatch(port)):
            errors.append(f"{path}.port: {port!r} is not a port name")
    elif port is not None:
        errors.append(f"{path}.port: expected integer or string, got {kind_of(port)}")
    if end is not None and not (is_int(end) and is_int(port) and port <= end <= 65535):
        errors.append(f"{path}.endPort: {end!r} needs a numeric port <= endPort <= 65535")
    return errors


def rule_errors(rule, path: str, peers_key: str) -> list[str]:
    if not isinstance(rule, dict):
        return [f"{path}: expected object, got {kind_of(rule)}"]
    errors = unknown_fields(rule, (peers_key, "ports"), path)
    for key, check_item in ((peers_key, peer_errors), ("ports", port_errors)):
        items = rule.get(key) or []
        if not isinstance(items, list):
            errors.append(f"{path}.{key}: expected array, got {kind_of(items)}")
            continue
        errors += [e for i, item in enumerate(items) for e in check_item(item, join(f"{path}.{key}", i))]
    return errors


def network_policy_errors(doc: dict) -> list[str]:
    """Field errors of one NetworkPolicy, each prefixed with ``NetworkPolicy <name>:``."""
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = meta.get("name")
    errors = unknown_fields(doc, ("apiVersion", "kind", "metadata", "spec"), "")
    if doc.get("apiVersion") != "networking.k8s.io/v1":
        errors.append(f"apiVersion {doc.get('apiVersion')!r}: must be networking.k8s.io/v1")
    if not (isinstance(name, str) and len(name) <= 253 and DNS1123_SUBDOMAIN.fullmatch(name)):
        errors.append(f"metadata.name {name!r}: must be a DNS-1123 subdomain")
    errors += unknown_fields(meta, ("name", "namespace", "labels", "annotations"), "metadata")
    errors += label_errors(meta.get("labels"), "metadata.labels")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        errors.append("spec: required field missing")
        spec = {}
    errors += unknown_fields(spec, ("podSelector", "policyTypes", "ingress", "egress"), "spec")
    if "podSelector" not in spec:
        errors.append("spec.podSelector: required field missing")
    else:
        errors += selector_errors(spec["podSelector"], "spec.podSelector")
    types = spec.get("policyTypes", [])
    if not isinstance(types, list) or any(t not in ("Ingress", "Egress") for t in types) or len(set(types)) < len(types):
        errors.append(f"spec.policyTypes: {types!r} must be a list of distinct 'Ingress' / 'Egress'")
    for key, peers_key in (("ingress", "from"), ("egress", "to")):
        rules = spec.get(key) or []
        if not isinstance(rules, list):
            errors.append(f"spec.{key}: expected array, got {kind_of(rules)}")
            continue
        errors += [e for i, rule in enumerate(rules) for e in rule_errors(rule, f"spec.{key}[{i}]", peers_key)]
    return [f"NetworkPolicy {name}: {e.lstrip('.')}" for e in errors]


# -- 5. isolation: the NetworkPolicies of a file against its cluster ------------------------------

# KubeRay labels every Ray pod with these; ``ray.io/cluster`` is the cluster's name, which for a
# RayJob's cluster is ``<job name>-<random>`` and so cannot be selected on; the project's
# ``aisrl.io/cluster`` label, set in each pod template, can.
KUBERAY_POD_LABELS = {"ray.io/is-ray-node": "yes", "app.kubernetes.io/name": "kuberay",
                      "app.kubernetes.io/created-by": "kuberay-operator"}
IDENTITY_KEYS = ("ray.io/cluster", "aisrl.io/cluster")
SUBMITTER_LABELS = {"ray.io/originated-from-crd": "RayJob"}  # plus originated-from-cr-name: <job>
OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}  # its Helm chart's pod label


def cluster_spec(doc: dict) -> dict | None:
    spec = doc.get("spec") or {}
    return spec.get("rayClusterSpec") if doc.get("kind") == "RayJob" else spec


def pod_labels(doc: dict, label: str, group: dict) -> dict[str, str]:
    """The Kubernetes labels of the group's pods: KubeRay's, under the pod template's (which may
    not override node type, group or cluster). Newer KubeRay also copies the group's ``labels``
    (Ray node labels) onto the pods; older does not, so they are not counted on."""
    head = label == "headGroupSpec"
    fixed = {"ray.io/node-type": "head" if head else "worker",
             "ray.io/group": "headgroup" if head else str(group.get("groupName"))}
    if doc.get("kind") == "RayCluster":
        fixed["ray.io/cluster"] = str((doc.get("metadata") or {}).get("name"))
    template = ((group.get("template") or {}).get("metadata") or {}).get("labels") or {}
    return KUBERAY_POD_LABELS | {k: v for k, v in template.items() if k not in ("ray.io/cluster", *fixed)} | fixed


def selector_matches(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, values = expr.get("key"), expr.get("values") or []
        found = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                 "Exists": key in labels, "DoesNotExist": key not in labels}.get(expr.get("operator"), False)
        if not found:
            return False
    return True


def required_value(selector: dict, key: str) -> str | None:
    """The one value the selector requires of label ``key`` (None when it allows several or any)."""
    if key in (selector.get("matchLabels") or {}):
        return selector["matchLabels"][key]
    for expr in selector.get("matchExpressions") or []:
        if expr.get("key") == key and expr.get("operator") == "In" and len(expr.get("values") or []) == 1:
            return expr["values"][0]
    return None


def requires(selector: dict, labels: dict) -> bool:
    return all(required_value(selector, k) == v for k, v in labels.items())


def peer_kind(peer: dict, doc: dict, identity: list[tuple[str, str]]) -> str:
    """``cluster`` (a pod of this cluster), ``submitter`` / ``operator`` (the Jobs API clients) or
    ``outside`` (anything else: an ipBlock, any pod, any namespace...)."""
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if "ipBlock" in peer or not isinstance(pods, dict):
        return "outside"
    name = (doc.get("metadata") or {}).get("name")
    if namespaces is None and any(required_value(pods, k) == v for k, v in identity):
        return "cluster"
    if namespaces is None and doc.get("kind") == "RayJob" and requires(
            pods, SUBMITTER_LABELS | {"ray.io/originated-from-cr-name": name}):
        return "submitter"
    if isinstance(namespaces, dict) and required_value(namespaces, "kubernetes.io/metadata.name") and requires(
            pods, OPERATOR_LABELS):
        return "operator"
    return "outside"


def dashboard_ports(spec: dict) -> set:
    """The head's dashboard port, by number and by the names its containers give it."""
    number = int((spec.get("headGroupSpec") or {}).get("rayStartParams", {}).get("dashboard-port", 8265))
    head_pod = ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    names = {p.get("name") for c in head_pod.get("containers") or [] for p in c.get("ports") or []
             if p.get("containerPort") == number and p.get("name")}
    return {number} | names


def ingress_errors(policy: dict, doc: dict, identity: list[tuple[str, str]], dashboard: set) -> list[str]:
    name, errors = (policy.get("metadata") or {}).get("name"), []
    for i, rule in enumerate((policy.get("spec") or {}).get("ingress") or []):
        at = f"NetworkPolicy {name}: spec.ingress[{i}]"
        ports = rule.get("ports") or []
        dashboard_only = bool(ports) and all(
            p.get("port") in dashboard and p.get("protocol", "TCP") == "TCP" and "endPort" not in p for p in ports)
        if not rule.get("from"):
            errors.append(f"{at}.from is empty: it admits every source; admit only pods of the cluster")
        for j, peer in enumerate(rule.get("from") or []):
            kind = peer_kind(peer, doc, identity)
            if kind == "outside":
                wanted = " or ".join(f"{k}={v}" for k, v in identity)
                errors.append(f"{at}.from[{j}]: admits pods outside the cluster; select them by {wanted}, "
                              "with no namespaceSelector or ipBlock")
            elif kind != "cluster" and not dashboard_only:
                errors.append(f"{at}.from[{j}]: the {kind} may reach only the dashboard port "
                              f"{min(p for p in dashboard if isinstance(p, int))}; list it in the rule's ports")
    return errors


def identity_labels(doc: dict) -> list[tuple[str, str]]:
    """The labels that make a pod one of this cluster's: ``aisrl.io/cluster`` equal to the
    document's name, and for a RayCluster also KubeRay's ``ray.io/cluster`` (a RayJob's cluster is
    named ``<job>-<random>``, and ``ray.io/cluster=<job>`` would be another RayCluster's)."""
    name = (doc.get("metadata") or {}).get("name")
    return [(k, name) for k in IDENTITY_KEYS if k != "ray.io/cluster" or doc.get("kind") == "RayCluster"]


def admits_on_every_port(policies: list[dict], labels: dict) -> bool:
    """Whether one of the policies admits pods with these labels (of the same namespace) on every port."""
    def peer_admits(peer: dict) -> bool:
        return ("ipBlock" not in peer and peer.get("namespaceSelector") in (None, {})
                and selector_matches(peer.get("podSelector") or {}, labels))

    return any(not rule.get("ports") and (not rule.get("from") or any(peer_admits(p) for p in rule["from"]))
               for policy in policies for rule in (policy.get("spec") or {}).get("ingress") or [])


def isolation_errors(doc: dict, policies: list[dict]) -> list[str]:
    """Every pod of the cluster behind an ingress NetworkPolicy of the same namespace; every such
    policy admitting only the cluster's pods (plus the Jobs API clients on the dashboard port);
    and the cluster's pods admitted on every port (Ray nodes connect to each other's raylet,
    object manager and worker ports, not only to the head's well-known ones)."""
    spec = cluster_spec(doc)
    if not spec:
        return []
    meta, identity = doc.get("metadata") or {}, identity_labels(doc)
    where = f"{doc.get('kind')} {meta.get('name')}"
    ingress = [p for p in policies if (p.get("metadata") or {}).get("namespace") == meta.get("namespace")
               and "Ingress" in (p.get("spec") or {}).get("policyTypes", ["Ingress"])]
    pods = {label: pod_labels(doc, label, group) for label, group in groups(spec)}
    errors, selecting = [], set()
    for label, labels in pods.items():
        mine = [p for p in ingress if selector_matches((p.get("spec") or {}).get("podSelector") or {}, labels)]
        selecting |= {id(p) for p in mine}
        if not mine:
            errors.append(f"{where} {label}: no NetworkPolicy restricts ingress to its pods (labels {labels})")
        elif not all(admits_on_every_port(mine, source) for source in pods.values()):
            errors.append(f"{where} {label}: no NetworkPolicy admits the cluster's own pods on every port "
                          "(Ray nodes connect to each other's raylet, object manager and worker ports)")
    for policy in ingress:
        if id(policy) in selecting:
            errors += ingress_errors(policy, doc, identity, dashboard_ports(spec))
    return errors


# -- all of it -----------------------------------------------------------------------------------

def all_errors(doc: dict, schema: bool = True) -> list[str]:
    """One document's errors; ``schema=False`` leaves out the CRD schema (no CRDs at hand)."""
    if doc.get("kind") == "NetworkPolicy":
        return network_policy_errors(doc)
    if not schema and (doc.get("apiVersion") != "ray.io/v1" or doc.get("kind") not in RAY_KINDS):
        return [f"apiVersion/kind {doc.get('apiVersion')}/{doc.get('kind')}: not a ray.io/v1 kind of {list(RAY_KINDS)}"]
    return (schema_errors(doc) if schema else []) + operator_errors(doc) + policy_errors(doc)


def manifest_errors(docs: list[dict], schema: bool = True) -> list[str]:
    """One file's errors: each document's, then the isolation of each cluster by the file's policies."""
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    return [e for d in docs for e in all_errors(d, schema)] + [
        e for d in docs if d.get("kind") in RAY_KINDS for e in isolation_errors(d, policies)]
