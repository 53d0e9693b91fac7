"""The KubeRay manifests in ``deploy/kuberay/`` checked offline, with no cluster: every shipped
manifest passes ``kuberay_validation`` (CRD schema, strict; KubeRay's admission rules; this
project's rules), and deliberately broken ones each fail for their reason.
"""

import copy
import json
import re
from collections.abc import Callable

import pytest
import yaml
from kuberay_validation import (  # noqa: E402  (a helper module beside the tests)
    ENTRYPOINT,
    ROOT,
    all_errors,
    check,
    crd_schemas,
    load_docs,
    runtime_env,
    schema_errors,
    shipped,
    shipped_kind,
)

from system.config import resolve_config


def test_the_crds_know_token_auth():
    for kind in ("RayCluster", "RayJob"):
        spec = crd_schemas()[kind]["properties"]["spec"]["properties"]
        cluster = spec if kind == "RayCluster" else spec["rayClusterSpec"]["properties"]
        assert "token" in cluster["authOptions"]["properties"]["mode"]["enum"], kind


def test_both_kinds_are_shipped():
    assert sorted(d["kind"] for _, d in shipped()) == ["RayCluster", "RayJob"]


@pytest.mark.parametrize("name,doc", shipped(), ids=[n for n, _ in shipped()])
def test_shipped_manifest_is_valid(name, doc):
    assert all_errors(doc) == []


def test_rayjob_runs_the_documented_presets_and_shuts_down():
    spec = shipped_kind("RayJob")["spec"]
    assert spec["entrypoint"] == ENTRYPOINT and spec["shutdownAfterJobFinishes"] is True
    presets = ENTRYPOINT.split()[2:]
    resolve_config([ROOT / p for p in presets])  # raises ConfigError if a preset is missing or invalid
    assert "RAY_JOB_STOP_WAIT_TIME_S" in runtime_env(spec)["env_vars"]


def test_rayjob_creates_the_same_cluster_as_raycluster():
    assert shipped_kind("RayJob")["spec"]["rayClusterSpec"] == shipped_kind("RayCluster")["spec"]


def test_ray_version_matches_the_image():
    [image] = re.findall(r"^ARG RAY_VERSION=(\S+)$", (ROOT / "deploy" / "Dockerfile").read_text(), flags=re.M)
    for _, doc in shipped():
        spec = doc["spec"].get("rayClusterSpec", doc["spec"])
        assert spec["rayVersion"] == image, doc["kind"]


def group_capacity(group: dict) -> tuple[dict[str, float], float]:
    """Custom Ray resources and GPUs of one pod of the group."""
    resources = {k: float(v) for k, v in (group.get("resources") or {}).items()}
    raw = (group.get("rayStartParams") or {}).get("resources")
    if raw:
        resources |= json.loads(raw.strip("'\""))
    [container] = group["template"]["spec"]["containers"][:1]
    gpus = float((container.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0))
    return resources, gpus


def test_cluster_has_room_for_the_entrypoint_config():
    cfg = resolve_config([ROOT / p for p in ENTRYPOINT.split()[2:]])
    roles = [(cfg.ray.rollout_resource, cfg.rollout.num_workers, cfg.ray.rollout_gpus),
             (cfg.ray.learner_resource, cfg.learner.num_ranks, cfg.ray.learner_gpus)]
    spec = shipped_kind("RayCluster")["spec"]
    for resource, actors, gpus_each in roles:
        units = gpus = 0.0
        for group in spec["workerGroupSpecs"]:
            res, pod_gpus = group_capacity(group)
            if resource in res:
                assert res[resource] * gpus_each <= pod_gpus, f"{group['groupName']}: not enough GPUs per pod"
                units += group["replicas"] * res[resource]
                gpus += group["replicas"] * pod_gpus
        assert units >= actors, f"{resource}: room for {units} actors, the config wants {actors}"


# -- deliberately broken manifests ---------------------------------------------------------------

def head(spec):
    return spec["headGroupSpec"]


def worker(spec, name):
    [group] = [g for g in spec["workerGroupSpecs"] if g["groupName"] == name]
    return group


def container(group):
    return group["template"]["spec"]["containers"][0]


def _set(obj, key, value):
    obj[key] = value


