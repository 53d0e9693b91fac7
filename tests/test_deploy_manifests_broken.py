"""Deliberately broken KubeRay manifests (copies of the shipped ones, each mutated one way): every
one fails ``kuberay_checks`` for its own reason, and every error it gives names that reason.
Cases only the CRD schema catches skip where the schemas are missing (see ``test_deploy_manifests``).
"""

import copy
import re
from collections.abc import Callable

import pytest
import yaml
from deploy_facts import JOB_NAME, image_user
from kuberay_checks import (  # a helper package beside the tests
    HAVE_CRDS,
    RAY_KINDS,
    all_errors,
    check,
    load_docs,
    manifest_errors,
    needs_crds,
    schema_errors,
    shipped_files,
    shipped_kind,
)

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
    # found by a probe (2026-11-27): passed the validator, each against Pod Security baseline or the policy
    case("host-port", lambda s: _set(container(head(s))["ports"][0], "hostPort", 8265),
         r"^headGroupSpec container ray-head: port \S+ has hostPort 8265"),
    case("host-path", lambda s: pod(worker(s, "learner")).setdefault("volumes", []).append(
        {"name": "root", "hostPath": {"path": "/"}}), r"^worker group learner: volume root is a hostPath"),
    case("auth-off-by-env", lambda s: container(worker(s, "rollout"))["env"].append({"name": "RAY_AUTH_MODE", "value": "disabled"}),
         r"^worker group rollout container ray-worker: env RAY_AUTH_MODE='disabled' turns"),
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
