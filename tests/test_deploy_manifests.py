"""The KubeRay manifests in ``deploy/kuberay/`` checked offline, with no cluster: every shipped
file passes ``kuberay_checks`` (CRD schema, strict; KubeRay's admission rules; this project's
rules: pod hardening, network isolation), and deliberately broken ones each fail for their reason.

The CRD schemas live outside the repository (``../shared/kuberay-crds``, or ``$AISRL_KUBERAY_CRDS``):
where they are missing, the tests that need them skip and every other test still runs.
"""

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kuberay_checks import (  # a helper package beside the tests
    ENTRYPOINT,
    HAVE_CRDS,
    RAY_KINDS,
    ROOT,
    all_errors,
    check,
    crd_schemas,
    load_docs,
    manifest_errors,
    needs_crds,
    runtime_env,
    schema_errors,
    shipped,
    shipped_files,
    shipped_kind,
)

from system.config import resolve_config

JOB_NAME = "aisrl-qwen25-gsm8k"


def image_user() -> tuple[int, int]:
    """``(uid, gid)`` of the user deploy/Dockerfile creates (read here, apart from the validator)."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    [uid] = re.findall(r"useradd [^\n]*--uid (\d+)", text)
    [gid] = re.findall(r"groupadd [^\n]*--gid (\d+)", text)
    return int(uid), int(gid)


@needs_crds
def test_the_crds_know_token_auth():
    for kind in ("RayCluster", "RayJob"):
        spec = crd_schemas()[kind]["properties"]["spec"]["properties"]
        cluster = spec if kind == "RayCluster" else spec["rayClusterSpec"]["properties"]
        assert "token" in cluster["authOptions"]["properties"]["mode"]["enum"], kind


def test_crd_location_is_configurable_and_its_absence_only_skips(tmp_path):
    """A checkout without ../shared (a user's clone): the CRD layer reports itself missing."""
    code = ("import kuberay_checks as k; print(k.HAVE_CRDS, k.CRD_DIR); "
            "print(k.needs_crds.kwargs['reason'])")
    env = os.environ | {"AISRL_KUBERAY_CRDS": str(tmp_path / "absent")}
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == f"False {tmp_path / 'absent'}"
    assert f"runs where {tmp_path / 'absent'} exists" in out[1] and "CI" in out[1]


def test_no_crd_is_kept_in_the_repository():
    """The KubeRay CRDs are upstream data read from outside the checkout, never a copy inside it."""
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("runs", "wandb", "node_modules")]
        for name in files:
            path = Path(top) / name
            if re.search(r"crd", name, flags=re.I) or (
                    path.suffix in (".yaml", ".yml", ".json") and "CustomResourceDefinition" in path.read_text(errors="replace")):
                found.append(str(path.relative_to(ROOT)))
    assert found == []


def test_each_cluster_ships_with_its_network_policies():
    kinds = {name: sorted(d["kind"] for d in docs) for name, docs in shipped_files().items()}
    assert kinds == {"raycluster.yaml": ["NetworkPolicy", "RayCluster"],
                     "rayjob.yaml": ["NetworkPolicy", "NetworkPolicy", "RayJob"]}


@pytest.mark.parametrize("name", sorted(shipped_files()))
def test_shipped_manifest_is_valid(name):
    assert manifest_errors(shipped_files()[name], schema=HAVE_CRDS) == []


@needs_crds
@pytest.mark.parametrize("name,doc", [(n, d) for n, d in shipped() if d["kind"] in RAY_KINDS],
                         ids=[n for n, d in shipped() if d["kind"] in RAY_KINDS])
def test_shipped_manifest_matches_the_crd_schema(name, doc):
    assert schema_errors(doc) == []


def test_rayjob_runs_the_documented_presets_and_shuts_down():
    spec = shipped_kind("RayJob")["spec"]
    assert spec["entrypoint"] == ENTRYPOINT and spec["shutdownAfterJobFinishes"] is True
    presets = ENTRYPOINT.split()[2:]
    resolve_config([ROOT / p for p in presets])  # raises ConfigError if a preset is missing or invalid
    assert "RAY_JOB_STOP_WAIT_TIME_S" in runtime_env(spec)["env_vars"]