# (id, mutation of the cluster spec, pattern every error must match)
CLUSTER_BREAKS: list[tuple[str, Callable[[dict], None], str]] = [
    ("unknown-field", lambda s: _set(head(s), "serviceTyp", "ClusterIP"), r"headGroupSpec\.serviceTyp: unknown field"),
    ("unknown-container-field", lambda s: _set(container(worker(s, "rollout")), "envv", []),
     r"containers\[0\]\.envv: unknown field"),
    ("unknown-pod-field", lambda s: _set(worker(s, "learner")["template"]["spec"], "hostNetwork2", True),
     r"template\.spec\.hostNetwork2: unknown field"),
    ("string-replicas", lambda s: _set(worker(s, "rollout"), "replicas", "4"), r"replicas: expected integer, got string"),
    ("missing-group-name", lambda s: worker(s, "learner").pop("groupName"), r"groupName: required field missing"),
    ("bad-quantity", lambda s: _set(container(head(s))["resources"]["limits"], "cpu", "eight"), r"limits\.cpu: 'eight' does not match"),
    ("duplicate-container", lambda s: head(s)["template"]["spec"]["containers"].append(copy.deepcopy(container(head(s)))),
     r"containers\[1\]: duplicate list entry"),
    ("auth-enum", lambda s: _set(s["authOptions"], "mode", "password"), r"authOptions\.mode"),
    ("auth-disabled", lambda s: _set(s["authOptions"], "mode", "disabled"), r"authOptions\.mode must be 'token'"),
    ("auth-missing", lambda s: s.pop("authOptions"), r"authOptions\.mode must be 'token'"),
    ("token-needs-new-ray", lambda s: _set(s, "rayVersion", "2.50.0"), r"rayVersion '2\.50\.0' is not >= 2\.52\.0"),
    ("duplicate-group", lambda s: _set(worker(s, "learner"), "groupName", "rollout"), r"worker group names must be unique: 'rollout'"),
    ("replicas-above-max", lambda s: _set(worker(s, "rollout"), "replicas", 20), r"rollout: replicas 20 outside \[minReplicas 1, maxReplicas 16\]"),
    ("min-above-max", lambda s: _set(worker(s, "learner"), "minReplicas", 5), r"learner: minReplicas 5 greater than maxReplicas 2"),
    ("no-max-without-autoscaler", lambda s: worker(s, "learner").pop("maxReplicas"), r"maxReplicas"),
    ("resources-twice", lambda s: _set(worker(s, "rollout")["rayStartParams"], "resources", '\'{"rollout": 1}\''),
     r"rollout: resources set in both rayStartParams and resources"),
    ("bad-label", lambda s: _set(worker(s, "rollout")["labels"], "aisrl.io/role", "roll out"), r"invalid label value 'roll out'"),
    ("no-containers", lambda s: _set(worker(s, "learner")["template"]["spec"], "containers", []), r"learner: needs at least one container"),
    ("load-balancer", lambda s: _set(head(s), "serviceType", "LoadBalancer"), r"serviceType LoadBalancer exposes the dashboard"),
    ("node-port", lambda s: _set(head(s), "serviceType", "NodePort"), r"serviceType NodePort exposes the dashboard"),
    ("ingress", lambda s: _set(head(s), "enableIngress", True), r"enableIngress exposes the dashboard"),
    ("wandb-literal", lambda s: _set(container(head(s)), "env", [{"name": "WANDB_API_KEY", "value": "0123abcd"}]),
     r"headGroupSpec container ray-head: WANDB_API_KEY (has a literal value|must come from env\.valueFrom\.secretKeyRef)"),
    ("wandb-missing", lambda s: _set(container(worker(s, "learner")), "env", []),
     r"worker group learner container ray-worker: WANDB_API_KEY must come from"),
    ("token-literal", lambda s: container(worker(s, "rollout"))["env"].append({"name": "HF_TOKEN", "value": "hf_x"}),
     r"rollout container ray-worker: HF_TOKEN has a literal value"),
    ("unverifiable-cel", lambda s: _set(s, "managedBy", "ray.io/kuberay-operator"), r"managedBy: CEL rule .* cannot be checked offline"),
]

