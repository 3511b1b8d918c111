"""The test scheduler's pure core: which simulated node a pending pod goes to, or why none.

The filters are kube-scheduler's, in its order, each with the words it reports: a node that is
cordoned, unreachable (lost), outside the pod's `nodeSelector` or required node affinity, short of
a requested resource or of pod slots, or against required inter-pod (anti-)affinity is filtered
out; the feasible node with the most room left (cpu and memory, as LeastAllocated scores) wins,
ties by name. No clock, no threads, no store: `plan` is a function of the nodes, the pods already
bound and the pods to place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from .quantity import QuantityError, parse_quantity, pod_requests

__all__ = ["HOSTNAME_LABEL", "NodeView", "Placement", "label_selector_matches", "plan", "place"]

HOSTNAME_LABEL = "kubernetes.io/hostname"
_UNREACHABLE = "node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
_UNSCHEDULABLE = "node(s) were unschedulable"
_NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
_AFFINITY = "node(s) didn't match pod affinity rules"
_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
_TOO_MANY_PODS = "Too many pods"

Pod = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class NodeView:
    """What the scheduler knows of one node.

    Attributes:
        name: the Node's name.
        labels: its labels (`kubernetes.io/hostname` among them).
        allocatable: what pods may request there; "pods" is the number of pod slots.
        ready: False once the node is lost (its Ready condition is not True).
        unschedulable: cordoned (`spec.unschedulable`).
    """

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, Decimal]
    ready: bool = True
    unschedulable: bool = False

    @staticmethod
    def of(node: Mapping[str, Any]) -> NodeView:
        """The view of a Node object.

        Raises:
            QuantityError: an allocatable amount is not a quantity.
        """
        meta = node.get("metadata") or {}
        status = node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return NodeView(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            allocatable={k: parse_quantity(v) for k, v in (status.get("allocatable") or {}).items()},
            ready=ready,
            unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        )


@dataclasses.dataclass(frozen=True)
class Placement:
    """The decision for one pod: `node` is where it goes, or None and `message` says why not."""

    node: str | None
    message: str = ""


def _requirement_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    checks = {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }
    return checks.get(str(op), False)


def _node_term_matches(term: Mapping[str, Any], node: NodeView) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term selects no node
    return all(_requirement_matches(e, node.labels.get(str(e.get("key")))) for e in exprs) and all(
        _requirement_matches(f, node.name if f.get("key") == "metadata.name" else None) for f in fields
    )


def _matches_node_affinity(pod: Pod, node: NodeView) -> bool:
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(k) != str(v) for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    return any(_node_term_matches(term, node) for term in required.get("nodeSelectorTerms") or [])


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a metav1.LabelSelector (matchLabels, matchExpressions) selects `labels`; a missing
    selector selects nothing, an empty one everything."""
    if selector is None:
        return False
    if any(labels.get(k) != str(v) for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_requirement_matches(e, labels.get(str(e.get("key")))) for e in selector.get("matchExpressions") or [])