def test_rayjob_creates_the_same_cluster_as_raycluster():
    """The same cluster, except that the RayJob's pods carry aisrl.io/cluster (the name KubeRay
    gives its cluster is random, so its NetworkPolicies select the pods by this label)."""
    job = copy.deepcopy(shipped_kind("RayJob")["spec"]["rayClusterSpec"])
    for group in [job["headGroupSpec"], *job["workerGroupSpecs"]]:
        assert group["template"].pop("metadata") == {"labels": {"aisrl.io/cluster": JOB_NAME}}
    assert job == shipped_kind("RayCluster")["spec"]


def test_ray_version_matches_the_image():
    [image] = re.findall(r"^ARG RAY_VERSION=(\S+)$", (ROOT / "deploy" / "Dockerfile").read_text(), flags=re.M)
    for _, doc in shipped():
        if doc["kind"] in RAY_KINDS:
            spec = doc["spec"].get("rayClusterSpec", doc["spec"])
            assert spec["rayVersion"] == image, doc["kind"]


def test_image_runs_as_the_non_root_user_it_creates():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    uid, gid = image_user()
    assert uid != 0 and gid != 0
    assert re.findall(r"^USER\s+(\S+)", text, flags=re.M)[-1] == f"{uid}:{gid}"
    if "ubuntu24.04" in text:  # its base ships a user `ubuntu` with uid 1000, removed before useradd
        assert text.index("userdel --remove ubuntu") < text.index("useradd")


def pod_specs_in(node) -> list[dict]:
    """Every pod spec (a mapping with ``containers``) anywhere in a document, found by walking it."""
    if isinstance(node, list):
        return [p for item in node for p in pod_specs_in(item)]
    if not isinstance(node, dict):
        return []
    return ([node] if "containers" in node else []) + [p for v in node.values() for p in pod_specs_in(v)]


@pytest.mark.parametrize("kind,pods", [("RayCluster", 3), ("RayJob", 4)])
def test_every_pod_runs_locked_down_as_the_image_user(kind, pods):
    found = pod_specs_in(shipped_kind(kind))
    assert len(found) == pods  # head, rollout, learner (and the RayJob's submitter)
    uid, gid = image_user()
    for pod in found:
        pod_context = {k: v for k, v in pod["securityContext"].items() if k != "fsGroup"}  # volumes' group
        assert pod_context == {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid,
                               "seccompProfile": {"type": "RuntimeDefault"}}
        for c in pod["containers"]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


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

FILE_OF = {"RayCluster": "raycluster.yaml", "RayJob": "rayjob.yaml"}
UID = image_user()[0]


def shipped_file(kind: str) -> tuple[list[dict], dict]:
    """A copy of the file that ships ``kind``: its documents and the ``kind`` one among them."""
    docs = copy.deepcopy(shipped_files()[FILE_OF[kind]])
    [doc] = [d for d in docs if d["kind"] == kind]
    return docs, doc


def head(spec):
    return spec["headGroupSpec"]


def worker(spec, name):
    [group] = [g for g in spec["workerGroupSpecs"] if g["groupName"] == name]
    return group


def pod(group):
    return group["template"]["spec"]


def container(group):
    return pod(group)["containers"][0]


def _set(obj, key, value):
    obj[key] = value


def case(name: str, mutate: Callable, pattern: str, schema_only: bool = False):
    """A broken manifest: its id, the mutation, the pattern every error must match. ``schema_only``:
    only the CRD schema catches it, so it needs the CRDs."""
    return pytest.param(mutate, pattern, id=name, marks=[needs_crds] if schema_only else [])