JOB_BREAKS: list[tuple[str, Callable[[dict], None], str]] = [
    ("submission-mode", lambda j: _set(j, "submissionMode", "K8sMode"), r"submissionMode 'K8sMode' is not one of"),
    ("ttl-without-shutdown", lambda j: _set(j, "shutdownAfterJobFinishes", False), r"shutdownAfterJobFinishes"),
    ("negative-ttl", lambda j: _set(j, "ttlSecondsAfterFinished", -1), r"ttlSecondsAfterFinished must be non-negative"),
    ("no-cluster", lambda j: j.pop("rayClusterSpec"), r"one of rayClusterSpec or clusterSelector must be set"),
    ("zero-deadline", lambda j: _set(j, "activeDeadlineSeconds", 0), r"activeDeadlineSeconds must be a positive integer"),
    ("negative-backoff", lambda j: _set(j, "backoffLimit", -1), r"backoffLimit must be non-negative"),
    ("interactive-retries", lambda j: (_set(j, "submissionMode", "InteractiveMode"), _set(j, "backoffLimit", 2)),
     r"backoffLimit is incompatible with InteractiveMode"),
    ("runtime-env-not-yaml", lambda j: _set(j, "runtimeEnvYAML", "env_vars: [unclosed"), r"runtimeEnvYAML: not a valid YAML mapping"),
    ("runtime-env-secret", lambda j: _set(j, "runtimeEnvYAML", "env_vars:\n  WANDB_API_KEY: abc\n"),
     r"runtimeEnvYAML\.env_vars\.WANDB_API_KEY: secrets must not go into the runtime env"),
    ("string-cpus", lambda j: _set(j, "entrypointNumCpus", "1"), r"entrypointNumCpus: expected number, got string"),
    ("unknown-job-field", lambda j: _set(j, "entrypointt", "x"), r"RayJob\.spec\.entrypointt: unknown field"),
]


def assert_breaks_for(doc: dict, pattern: str) -> None:
    errors = all_errors(doc)
    assert errors, f"expected an error matching {pattern!r}, got none"
    wrong = [e for e in errors if not re.search(pattern, e)]
    assert not wrong, f"errors for other reasons than {pattern!r}: {wrong}"


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
@pytest.mark.parametrize("case,mutate,pattern", CLUSTER_BREAKS, ids=[c for c, _, _ in CLUSTER_BREAKS])
def test_broken_cluster_spec_fails_for_its_reason(kind, case, mutate, pattern):
    doc = copy.deepcopy(shipped_kind(kind))
    mutate(doc["spec"] if kind == "RayCluster" else doc["spec"]["rayClusterSpec"])
    assert_breaks_for(doc, pattern)


@pytest.mark.parametrize("case,mutate,pattern", JOB_BREAKS, ids=[c for c, _, _ in JOB_BREAKS])
def test_broken_rayjob_fails_for_its_reason(case, mutate, pattern):
    doc = copy.deepcopy(shipped_kind("RayJob"))
    mutate(doc["spec"])
    assert_breaks_for(doc, pattern)


@pytest.mark.parametrize("kind,name,pattern", [
    ("RayCluster", "Aisrl", r"metadata\.name 'Aisrl': must be a DNS-1035 label"),
    ("RayJob", "a" * 48, r"metadata\.name 'a+': must be a DNS-1035 label of at most 47"),
])
def test_bad_names_fail(kind, name, pattern):
    doc = copy.deepcopy(shipped_kind(kind))
    doc["metadata"]["name"] = name
    assert_breaks_for(doc, pattern)


def test_unknown_metadata_field_and_wrong_kind_fail():
    doc = copy.deepcopy(shipped_kind("RayCluster"))
    doc["metadata"]["lables"] = {"a": "b"}
    assert_breaks_for(doc, r"metadata\.lables: unknown field")
    doc = copy.deepcopy(shipped_kind("RayCluster"))
    doc["apiVersion"] = "ray.io/v1alpha1"
    assert schema_errors(doc) and "not a ray.io/v1 kind" in schema_errors(doc)[0]


def test_duplicate_yaml_keys_fail(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("apiVersion: ray.io/v1\nkind: RayCluster\nkind: RayJob\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key"):
        load_docs(path)


def test_preserve_unknown_fields_is_honoured_only_where_declared():
    schema = {"type": "object", "properties": {
        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"n": {"type": "integer"}}},
        "closed": {"type": "object", "properties": {"n": {"type": "integer"}}}}}
    assert check({"open": {"n": 1, "anything": {"x": 1}}}, schema, "s") == []
    assert check({"open": {"n": "one"}}, schema, "s") == ["s.open.n: expected integer, got string"]
    assert check({"closed": {"n": 1, "anything": 1}}, schema, "s") == ["s.closed.anything: unknown field"]
    assert check({"open": {}, "other": 1}, schema, "s") == ["s.other: unknown field"]