def _namespace(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def _labels(pod: Pod) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _term_selects(term: Mapping[str, Any], owner: Pod, other: Pod) -> bool:
    """Whether the (anti-)affinity term of `owner` selects pod `other`."""
    namespaces = term.get("namespaces") or [_namespace(owner)]
    if term.get("namespaceSelector") == {}:
        namespaces = None  # an empty namespace selector means every namespace
    if namespaces is not None and _namespace(other) not in namespaces:
        return False
    return label_selector_matches(term.get("labelSelector"), _labels(other))


def _required_terms(pod: Pod, kind: str) -> list[Mapping[str, Any]]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


@dataclasses.dataclass
class _Bound:
    pod: Pod
    node: NodeView


def _same_topology(term: Mapping[str, Any], a: NodeView, b: NodeView) -> bool:
    key = str(term.get("topologyKey") or "")
    return key in a.labels and key in b.labels and a.labels[key] == b.labels[key]


class _Occupancy:
    """What the bound pods hold: per node the summed requests and pod count, and the pods an
    inter-pod rule may concern. Built once per `plan`, updated as it places pods."""

    def __init__(self, nodes: Sequence[NodeView], bound: Iterable[tuple[Pod, str]]) -> None:
        self.by_name = {n.name: n for n in nodes}
        self.used: dict[str, dict[str, Decimal]] = {n.name: {} for n in nodes}
        self.count: dict[str, int] = {n.name: 0 for n in nodes}
        self.bound: list[_Bound] = []
        self.anti_holders: list[_Bound] = []  # bound pods with required anti-affinity
        for pod, name in bound:
            if name in self.by_name:
                try:
                    requests = pod_requests(pod)
                except QuantityError:
                    requests = {}  # a bound pod's bad quantities hold nothing (it was bound anyway)
                self.add(pod, name, requests)

    def add(self, pod: Pod, node: str, requests: Mapping[str, Decimal]) -> None:
        used = self.used[node]
        for name, amount in requests.items():
            used[name] = used.get(name, Decimal(0)) + amount
        self.count[node] += 1
        entry = _Bound(pod, self.by_name[node])
        self.bound.append(entry)
        if _required_terms(pod, "podAntiAffinity"):
            self.anti_holders.append(entry)


def _inter_pod_problem(pod: Pod, node: NodeView, held: _Occupancy) -> str:
    bound = held.bound
    for term in _required_terms(pod, "podAntiAffinity"):
        if any(_same_topology(term, node, b.node) and _term_selects(term, pod, b.pod) for b in bound):
            return _ANTI_AFFINITY
    for b in held.anti_holders:
        for term in _required_terms(b.pod, "podAntiAffinity"):
            if _same_topology(term, node, b.node) and _term_selects(term, b.pod, pod):
                return _EXISTING_ANTI_AFFINITY
    for term in _required_terms(pod, "podAffinity"):
        if any(_same_topology(term, node, b.node) and _term_selects(term, pod, b.pod) for b in bound):
            continue
        # As kube-scheduler: a term no pod satisfies anywhere is met by a pod that satisfies it
        # itself (the first of a group that wants to be together).
        nobody = not any(_term_selects(term, pod, b.pod) for b in bound)
        if not (nobody and _term_selects(term, pod, pod) and str(term.get("topologyKey") or "") in node.labels):
            return _AFFINITY
    return ""


def _problems(pod: Pod, requests: Mapping[str, Decimal], node: NodeView, held: _Occupancy) -> list[str]:
    """Why `pod` cannot go to `node`, in kube-scheduler's filter order (empty: it can)."""
    if node.unschedulable:
        return [_UNSCHEDULABLE]
    if not node.ready:
        return [_UNREACHABLE]
    if not _matches_node_affinity(pod, node):
        return [_NODE_AFFINITY]
    used = held.used[node.name]
    short = []
    if held.count[node.name] + 1 > node.allocatable.get("pods", Decimal(110)):
        short.append(_TOO_MANY_PODS)
    for name in sorted(requests):
        if requests[name] > 0 and used.get(name, Decimal(0)) + requests[name] > node.allocatable.get(name, Decimal(0)):
            short.append(f"Insufficient {name}")
    if short:
        return short
    problem = _inter_pod_problem(pod, node, held)
    return [problem] if problem else []


def _room_left(node: NodeView, requests: Mapping[str, Decimal], held: _Occupancy) -> Decimal:
    used = held.used[node.name]
    fractions = []
    for name in ("cpu", "memory"):
        allocatable = node.allocatable.get(name, Decimal(0))
        if allocatable > 0:
            fractions.append((allocatable - used.get(name, Decimal(0)) - requests.get(name, Decimal(0))) / allocatable)
    return sum(fractions, Decimal(0)) / len(fractions) if fractions else Decimal(0)


def _place(pod: Pod, nodes: Sequence[NodeView], held: _Occupancy) -> tuple[Placement, Mapping[str, Decimal]]:
    if not nodes:
        return Placement(None, "no nodes available to schedule pods"), {}
    try:
        requests = pod_requests(pod)
    except QuantityError as e:
        return Placement(None, f"0/{len(nodes)} nodes are available: the pod's resources are invalid: {e}."), {}
    feasible: list[NodeView] = []
    counts: dict[str, int] = {}
    for node in nodes:
        problems = _problems(pod, requests, node, held)
        if not problems:
            feasible.append(node)
        for problem in problems:
            counts[problem] = counts.get(problem, 0) + 1
    if not feasible:
        reasons = ", ".join(f"{counts[r]} {r}" for r in sorted(counts))
        return Placement(None, f"0/{len(nodes)} nodes are available: {reasons}."), requests
    best = min(feasible, key=lambda n: (-_room_left(n, requests, held), n.name))
    return Placement(best.name), requests


def place(pod: Pod, nodes: Sequence[NodeView], bound: Iterable[tuple[Pod, str]]) -> Placement:
    """Where `pod` goes among `nodes`, given the pods already bound ((pod, node name) pairs of
    pods that still hold their node), or why it cannot go anywhere (kube-scheduler's message)."""
    return _place(pod, nodes, _Occupancy(nodes, bound))[0]


def _order(pod: Pod) -> tuple[int, str, str, str]:
    meta = pod.get("metadata") or {}
    priority = int((pod.get("spec") or {}).get("priority") or 0)
    return (-priority, str(meta.get("creationTimestamp") or ""), _namespace(pod), str(meta.get("name") or ""))


def plan(
    pending: Iterable[Pod], nodes: Sequence[NodeView], bound: Iterable[tuple[Pod, str]]
) -> list[tuple[Pod, Placement]]:
    """Decisions for every pending pod, highest priority (then oldest) first; each placed pod
    counts against its node for the pods after it."""
    held = _Occupancy(nodes, bound)
    decisions = []
    for pod in sorted(pending, key=_order):
        decision, requests = _place(pod, nodes, held)
        if decision.node is not None:
            held.add(pod, decision.node, requests)
        decisions.append((pod, decision))
    return decisions
