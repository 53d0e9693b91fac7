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

Modules: ``files`` (loading), ``schema``, ``admission``, ``policy``, ``network_policy``,
``isolation`` (layers 1-5); ``manifest_errors`` here runs them all over one file. Deliberately broken manifests, made by mutating
the shipped ones, must each fail for their reason.
"""


from kuberay_checks.admission import operator_errors, runtime_env
from kuberay_checks.files import (
    CRD_DIR,
    ENTRYPOINT,
    HAVE_CRDS,
    RAY_KINDS,
    ROOT,
    crd_schemas,
    load_docs,
    needs_crds,
    shipped,
    shipped_files,
    shipped_kind,
)
from kuberay_checks.isolation import isolation_errors
from kuberay_checks.network_policy import network_policy_errors
from kuberay_checks.policy import policy_errors
from kuberay_checks.schema import check, schema_errors

__all__ = ["CRD_DIR", "ENTRYPOINT", "HAVE_CRDS", "RAY_KINDS", "ROOT", "all_errors", "check", "crd_schemas", "load_docs", "manifest_errors", "needs_crds", "runtime_env", "schema_errors", "shipped", "shipped_files", "shipped_kind"]


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