# Mutations of the cluster spec (of the RayCluster, and of the RayJob's rayClusterSpec).
CLUSTER_BREAKS = [
    case("unknown-field", lambda s: _set(head(s), "serviceTyp", "ClusterIP"), r"headGroupSpec\.serviceTyp: unknown field", True),
    case("unknown-container-field", lambda s: _set(container(worker(s, "rollout")), "envv", []),
         r"containers\[0\]\.envv: unknown field", True),
    case("unknown-pod-field", lambda s: _set(pod(worker(s, "learner")), "hostNetwork2", True),
         r"template\.spec\.hostNetwork2: unknown field", True),
    case("string-replicas", lambda s: _set(worker(s, "rollout"), "replicas", "4"), r"replicas: expected integer, got string", True),
    case("missing-group-name", lambda s: worker(s, "learner").pop("groupName"), r"groupName: required field missing", True),
    case("bad-quantity", lambda s: _set(container(head(s))["resources"]["limits"], "cpu", "eight"), r"limits\.cpu: 'eight' does not match", True),
    case("duplicate-container", lambda s: pod(head(s))["containers"].append(copy.deepcopy(container(head(s)))),
         r"containers\[1\]: duplicate list entry", True),
    case("auth-enum", lambda s: _set(s["authOptions"], "mode", "password"), r"authOptions\.mode"),
    case("auth-disabled", lambda s: _set(s["authOptions"], "mode", "disabled"), r"authOptions\.mode must be 'token'"),
    case("auth-missing", lambda s: s.pop("authOptions"), r"authOptions\.mode must be 'token'"),
    case("token-needs-new-ray", lambda s: _set(s, "rayVersion", "2.50.0"), r"rayVersion '2\.50\.0' is not >= 2\.52\.0"),
    case("duplicate-group", lambda s: _set(worker(s, "learner"), "groupName", "rollout"), r"worker group names must be unique: 'rollout'"),
    case("replicas-above-max", lambda s: _set(worker(s, "rollout"), "replicas", 20), r"rollout: replicas 20 outside \[minReplicas 1, maxReplicas 16\]"),
    case("min-above-max", lambda s: _set(worker(s, "learner"), "minReplicas", 5), r"learner: minReplicas 5 greater than maxReplicas 2"),
    case("no-max-without-autoscaler", lambda s: worker(s, "learner").pop("maxReplicas"), r"maxReplicas"),
    case("resources-twice", lambda s: _set(worker(s, "rollout")["rayStartParams"], "resources", '\'{"rollout": 1}\''),
         r"rollout: resources set in both rayStartParams and resources"),
    case("bad-label", lambda s: _set(worker(s, "rollout")["labels"], "aisrl.io/role", "roll out"), r"invalid label value 'roll out'"),
    case("no-containers", lambda s: _set(pod(worker(s, "learner")), "containers", []), r"learner: needs at least one container"),
    case("load-balancer", lambda s: _set(head(s), "serviceType", "LoadBalancer"), r"serviceType LoadBalancer exposes the dashboard"),
    case("node-port", lambda s: _set(head(s), "serviceType", "NodePort"), r"serviceType NodePort exposes the dashboard"),
    case("ingress", lambda s: _set(head(s), "enableIngress", True), r"enableIngress exposes the dashboard"),
    case("wandb-literal", lambda s: _set(container(head(s)), "env", [{"name": "WANDB_API_KEY", "value": "0123abcd"}]),
         r"headGroupSpec container ray-head: WANDB_API_KEY (has a literal value|must come from env\.valueFrom\.secretKeyRef)"),
    case("wandb-missing", lambda s: _set(container(worker(s, "learner")), "env", []),
         r"worker group learner container ray-worker: WANDB_API_KEY must come from"),
    case("token-literal", lambda s: container(worker(s, "rollout"))["env"].append({"name": "HF_TOKEN", "value": "hf_x"}),
         r"rollout container ray-worker: HF_TOKEN has a literal value"),
    case("unverifiable-cel", lambda s: _set(s, "managedBy", "ray.io/kuberay-operator"), r"managedBy: CEL rule .* cannot be checked offline", True),
    # pod hardening
    case("run-as-non-root-missing", lambda s: pod(worker(s, "rollout"))["securityContext"].pop("runAsNonRoot"),
         r"^worker group rollout container ray-worker: securityContext\.runAsNonRoot must be true"),
    case("container-may-run-as-root", lambda s: _set(container(head(s))["securityContext"], "runAsNonRoot", False),
         r"^headGroupSpec container ray-head: securityContext\.runAsNonRoot must be true"),
    case("run-as-root", lambda s: _set(pod(head(s))["securityContext"], "runAsUser", 0),
                rf"^headGroupSpec container ray-head: securityContext\.runAsUser is 0; must be {UID}\b"),
    case("run-as-another-user", lambda s: _set(container(worker(s, "learner"))["securityContext"], "runAsUser", UID + 1),
                rf"^worker group learner container ray-worker: securityContext\.runAsUser is {UID + 1}; must be {UID}\b"),
    case("privilege-escalation", lambda s: _set(container(worker(s, "learner"))["securityContext"], "allowPrivilegeEscalation", True),
         r"^worker group learner container ray-worker: securityContext\.allowPrivilegeEscalation must be false"),
    case("privilege-escalation-default", lambda s: container(head(s))["securityContext"].pop("allowPrivilegeEscalation"),
         r"^headGroupSpec container ray-head: securityContext\.allowPrivilegeEscalation must be false"),
    case("capabilities-kept", lambda s: _set(container(worker(s, "rollout"))["securityContext"], "capabilities", {"drop": ["NET_RAW"]}),
         r"^worker group rollout container ray-worker: securityContext\.capabilities\.drop must contain ALL"),
    case("capabilities-default", lambda s: container(head(s))["securityContext"].pop("capabilities"),
         r"^headGroupSpec container ray-head: securityContext\.capabilities\.drop must contain ALL"),
    case("capability-added", lambda s: _set(container(head(s))["securityContext"]["capabilities"], "add", ["SYS_ADMIN"]),
         r"^headGroupSpec container ray-head: securityContext\.capabilities\.add must be empty"),
    case("privileged", lambda s: _set(container(worker(s, "rollout"))["securityContext"], "privileged", True),
         r"^worker group rollout container ray-worker: securityContext\.privileged must not be true"),
    case("seccomp-unconfined", lambda s: _set(pod(worker(s, "learner"))["securityContext"], "seccompProfile", {"type": "Unconfined"}),
         r"^worker group learner container ray-worker: securityContext\.seccompProfile\.type is 'Unconfined'"),
    case("no-container-security-context", lambda s: container(head(s)).pop("securityContext"),
         r"^headGroupSpec container ray-head: securityContext\.(allowPrivilegeEscalation|capabilities)"),
    case("init-container-not-locked-down", lambda s: _set(pod(worker(s, "learner")), "initContainers", [{"name": "fetch", "image": "busybox"}]),
         r"^worker group learner initContainer fetch: securityContext\.(allowPrivilegeEscalation|capabilities)"),
    case("host-network", lambda s: _set(pod(worker(s, "rollout")), "hostNetwork", True),
         r"^worker group rollout: hostNetwork must not be true"),
]


