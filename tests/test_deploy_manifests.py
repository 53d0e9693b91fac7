"""The KubeRay manifests in ``deploy/kuberay/`` checked offline, with no cluster: every shipped
file passes ``kuberay_checks`` (CRD schema, strict; KubeRay's admission rules; this project's
rules: pod hardening, network isolation); deliberately broken ones are in
``test_deploy_manifests_broken.py``.

The CRD schemas live outside the repository (``../shared/kuberay-crds``, or ``$AISRL_KUBERAY_CRDS``):
where they are missing, the tests that need them skip and every other test still runs.
"""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_facts import JOB_NAME, image_user
from kuberay_checks import (  # a helper package beside the tests
    ENTRYPOINT,
    HAVE_CRDS,
    RAY_KINDS,
    ROOT,
    crd_schemas,
    manifest_errors,
    needs_crds,
    runtime_env,
    schema_errors,
    shipped,
    shipped_files,
    shipped_kind,
)

from system.config import resolve_config


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


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_every_ray_pod_has_a_memory_backed_dev_shm(kind):
    """Ray's object store lives in /dev/shm; a container's default is 64 MB, and the head holds the
    driver's store (every batch it puts, every rollout result it reads): found missing on the head."""
    ray_pods = [p for p in pod_specs_in(shipped_kind(kind))
                if any(c["name"] in ("ray-head", "ray-worker") for c in p["containers"])]
    assert len(ray_pods) == 3  # head, rollout, learner (not the RayJob's submitter)
    for pod in ray_pods:
        memory = {v["name"] for v in pod.get("volumes", []) if (v.get("emptyDir") or {}).get("medium") == "Memory"}
        mounts = {m["name"] for c in pod["containers"] for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"}
        assert mounts and mounts <= memory, pod["containers"][0]["name"]
