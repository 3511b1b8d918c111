"""What the master makes of a backend's reasons: OOMKilled, disruptions (evicted, preempted, node lost)
and why nodes stay pending. The lifecycle core directly, and the master through the fake backend."""

from __future__ import annotations

import pytest

from dlrover.autoscale import Resources
from dlrover.common import ManualClock
from dlrover.diagnosis import FailureKind
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.journal import MemoryJournal
from dlrover.master.lifecycle import JobLifecycle, NodeStateError
from dlrover.master.master import Master
from dlrover.master.policy import DefaultFailurePolicy
from dlrover.master.scheduler.base import NodePlacement, ObservedState
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import JobState, NodeState


def lifecycle(nodes: int = 2, **kw: object) -> JobLifecycle:
    cfg = LifecycleConfig(nodes=NodeRange(1, nodes), heartbeat_timeout_s=10.0, **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    return life


def make(nodes: int = 2, **lifecycle_kw: object) -> tuple[Master, FakeScheduler, ManualClock]:
    cfg = MasterConfig(
        job_name="t",
        lifecycle=LifecycleConfig(
            nodes=NodeRange(1, nodes), heartbeat_timeout_s=10.0, insufficient_nodes_window_s=60.0, **lifecycle_kw
        ),  # type: ignore[arg-type]
        heartbeat_interval_s=1.0,
    )
    sched = FakeScheduler()
    clock = ManualClock()
    # The product's default policy (create_master's): the diagnosis classifier.
    return Master(cfg, sched, MemoryJournal(), clock, policy=DiagnosisFailurePolicy()), sched, clock


# ----------------------------------------------------------------- the lifecycle core


def test_a_disruption_relaunches_the_rank_without_charging_any_budget() -> None:
    life = lifecycle(max_relaunches=1, max_job_failures=0)
    life.register(0, "a", "h0", 1.0)
    for i in range(3):  # far beyond max_relaunches 1 and max_job_failures 0
        node = life.current_nodes()[0]
        out = life.node_disrupted(node.node_id, "Evicted", "The node was low on memory.", 2.0 + i, host="n1")
        assert life.node(node.node_id).state is NodeState.RELAUNCHING
        replacement = life.current_nodes()[0]
        assert replacement.relaunch_count == node.relaunch_count + 1
        assert replacement.disruptions == i + 1
        assert [e.kind for e in out.events if e.kind == "disruption"] == ["disruption"]
    assert life.job_failures == 0
    assert life.job_state is JobState.RUNNING
    assert not life.avoid_hosts  # evicted: the host is not at fault


def test_a_failure_after_disruptions_is_judged_on_the_charged_relaunches_only() -> None:
    life = lifecycle(nodes=1, max_relaunches=1)
    first = life.current_nodes()[0]
    life.node_disrupted(first.node_id, "Preempted", "preempted by a higher priority pod", 1.0)
    second = life.current_nodes()[0]
    decision, _ = life.node_lost(second.node_id, "the agent exited", 2.0)
    assert decision.action.relaunches_node  # one relaunch left: the disruption did not spend it
    third = life.current_nodes()[0]
    assert (third.relaunch_count, third.disruptions) == (2, 1)
    decision, _ = life.node_lost(third.node_id, "the agent exited", 3.0)
    assert not decision.action.relaunches_node
    assert life.job_state is JobState.FAILED


def test_a_lost_host_is_avoided_by_the_relaunch() -> None:
    life = lifecycle()
    node = life.current_nodes()[1]
    out = life.node_disrupted(node.node_id, "NodeLost", "node n2 not ready", 1.0, host="n2", avoid_host=True)
    assert "n2" in life.avoid_hosts
    launches = [e for e in out.effects if hasattr(e, "avoid_hosts")]
    assert launches
    assert "n2" in launches[0].avoid_hosts


def test_a_disruption_of_a_finishing_job_removes_the_node() -> None:
    life = lifecycle()
    life.register(0, "a", "h0", 1.0)
    life.register(1, "b", "h1", 1.0)
    life.report_success(0, 2.0)
    life.node_disrupted(1, "Evicted", "evicted", 3.0)
    assert life.node(1).state is NodeState.REMOVED
    assert life.job_state is JobState.SUCCEEDED


def test_a_disrupted_spare_is_not_a_spare_loss() -> None:
    life = lifecycle(spare_nodes=1)
    life.keep_spares(0.0)
    spare = life.spare_nodes()[0]
    life.node_disrupted(spare.node_id, "Preempted", "preempted", 1.0)
    assert life.node(spare.node_id).state is NodeState.FAILED
    assert life.spare_failures == 0
    assert life.job_failures == 0


def test_disrupting_a_node_that_is_gone_changes_nothing() -> None:
    life = lifecycle()
    node = life.current_nodes()[0]
    life.node_disrupted(node.node_id, "Evicted", "evicted", 1.0)
    before = life.snapshot()
    with pytest.raises(NodeStateError):
        life.node_disrupted(node.node_id, "Evicted", "evicted", 2.0)
    assert life.snapshot() == before


def test_pending_reasons_are_named_when_the_nodes_are_announced_and_when_the_job_stops() -> None:
    life = lifecycle(nodes=2, node_pending_timeout_s=5.0, insufficient_nodes_window_s=20.0)
    life.register(0, "a", "h0", 1.0)
    why = {1: "Unschedulable: 0/3 nodes are available: 3 Insufficient memory."}
    out = life.tick(6.0, pending_reasons=why)
    announced = [e for e in out.events if e.kind == "nodes_pending"]
    assert len(announced) == 1
    assert "0/3 nodes are available: 3 Insufficient memory." in announced[0].message
    assert announced[0].data["reasons"] == {"1": why[1]}
    # Node 0 is lost; the one left cannot be placed: the job stops, saying why.
    life.node_lost(0, "gone", 7.0)
    life.tick(8.0, pending_reasons=why)
    life.tick(40.0, pending_reasons=why)
    assert life.job_state is JobState.FAILED
    assert "Insufficient memory" in life.exit_reason


# ----------------------------------------------------------------- the master


def test_an_oom_killed_pod_is_relaunched_with_more_memory() -> None:
    master, sched, _ = make(nodes=1, node_resources=Resources(cpu=1, memory_mb=1000))
    master.start()
    master.register(0, "a", "h0")
    sched.set_state(0, ObservedState.FAILED, 137, "n1", reason="OOMKilled", evidence="container main: OOMKilled")
    master.tick()
    assert master.node(0).state is NodeState.RELAUNCHING
    relaunched = sched.specs[1]
    assert relaunched.resources is not None
    assert relaunched.resources.memory_mb > 1000
    kinds = [e.kind for e in master.events(limit=1000)]
    assert "oom_relaunch" in kinds
    assert "host_oom" in master.node(0).last_failure
    assert "OOMKilled" in master.node(0).last_failure


@pytest.mark.parametrize("reason", ["Evicted", "Preempted", "Deleted"])
def test_an_evicted_or_preempted_pod_is_relaunched_without_a_budget_charge(reason: str) -> None:
    master, sched, _ = make(nodes=1, max_relaunches=0, max_job_failures=0)
    master.start()
    master.register(0, "a", "h0")
    sched.set_state(
        0, ObservedState.FAILED, None, "n1", reason=reason, evidence="the platform said so", disruption=True
    )
    master.tick()
    assert master.node(0).state is NodeState.RELAUNCHING
    assert sorted(sched.specs) == [0, 1]
    assert not sched.specs[1].avoid_hosts
    assert master.job_state is JobState.RUNNING
    assert master.status().job_failures == 0
    events = [e for e in master.events(limit=1000) if e.kind == "disruption"]
    assert len(events) == 1
    assert reason in events[0].message


def test_a_lost_node_is_relaunched_away_from_its_host() -> None:
    master, sched, _ = make(nodes=2)
    master.start()
    sched.set_state(1, ObservedState.FAILED, None, "node-b", reason="NodeLost", evidence="node lost", disruption=True)
    master.tick()
    assert "node-b" in sched.specs[2].avoid_hosts
    assert sched.specs[2].rank == 1


def test_an_unschedulable_pending_pod_is_announced_with_the_scheduler_message() -> None:
    master, sched, clock = make(nodes=2, node_pending_timeout_s=5.0)
    master.start()
    master.register(0, "a", "h0")
    message = "Unschedulable: 0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    sched.set_state(1, ObservedState.PENDING, reason="Unschedulable", evidence=message)
    master.tick()
    clock.advance(6.0)
    master.heartbeat(0)
    master.tick()
    pending = [e for e in master.events(limit=1000) if e.kind == "nodes_pending"]
    assert len(pending) == 1
    assert "didn't match Pod's node affinity/selector" in pending[0].message


class PlacingScheduler(FakeScheduler):
    """A fake that knows where it placed each node, as the Kubernetes backend knows a pod's node."""

    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[int, str] = {}

    def placed_host(self, node_id: int) -> str:
        return self.hosts.get(node_id, "")


def test_the_host_the_backend_placed_a_node_on_is_the_one_recorded_and_avoided() -> None:
    cfg = MasterConfig(job_name="t", lifecycle=LifecycleConfig(nodes=NodeRange(1, 2), heartbeat_timeout_s=10.0))
    sched = PlacingScheduler()
    master = Master(cfg, sched, MemoryJournal(), ManualClock(), policy=DiagnosisFailurePolicy())
    assert isinstance(sched, NodePlacement)
    master.start()
    sched.hosts[0] = "k8s-node-1"
    # Inside a pod the agent's own host name is the pod's: the backend's placement wins.
    assert master.register(0, "a", "j-worker-0").host == "k8s-node-1"
    assert master.register(1, "b", "j-worker-1").host == "j-worker-1"  # not placed (yet): the agent's word
    master.report_failure(0, FailureKind.HARDWARE, "GPU has fallen off the bus")
    assert [e.data["host"] for e in master.events(limit=1000) if e.kind == "host_avoided"] == ["k8s-node-1"]
    assert "k8s-node-1" in sched.specs[2].avoid_hosts
