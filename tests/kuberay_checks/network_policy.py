"""Layer 4: a NetworkPolicy against the structure of networking.k8s.io/v1, written out here."""

import ipaddress
import re

from kuberay_checks.admission import DNS1123_SUBDOMAIN, label_errors
from kuberay_checks.schema import is_int, join, kind_of

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