def submitter(job):
    return job["submitterPodTemplate"]["spec"]


JOB_BREAKS = [
    case("submission-mode", lambda j: _set(j, "submissionMode", "K8sMode"), r"submissionMode 'K8sMode' is not one of"),
    case("ttl-without-shutdown", lambda j: _set(j, "shutdownAfterJobFinishes", False), r"shutdownAfterJobFinishes"),
    case("negative-ttl", lambda j: _set(j, "ttlSecondsAfterFinished", -1), r"ttlSecondsAfterFinished must be non-negative"),
    case("no-cluster", lambda j: j.pop("rayClusterSpec"), r"one of rayClusterSpec or clusterSelector must be set"),
    case("zero-deadline", lambda j: _set(j, "activeDeadlineSeconds", 0), r"activeDeadlineSeconds must be a positive integer"),
    case("negative-backoff", lambda j: _set(j, "backoffLimit", -1), r"backoffLimit must be non-negative"),
    case("interactive-retries", lambda j: (_set(j, "submissionMode", "InteractiveMode"), _set(j, "backoffLimit", 2)),
         r"backoffLimit is incompatible with InteractiveMode"),
    case("runtime-env-not-yaml", lambda j: _set(j, "runtimeEnvYAML", "env_vars: [unclosed"), r"runtimeEnvYAML: not a valid YAML mapping"),
    case("runtime-env-secret", lambda j: _set(j, "runtimeEnvYAML", "env_vars:\n  WANDB_API_KEY: abc\n"),
         r"runtimeEnvYAML\.env_vars\.WANDB_API_KEY: secrets must not go into the runtime env"),
    case("string-cpus", lambda j: _set(j, "entrypointNumCpus", "1"), r"entrypointNumCpus: expected number, got string", True),
    case("unknown-job-field", lambda j: _set(j, "entrypointt", "x"), r"RayJob\.spec\.entrypointt: unknown field", True),
    case("default-submitter", lambda j: j.pop("submitterPodTemplate"), r"^submitterPodTemplate missing: KubeRay's default submitter"),
    case("submitter-escalates", lambda j: _set(submitter(j)["containers"][0]["securityContext"], "allowPrivilegeEscalation", True),
         r"^submitterPodTemplate container ray-job-submitter: securityContext\.allowPrivilegeEscalation must be false"),
    case("submitter-as-root", lambda j: _set(submitter(j)["securityContext"], "runAsUser", 0),
         r"^submitterPodTemplate container ray-job-submitter: securityContext\.runAsUser is 0"),
]


