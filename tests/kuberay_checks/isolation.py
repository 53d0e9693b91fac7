"""Layer 5: the NetworkPolicies of one file against its cluster (who may reach which pod)."""



from kuberay_checks.admission import groups

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
