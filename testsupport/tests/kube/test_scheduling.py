"""The test scheduler's pure core: filters, messages, and a state machine against a simple model.

Proven by the machine: no node ever holds more than its allocatable cpu, memory and pod slots; a
placed pod is on a ready, schedulable node its selector, node affinity and pod anti-affinity allow;
a pod left pending has no such node (checked by brute force in the model), and its message counts
every node.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from dlrover_testsupport.kube.scheduling import NodeView, Placement, place, plan
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

pytestmark = pytest.mark.timeout(120)
HOST = "kubernetes.io/hostname"


def node(name: str, cpu: int = 4, memory_gi: int = 8, pods: int = 110, **labels: str) -> NodeView:
    return NodeView(
        name,
        {HOST: name, **labels},
        {"cpu": Decimal(cpu), "memory": Decimal(memory_gi << 30), "pods": Decimal(pods)},
    )


def pod(name: str, cpu: str = "1", *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}], **spec},
    }


def avoid(*hosts: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": HOST, "operator": "NotIn", "values": list(hosts)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def spread(app: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOST}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


NODES = [node("n0"), node("n1", zone="b"), node("n2", cpu=1)]


def test_the_node_with_most_room_wins_and_ties_go_by_name() -> None:
    assert place(pod("a"), NODES, []) == Placement("n0")
    assert place(pod("a"), NODES, [(pod("x", "2"), "n0")]) == Placement("n1")


def test_resources_selector_and_node_affinity_filter_with_kube_scheduler_s_words() -> None:
    assert place(pod("a", "3"), NODES, [(pod("x", "2"), "n0"), (pod("y", "2"), "n1")]) == Placement(
        None, "0/3 nodes are available: 3 Insufficient cpu."
    )
    assert place(pod("a", nodeSelector={"zone": "b"}), NODES, []) == Placement("n1")
    assert place(pod("a", affinity=avoid("n0", "n1")), NODES, []) == Placement("n2")
    assert place(pod("a", "2", affinity=avoid("n0", "n1")), NODES, []) == Placement(
        None, "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector."
    )
    full = [node("f", pods=1)]
    assert place(pod("a"), full, [(pod("x", "0"), "f")]).message == "0/1 nodes are available: 1 Too many pods."
    gpu = pod("g")
    gpu["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    assert place(gpu, NODES, []).message == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert place(pod("a"), [], []).message == "no nodes available to schedule pods"


def test_lost_and_cordoned_nodes_take_nothing() -> None:
    lost = NodeView("l", {HOST: "l"}, {"cpu": Decimal(4)}, ready=False)
    cordoned = NodeView("c", {HOST: "c"}, {"cpu": Decimal(4)}, unschedulable=True)
    assert place(pod("a"), [lost, cordoned], []).message == (
        "0/2 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }, "
        "1 node(s) were unschedulable."
    )


def test_pod_anti_affinity_both_ways_and_pod_affinity() -> None:
    placed = [(pod("w0", labels={"app": "w"}), "n0")]
    assert place(pod("w1", labels={"app": "w"}, affinity=spread("w")), NODES, placed) == Placement("n1")
    # An existing pod's anti-affinity keeps a matching newcomer away, too.
    keeper = [(pod("k", labels={"app": "k"}, affinity=spread("w")), "n0")]
    assert place(pod("w", labels={"app": "w"}), NODES[:1], keeper).message == (
        "0/1 nodes are available: 1 node(s) didn't satisfy existing pods anti-affinity rules."
    )
    together = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST}
            ]
        }
    }
    assert place(pod("x", affinity=together), NODES, [(pod("db", "0", labels={"app": "db"}), "n1")]) == Placement("n1")
    assert "pod affinity" in place(pod("x", affinity=together), NODES, []).message
    # The first of a group that wants to be together may go anywhere.
    assert place(pod("db", labels={"app": "db"}, affinity=together), NODES, []).node == "n0"


def test_plan_places_by_priority_then_age_and_counts_earlier_placements() -> None:
    small = [node("only", cpu=2)]
    old = pod("old", "2") | {"metadata": {"name": "old", "creationTimestamp": "2026-01-01T00:00:00Z"}}
    new = pod("new", "2") | {"metadata": {"name": "new", "creationTimestamp": "2026-01-02T00:00:00Z"}}
    urgent = pod("urgent", "2", priority=100) | {
        "metadata": {"name": "urgent", "creationTimestamp": "2026-01-03T00:00:00Z"}
    }
    decisions = {p["metadata"]["name"]: d.node for p, d in plan([new, old, urgent], small, [])}
    assert decisions == {"urgent": "only", "old": None, "new": None}
    decisions = {p["metadata"]["name"]: d.node for p, d in plan([new, old], small, [])}
    assert decisions == {"old": "only", "new": None}


# ----------------------------------------------------------------- the state machine

CPUS = st.sampled_from(["0", "500m", "1", "2", "3"])
HOSTS = ["h0", "h1", "h2"]


def allowed(p: dict[str, Any], n: NodeView) -> bool:
    """The model's own reading of what the machine's pods may ask: hostname NotIn, nodeSelector."""
    spec = p["spec"]
    if any(n.labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms")
    return not terms or n.name not in terms[0]["matchExpressions"][0]["values"]


def cpu_of(p: dict[str, Any]) -> Decimal:
    text = p["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    return Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)


def spreads(p: dict[str, Any]) -> str | None:
    terms = ((p["spec"].get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return terms[0]["labelSelector"]["matchLabels"]["app"] if terms else None


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.nodes = {h: NodeView(h, {HOST: h}, {"cpu": Decimal(3), "pods": Decimal(3)}) for h in HOSTS}
        self.bound: dict[str, tuple[dict[str, Any], str]] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, str] = {}
        self.count = 0

    def _plan(self) -> None:
        decisions = plan(list(self.pending.values()), list(self.nodes.values()), list(self.bound.values()))
        for p, decision in decisions:
            name = p["metadata"]["name"]
            if decision.node is not None:
                assert self._fits(p, decision.node, exclude=name), (name, decision.node)
                self.bound[name] = (self.pending.pop(name), decision.node)
                self.messages.pop(name, None)
            else:
                self.messages[name] = decision.message

    def _fits(self, p: dict[str, Any], host: str, *, exclude: str = "") -> bool:
        n = self.nodes[host]
        if not n.ready or n.unschedulable or not allowed(p, n):
            return False
        here = [q for name, (q, h) in self.bound.items() if h == host and name != exclude]
        if len(here) + 1 > n.allocatable["pods"]:
            return False
        if cpu_of(p) > 0 and sum((cpu_of(q) for q in here), Decimal(0)) + cpu_of(p) > n.allocatable["cpu"]:
            return False
        app = spreads(p)
        mine = p["metadata"]["labels"].get("app")
        return not any(
            (app is not None and q["metadata"]["labels"].get("app") == app)
            or (spreads(q) is not None and spreads(q) == mine)
            for q in here
        )

    @rule(
        cpu=CPUS,
        avoid_hosts=st.lists(st.sampled_from(HOSTS), max_size=2, unique=True),
        pin=st.none() | st.sampled_from(HOSTS),
        app=st.none() | st.sampled_from(["a", "b"]),
    )
    def add_pod(self, cpu: str, avoid_hosts: list[str], pin: str | None, app: str | None) -> None:
        self.count += 1
        name = f"p{self.count}"
        spec: dict[str, Any] = {}
        if avoid_hosts:
            spec["affinity"] = avoid(*avoid_hosts)
        if pin:
            spec["nodeSelector"] = {HOST: pin}
        new = pod(name, cpu, labels={"app": app} if app else {}, **spec)
        new["metadata"]["creationTimestamp"] = f"{self.count:08d}"
        if app:
            new["spec"].setdefault("affinity", {}).update(spread(app))
        self.pending[name] = new
        self._plan()

    @precondition(lambda self: self.bound)
    @rule(data=st.data())
    def finish_pod(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.bound)))
        del self.bound[name]
        self._plan()

    @rule(host=st.sampled_from(HOSTS), ready=st.booleans(), cordoned=st.booleans())
    def change_node(self, host: str, ready: bool, cordoned: bool) -> None:
        n = self.nodes[host]
        self.nodes[host] = NodeView(n.name, n.labels, n.allocatable, ready=ready, unschedulable=cordoned)
        if not ready:  # a lost node's pods fail and free it
            for name in [k for k, (_, h) in self.bound.items() if h == host]:
                del self.bound[name]
        self._plan()

    @invariant()
    def no_node_is_overcommitted(self) -> None:
        for host, n in self.nodes.items():
            here = [q for q, h in self.bound.values() if h == host]
            assert len(here) <= n.allocatable["pods"]
            assert sum((cpu_of(q) for q in here), Decimal(0)) <= n.allocatable["cpu"]

    @invariant()
    def placed_pods_keep_their_anti_affinity(self) -> None:
        for host in HOSTS:
            apps = [q["metadata"]["labels"].get("app") for q, h in self.bound.values() if h == host and spreads(q)]
            assert len(apps) == len(set(apps))

    @invariant()
    def a_pending_pod_fits_nowhere_and_its_message_counts_every_node(self) -> None:
        for name, p in self.pending.items():
            assert not any(self._fits(p, h) for h in HOSTS), name
            message = self.messages[name]
            assert message.startswith(f"0/{len(HOSTS)} nodes are available: ")
            counts = [int(part.split(" ", 1)[0]) for part in message.split(": ", 1)[1].rstrip(".").split(", ")]
            assert sum(counts) >= len(HOSTS)


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