def policy(docs: list[dict], name: str) -> dict:
    [doc] = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == name]
    return doc


def rule(docs: list[dict], name: str, i: int = 0) -> dict:
    return policy(docs, name)["spec"]["ingress"][i]


def policy_case(name: str, kind: str, mutate: Callable, pattern: str):
    """A broken file: the kind whose file ``mutate`` changes (the cluster and its NetworkPolicies)."""
    return pytest.param(kind, mutate, pattern, id=name)


def drop_policies(docs: list[dict]) -> None:
    docs[:] = [d for d in docs if d["kind"] != "NetworkPolicy"]


CLUSTER_POLICY, JOB_POLICY, JOBS_API_POLICY = "aisrl-ray", f"{JOB_NAME}-ray", f"{JOB_NAME}-jobs-api"
ANY_GROUP = r"(headGroupSpec|worker group rollout|worker group learner)"
NO_POLICY = ANY_GROUP + r": no NetworkPolicy restricts ingress to its pods"
OUTSIDE = r"spec\.ingress\[0\]\.from\[0\]: admits pods outside the cluster"
CUT_OFF = ANY_GROUP + r": no NetworkPolicy admits the cluster's own pods on every port"

# Mutations of a whole shipped file (the cluster and its NetworkPolicies).
POLICY_BREAKS = [
    policy_case("policy-missing", "RayCluster", drop_policies, rf"^RayCluster aisrl {NO_POLICY}"),
    policy_case("job-policies-missing", "RayJob", drop_policies, rf"^RayJob {JOB_NAME} {NO_POLICY}"),
    policy_case("admits-everyone", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "ingress", [{}]),
                r"^NetworkPolicy aisrl-ray: spec\.ingress\[0\]\.from is empty: it admits every source"),
    policy_case("admits-any-pod", "RayCluster", lambda d: _set(rule(d, CLUSTER_POLICY), "from", [{"podSelector": {}}]),
                r"^NetworkPolicy aisrl-ray: spec\.ingress\[0\]\.from\[0\]: admits pods outside the cluster"),
    policy_case("admits-any-namespace", "RayCluster", lambda d: _set(rule(d, CLUSTER_POLICY)["from"][0], "namespaceSelector", {}),
                r"^NetworkPolicy aisrl-ray: spec\.ingress\[0\]\.from\[0\]: admits pods outside the cluster"),
    policy_case("admits-any-address", "RayCluster", lambda d: _set(rule(d, CLUSTER_POLICY), "from", [{"ipBlock": {"cidr": "0.0.0.0/0"}}]),
                rf"^(NetworkPolicy aisrl-ray: {OUTSIDE}|RayCluster aisrl {CUT_OFF})"),
    policy_case("admits-another-cluster", "RayCluster", lambda d: _set(rule(d, CLUSTER_POLICY)["from"][0]["podSelector"], "matchLabels", {"ray.io/cluster": "other"}),
                rf"^(NetworkPolicy aisrl-ray: {OUTSIDE}|RayCluster aisrl {CUT_OFF})"),
    policy_case("job-admits-by-generated-name", "RayJob", lambda d: _set(rule(d, JOB_POLICY)["from"][0]["podSelector"], "matchLabels", {"ray.io/cluster": JOB_NAME}),
                rf"^(NetworkPolicy {JOB_POLICY}: {OUTSIDE}; select them by aisrl\.io/cluster={JOB_NAME}|RayJob {JOB_NAME} {CUT_OFF})"),
    policy_case("egress-only", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "policyTypes", ["Egress"]),
                rf"^RayCluster aisrl {NO_POLICY}"),
    policy_case("selects-another-cluster", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"]["podSelector"], "matchLabels", {"ray.io/cluster": "other"}),
                rf"^RayCluster aisrl {NO_POLICY}"),
    policy_case("other-namespace", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["metadata"], "namespace", "elsewhere"),
                rf"^RayCluster aisrl {NO_POLICY}"),
    policy_case("job-pods-unlabelled", "RayJob", lambda d: worker(shipped_in(d, "RayJob")["spec"]["rayClusterSpec"], "rollout")["template"].pop("metadata"),
                rf"^RayJob {JOB_NAME} (worker group rollout: no NetworkPolicy restricts ingress|{CUT_OFF})"),
    policy_case("job-selects-by-generated-name", "RayJob", lambda d: _set(policy(d, JOB_POLICY)["spec"]["podSelector"], "matchLabels", {"ray.io/cluster": JOB_NAME}),
                rf"^RayJob {JOB_NAME} (worker group \w+: no NetworkPolicy restricts ingress|headGroupSpec: no NetworkPolicy admits the cluster's own pods)"),
    policy_case("ports-listed", "RayCluster", lambda d: _set(rule(d, CLUSTER_POLICY), "ports", [{"port": p} for p in (6379, 8265, 10001)]),
                rf"^RayCluster aisrl {CUT_OFF}"),
    policy_case("jobs-api-on-every-port", "RayJob", lambda d: rule(d, JOBS_API_POLICY).pop("ports"),
                rf"^NetworkPolicy {JOBS_API_POLICY}: spec\.ingress\[0\]\.from\[\d\]: the (submitter|operator) may reach only the dashboard port 8265"),
    policy_case("operator-in-any-namespace", "RayJob", lambda d: _set(rule(d, JOBS_API_POLICY)["from"][1], "namespaceSelector", {}),
                rf"^NetworkPolicy {JOBS_API_POLICY}: spec\.ingress\[0\]\.from\[1\]: admits pods outside the cluster"),
    policy_case("submitter-of-another-job", "RayJob", lambda d: _set(rule(d, JOBS_API_POLICY)["from"][0]["podSelector"]["matchLabels"], "ray.io/originated-from-cr-name", "other"),
                rf"^NetworkPolicy {JOBS_API_POLICY}: spec\.ingress\[0\]\.from\[0\]: admits pods outside the cluster"),
    # the structure of networking.k8s.io/v1
    policy_case("policy-api-version", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY), "apiVersion", "networking.k8s.io/v1beta1"),
                r"^NetworkPolicy aisrl-ray: apiVersion 'networking\.k8s\.io/v1beta1': must be networking\.k8s\.io/v1"),
    policy_case("policy-unknown-field", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "ingres", []),
                r"^NetworkPolicy aisrl-ray: spec\.ingres: unknown field"),
    policy_case("policy-bad-name", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["metadata"], "name", "Aisrl_Ray"),
                r"^NetworkPolicy Aisrl_Ray: metadata\.name 'Aisrl_Ray': must be a DNS-1123 subdomain"),
    policy_case("policy-no-pod-selector", "RayCluster", lambda d: policy(d, CLUSTER_POLICY)["spec"].pop("podSelector"),
                r"^NetworkPolicy aisrl-ray: spec\.podSelector: required field missing"),
    policy_case("policy-bad-type", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "policyTypes", ["Ingress", "Ingress"]),
                r"^NetworkPolicy aisrl-ray: spec\.policyTypes: \['Ingress', 'Ingress'\] must be a list of distinct"),
    policy_case("policy-bad-operator", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "egress", [{"to": [{"podSelector": {
                "matchExpressions": [{"key": "ray.io/group", "operator": "Equals", "values": ["x"]}]}}]}]),
                r"^NetworkPolicy aisrl-ray: spec\.egress\[0\]\.to\[0\]\.podSelector\.matchExpressions\[0\]\.operator: 'Equals' is not one of"),
    policy_case("policy-bad-protocol", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "egress", [{"ports": [{"protocol": "HTTP", "port": 53}]}]),
                r"^NetworkPolicy aisrl-ray: spec\.egress\[0\]\.ports\[0\]\.protocol: 'HTTP' is not one of"),
    policy_case("policy-port-out-of-range", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "egress", [{"ports": [{"port": 70000}]}]),
                r"^NetworkPolicy aisrl-ray: spec\.egress\[0\]\.ports\[0\]\.port: 70000 outside \[1, 65535\]"),
    policy_case("policy-bad-cidr", "RayCluster", lambda d: _set(policy(d, CLUSTER_POLICY)["spec"], "egress", [{"to": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]),
                r"^NetworkPolicy aisrl-ray: spec\.egress\[0\]\.to\[0\]\.ipBlock\.cidr: '10\.0\.0\.0/33' is not a CIDR"),
]


