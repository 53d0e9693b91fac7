"""Layer 3: this project's policy (token auth, exposure, secrets, pod security)."""

import functools
import re

import yaml

from kuberay_checks.admission import groups, runtime_env
from kuberay_checks.files import DOCKERFILE

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
        errors += [f"{label}: volume {v.get('name')} is a hostPath (the node's files; Pod Security baseline forbids it)"
                   for v in pod.get("volumes") or [] if "hostPath" in v]
        for key in ("initContainers", "containers"):
            for c in pod.get(key) or []:
                where = f"{label} {'initContainer' if key == 'initContainers' else 'container'} {c.get('name')}"
                errors += container_security_errors(where, c, pod.get("securityContext") or {})
                errors += [f"{where}: port {p.get('name') or p.get('containerPort')} has hostPort {p['hostPort']} "
                           "(published on the node's address, outside the NetworkPolicy)"
                           for p in c.get("ports") or [] if p.get("hostPort")]
                errors += [f"{where}: env RAY_AUTH_MODE={e.get('value')!r} turns the cluster's token authentication off"
                           for e in c.get("env") or [] if e.get("name") == "RAY_AUTH_MODE"
                           and str(e.get("value", "")).lower() == "disabled"]
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
