"""Layer 2: what KubeRay's admission checks and webhook reject (its validation.go)."""

import re

import yaml

from kuberay_checks.schema import is_int, kind_of

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
MAX_NAME = {"RayCluster": 53, "RayJob": 47}
RAY_START_RESOURCE_KEYS = ("num-cpus", "num-gpus", "memory", "resources")




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