def assert_breaks_for(docs: list[dict], pattern: str) -> None:
    """The file's errors: at least one, and all of them for the reason given."""
    assert_all_match(manifest_errors(docs, schema=HAVE_CRDS), pattern)


def shipped_in(docs: list[dict], kind: str) -> dict:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def assert_all_match(errors: list[str], pattern: str) -> None:
    assert errors, f"expected an error matching {pattern!r}, got none"
    wrong = [e for e in errors if not re.search(pattern, e)]
    assert not wrong, f"errors for other reasons than {pattern!r}: {wrong}"


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
@pytest.mark.parametrize("mutate,pattern", CLUSTER_BREAKS)
def test_broken_cluster_spec_fails_for_its_reason(kind, mutate, pattern):
    docs, doc = shipped_file(kind)
    mutate(doc["spec"] if kind == "RayCluster" else doc["spec"]["rayClusterSpec"])
    assert_breaks_for(docs, pattern)


@pytest.mark.parametrize("mutate,pattern", JOB_BREAKS)
def test_broken_rayjob_fails_for_its_reason(mutate, pattern):
    docs, doc = shipped_file("RayJob")
    mutate(doc["spec"])
    assert_breaks_for(docs, pattern)


@pytest.mark.parametrize("kind,mutate,pattern", POLICY_BREAKS)
def test_broken_isolation_fails_for_its_reason(kind, mutate, pattern):
    docs, _ = shipped_file(kind)
    mutate(docs)
    assert_breaks_for(docs, pattern)


def test_missing_policy_names_the_head():
    for kind in RAY_KINDS:
        docs, _ = shipped_file(kind)
        drop_policies(docs)
        assert any("headGroupSpec: no NetworkPolicy restricts ingress" in e for e in manifest_errors(docs, schema=False)), kind


@pytest.mark.parametrize("kind,name,pattern", [
    ("RayCluster", "Aisrl", r"metadata\.name 'Aisrl': must be a DNS-1035 label"),
    ("RayJob", "a" * 48, r"metadata\.name 'a+': must be a DNS-1035 label of at most 47"),
])
def test_bad_names_fail(kind, name, pattern):
    docs, doc = shipped_file(kind)
    doc["metadata"]["name"] = name
    assert_all_match(all_errors(doc, schema=HAVE_CRDS), pattern)


@needs_crds
def test_unknown_metadata_field_and_wrong_kind_fail():
    docs, doc = shipped_file("RayCluster")
    doc["metadata"]["lables"] = {"a": "b"}
    assert_breaks_for(docs, r"metadata\.lables: unknown field")
    doc = copy.deepcopy(shipped_kind("RayCluster"))
    doc["apiVersion"] = "ray.io/v1alpha1"
    assert schema_errors(doc) and "not a ray.io/v1 kind" in schema_errors(doc)[0]


def test_unknown_kind_fails_without_the_crds():
    doc = copy.deepcopy(shipped_kind("RayCluster"))
    doc["apiVersion"] = "ray.io/v1alpha1"
    assert all_errors(doc, schema=False) == ["apiVersion/kind ray.io/v1alpha1/RayCluster: not a ray.io/v1 kind of ['RayCluster', 'RayJob']"]


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
