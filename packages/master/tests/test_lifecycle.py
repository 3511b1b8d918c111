"""Unit tests of the node lifecycle core (pure: time is passed in)."""

from __future__ import annotations

import attrs
import pytest

from dlrover.common import ConfigError
from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.master.config import LifecycleConfig, NodeRange, parse_node_range
from dlrover.master.lifecycle import (
    HostAvoidedError,
    JobFinishedError,
    JobFullError,
    JobLifecycle,
    LifecycleError,
    NodeConflictError,
    NodeStateError,
    UnknownNodeError,
)
from dlrover.master.policy import Classification, DefaultFailurePolicy, Failure
from dlrover.master.records import LaunchNode, StopNode, node_from_dict, node_to_dict
from dlrover.master.resize import ResizeRequest
from dlrover.master.states import TRANSITIONS, IllegalTransitionError, JobState, NodeState, check_transition


def make(nodes: int = 2, min_nodes: int | None = None, now: float = 0.0, **kw: object) -> JobLifecycle:
    cfg = LifecycleConfig(
        nodes=NodeRange(min_nodes=min_nodes or nodes, max_nodes=nodes),
        **kw,  # type: ignore[arg-type]
    )
    life = JobLifecycle(cfg, DefaultFailurePolicy(), now)
    life.start(now)
    return life


def register_all(life: JobLifecycle, now: float = 0.0) -> None:
    for node_id, node in sorted(life.nodes().items()):
        if node.state is NodeState.PENDING:
            life.register(node_id, f"agent-{node.rank}", f"host-{node.rank}", now)


def test_transition_table_is_what_check_transition_enforces() -> None:
    for src in NodeState:
        for dst in NodeState:
            assert (check_transition(src, dst) is None) == (dst in TRANSITIONS[src])
    reason = check_transition(NodeState.SUCCEEDED, NodeState.FAILED)
    assert reason is not None
    assert "terminal" in reason
    reason = check_transition(NodeState.PENDING, NodeState.SUCCEEDED)
    assert reason is not None
    assert "pending -> succeeded" in reason


def test_start_creates_one_pending_node_per_rank_and_is_idempotent() -> None:
    life = JobLifecycle(LifecycleConfig(nodes=NodeRange(1, 3)), DefaultFailurePolicy(), 0.0)
    with pytest.raises(NodeStateError, match="not started"):
        life.register(None, "early", "h", 0.0)
    out = life.start(0.0)
    launches = [e for e in out.effects if isinstance(e, LaunchNode)]
    assert [(e.node_id, e.rank) for e in launches] == [(0, 0), (1, 1), (2, 2)]
    assert all(n.state is NodeState.PENDING for n in life.nodes().values())
    assert life.start(1.0).effects == ()
    assert len(life.nodes()) == 3


def test_register_claims_a_launched_node_and_refuses_a_second_claimer() -> None:
    life = make(2)
    life.node_started(0, 0.5)
    node, out = life.register(0, "a", "h0", 1.0)
    assert node.state is NodeState.RUNNING
    assert node.registered
    assert node.host == "h0"
    assert [t.to_state for t in node.history] == [NodeState.PENDING, NodeState.STARTING, NodeState.RUNNING]
    assert out.changed_nodes == {0}
    before = life.snapshot()
    with pytest.raises(NodeConflictError, match="already registered"):
        life.register(0, "intruder", "h9", 2.0)
    assert life.snapshot() == before
    again, _ = life.register(0, "a", "h0", 3.0, proven_node_id=0)
    assert again.node_id == 0
    assert again.last_heartbeat == 3.0


@pytest.mark.parametrize("launched", [True, False])
def test_a_registration_repeated_with_its_digest_is_the_same_one_and_changes_nothing_else(launched: bool) -> None:
    life = make(2)
    claim = 1 if launched else None
    node, _ = life.register(claim, "a", "h0", 1.0, registration_digest="d" * 64)
    assert node.registration_digest == "d" * 64
    before = life.snapshot()
    # The answer was lost: the agent asks again with the same digest and gets the same node.
    again, out = life.register(claim, "a", "h0", 2.0, registration_digest="d" * 64)
    assert (again.node_id, again.rank, again.history) == (node.node_id, node.rank, node.history)
    assert again.last_heartbeat == 2.0
    assert out.events == ()
    assert out.effects == ()
    assert [attrs.evolve(r, last_heartbeat=0.0) for _, r in sorted(life.nodes().items())] == [
        attrs.evolve(r, last_heartbeat=0.0) for r in sorted(before.nodes, key=lambda r: r.node_id)
    ]
    # Another digest, or none, is another agent: a conflict for the launched node, the next
    # free rank for an agent that claims none.
    if launched:
        for digest in ("e" * 64, ""):
            with pytest.raises(NodeConflictError, match="already registered"):
                life.register(1, "b", "h1", 3.0, registration_digest=digest)
    else:
        other, _ = life.register(None, "b", "h1", 3.0, registration_digest="e" * 64)
        assert other.node_id != node.node_id


def test_a_repeat_is_recognised_after_a_master_restart_and_not_after_a_rollback() -> None:
    life = make(2)
    first, _ = life.register(None, "a", "h0", 1.0, registration_digest="d" * 64)
    # The first attempt was journaled, then the master restarted before its answer left.
    restored = JobLifecycle(life.config, DefaultFailurePolicy(), 5.0, snapshot=life.snapshot())
    again, out = restored.register(None, "a", "h0", 6.0, registration_digest="d" * 64)
    assert (again.node_id, out.events) == (first.node_id, ())
    # A registration that could not be journaled never happened: the same key registers afresh.
    point = restored.savepoint()
    restored.register(None, "b", "h1", 7.0, registration_digest="e" * 64)
    restored.rollback(point)
    fresh, out = restored.register(None, "b", "h1", 8.0, registration_digest="e" * 64)
    assert out.events, "a real registration reports itself"
    assert (fresh.history[-1].to_state, fresh.history[-1].at) == (NodeState.RUNNING, 8.0)


def test_an_agent_that_proves_its_node_reconnects_whatever_its_registration_digest() -> None:
    life = make(2)
    life.register(0, "a", "h0", 1.0, registration_digest="d" * 64)
    node, out = life.register(0, "a", "h0", 2.0, proven_node_id=0, max_process_restarts=7, registration_digest="d" * 64)
    assert [e.kind for e in out.events] == ["node_reconnect"]
    assert node.max_process_restarts == 7


def test_a_repeated_registration_of_a_node_that_failed_since_is_not_the_same_one() -> None:
    life = make(2, min_nodes=1)
    life.register(0, "a", "h0", 1.0, registration_digest="d" * 64)
    life.report_failure(0, FailureKind.HARDWARE, "ecc", 2.0)
    assert life.node(0).state is not NodeState.RUNNING
    before = life.snapshot()
    with pytest.raises(LifecycleError):  # its host is avoided now, and the node is no longer running
        life.register(0, "a", "h0", 3.0, registration_digest="d" * 64)
    with pytest.raises(NodeStateError, match="cannot register"):
        life.register(0, "a", "h9", 3.0, registration_digest="d" * 64)
    assert life.snapshot() == before


def test_a_node_journaled_before_registration_digests_reads_without_one() -> None:
    life = make(1)
    node, _ = life.register(0, "a", "h0", 1.0, registration_digest="d" * 64)
    assert node_from_dict(node_to_dict(node)) == node
    old = node_to_dict(node)
    del old["registration_digest"]
    assert node_from_dict(old).registration_digest == ""


def test_register_without_id_takes_lowest_free_rank_then_refuses_when_full() -> None:
    life = make(2)
    assert life.register(None, "x", "hx", 0.0)[0].rank == 0
    assert life.register(None, "y", "hy", 0.0)[0].rank == 1
    before = life.snapshot()
    with pytest.raises(JobFullError, match="no free node slot"):
        life.register(None, "z", "hz", 0.0)
    with pytest.raises(UnknownNodeError, match="42"):
        life.register(42, "z", "hz", 0.0)
    assert life.snapshot() == before


def test_heartbeat_timeout_relaunches_with_the_same_rank() -> None:
    life = make(2, min_nodes=1, heartbeat_timeout_s=10.0)
    register_all(life)
    life.heartbeat(0, 5.0, step=3)
    out = life.tick(10.5)  # node 1 silent for 10.5 s; node 0 for 5.5 s
    assert {(type(e).__name__, e.node_id) for e in out.effects} == {("StopNode", 1), ("LaunchNode", 2)}
    old, new = life.node(1), life.node(2)
    assert old.state is NodeState.RELAUNCHING
    assert old.replaced_by == 2
    assert new.rank == old.rank == 1
    assert new.replaces == 1
    assert new.relaunch_count == 1
    assert "preemption: no heartbeat" in old.history[-2].reason
    assert life.node(0).state is NodeState.RUNNING
    assert life.current_nodes()[1].node_id == 2
    # The replaced node, if it comes back, is told to stop and changes nothing.
    actions, out = life.heartbeat(1, 11.0)
    assert actions[0].kind is ActionKind.REMOVE_NODE
    assert "replaced by node 2" in actions[0].reason
    assert not actions[0].planned_round  # replaced for a failure: no shrink's save first
    assert out.changed_nodes == frozenset()


def test_process_crash_restarts_processes_within_budget_then_relaunches() -> None:
    life = make(1, max_process_restarts=2)
    register_all(life)
    for i in range(2):
        decision, _ = life.report_failure(0, FailureKind.UNKNOWN, f"exit 1 #{i}", 1.0)
        assert decision.action is ActionKind.RESTART_PROCESSES
    actions, _ = life.heartbeat(0, 1.5)
    assert [a.kind for a in actions] == [ActionKind.RESTART_PROCESSES] * 2
    assert life.heartbeat(0, 1.6)[0] == ()  # delivered once
    decision, out = life.report_failure(0, FailureKind.UNKNOWN, "exit 1 again", 2.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert "restarted 2 of 2 times (max_process_restarts), no restarts left, so the node is relaunched" in (
        decision.outcome
    )
    assert any(isinstance(e, LaunchNode) and e.rank == 0 for e in out.effects)
    assert life.node(0).process_restarts == 2


def test_an_agents_declared_restart_budget_replaces_the_configured_one() -> None:
    life = make(1, max_process_restarts=1)
    node, _ = life.register(0, "a", "h0", 0.0, max_process_restarts=4)
    assert (node.max_process_restarts, life.restart_budget(node)) == (4, 4)
    for i in range(4):
        decision, out = life.report_failure(0, FailureKind.UNKNOWN, f"exit 1 #{i}", 1.0 + i, answered=True)
        assert decision.action is ActionKind.RESTART_PROCESSES
    # The one count, in the event as in the decision: "restart k of n".
    assert any(e.kind == "process_restart" and "restart 4 of 4 (--max-restarts)" in e.message for e in out.events)
    assert "restart 4 of 4 (--max-restarts)" in decision.outcome
    decision, _ = life.report_failure(0, FailureKind.UNKNOWN, "exit 1 again", 9.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    # The budget is journaled with the node, so a restarted master keeps it.
    assert node_from_dict(node_to_dict(life.node(0))).max_process_restarts == 4


def test_a_reconnect_keeps_the_declared_budget_and_a_negative_one_is_refused() -> None:
    life = make(2)
    life.register(0, "a", "h0", 0.0, max_process_restarts=6)
    node, _ = life.register(0, "a", "h0", 1.0, proven_node_id=0)
    assert node.max_process_restarts == 6
    before = life.snapshot()
    with pytest.raises(LifecycleError, match="max_process_restarts"):
        life.register(1, "b", "h1", 1.0, max_process_restarts=-1)
    assert life.snapshot() == before


def external(nodes: int = 1, **kw: object) -> JobLifecycle:
    """A job whose scheduler starts no node itself (bare metal, Slurm, a standalone dlrover-run)."""
    cfg = LifecycleConfig(nodes=NodeRange(nodes, nodes), **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0, scheduler_relaunches=False)
    life.start(0.0)
    return life


def test_without_a_relaunching_scheduler_a_relaunch_of_a_live_agent_restarts_it_in_place() -> None:
    life = external()
    life.register(0, "a", "h0", 0.0, max_process_restarts=2)
    decision, _ = life.report_failure(0, FailureKind.HARDWARE, "GPU fell off the bus", 1.0)
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert decision.outcome.endswith("restart 1 of 2 (--max-restarts), in place: this job's backend starts no new node")
    assert not decision.avoid_host
    assert life.avoid_hosts == {}
    assert life.report_failure(0, FailureKind.HARDWARE, "again", 2.0)[0].action is ActionKind.RESTART_PROCESSES
    # Restarts spent: the node leaves the job, which has no other node, so the job stops; no
    # node is said to be created or relaunched, since nothing would start one.
    decision, out = life.report_failure(0, FailureKind.HARDWARE, "and again", 3.0)
    assert decision.action is ActionKind.ABORT_JOB
    assert decision.outcome == life.exit_reason
    assert "restarted 2 of 2 times (--max-restarts), no restarts left" in decision.outcome
    assert decision.outcome.endswith("the node leaves the job; no node is left: the job stops")
    assert "relaunch" not in decision.outcome
    assert not any(isinstance(e, LaunchNode) for e in out.effects)
    assert not any(e.kind in ("node_created", "relaunch") for e in out.events)
    assert life.node(0).state is NodeState.REMOVED
    assert life.job_state is JobState.FAILED


def test_without_a_relaunching_scheduler_a_spent_node_leaves_and_the_others_go_on() -> None:
    life = external(2)
    register_all(life)
    life.register(0, "a", "host-0", 0.5, proven_node_id=0, max_process_restarts=0)
    decision, out = life.report_failure(0, FailureKind.UNKNOWN, "exit 1", 1.0)
    assert decision.action is ActionKind.REMOVE_NODE
    assert "restarted 0 of 0 times (--max-restarts), no restarts left" in decision.outcome
    assert not any(isinstance(e, LaunchNode) for e in out.effects)
    assert life.job_state is JobState.RUNNING
    assert life.node(1).state is NodeState.RUNNING


def test_without_a_relaunching_scheduler_a_node_that_is_gone_or_leaving_is_still_relaunched() -> None:
    life = external(2, heartbeat_timeout_s=10.0)
    register_all(life)
    # The network check left node 0 out: its agent exits whatever the answer.
    decision, out = life.report_failure(0, FailureKind.COMMUNICATION, "node check failed", 1.0, agent_exits=True)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert "its agent exits after this report" in decision.outcome
    assert life.node(0).state is NodeState.RELAUNCHING
    # Nothing here starts the node: the events say the rank is open for an agent, not that a node
    # was created or that one replaced the other.
    messages = [e.message for e in out.events if e.kind in ("node_created", "relaunch")]
    assert messages[0].startswith("rank 0 open for an agent to register as node 2 (this job's backend starts none)")
    assert messages[1].startswith("rank 0: node 0 let go; node 2 waits for an agent to register in its place")
    assert not any("created for rank" in m or "replaced by" in m for m in messages)
    # A node the master lost has no agent to restart anything.
    out = life.tick(20.0)
    assert life.node(1).state is NodeState.RELAUNCHING
    assert any(isinstance(e, LaunchNode) and e.rank == 1 for e in out.effects)


class Scripted:
    """A policy that answers `action` to every failure and keeps the failures it was handed."""

    def __init__(self, action: ActionKind) -> None:
        self.action = action
        self.seen: list[Failure] = []

    def decide(self, failure: Failure) -> Decision:
        self.seen.append(failure)
        return Decision(self.action, failure.kind, str(failure.node.node_id), f"scripted {self.action.value}")


def scripted(action: ActionKind, *, scheduler_relaunches: bool = True, **kw: object) -> tuple[JobLifecycle, Scripted]:
    policy = Scripted(action)
    cfg = LifecycleConfig(nodes=NodeRange(2, 2), **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, policy, 0.0, scheduler_relaunches=scheduler_relaunches)
    life.start(0.0)
    register_all(life)
    return life, policy


def test_the_policy_is_handed_every_fact_it_decides_on() -> None:
    life, policy = scripted(ActionKind.RELAUNCH_NODE, scheduler_relaunches=False, max_relaunches=4)
    life.register(0, "agent-0", "host-0", 0.5, proven_node_id=0, max_process_restarts=7)
    life.report_failure(0, FailureKind.COMMUNICATION, "node check failed", 1.0, agent_exits=True)
    life.node_lost(1, "no heartbeat", 2.0)
    reported, lost = policy.seen
    assert (reported.restarts.used, reported.restarts.limit, reported.restarts.source) == (0, 7, "--max-restarts")
    assert (reported.relaunches.used, reported.relaunches.limit) == (0, 4)
    assert (reported.backend_relaunches, reported.agent_exits, reported.observed_by_master) == (False, True, False)
    assert reported.no_restart == "its agent exits after this report"
    assert reported.relaunch_possible  # the agent leaves: its rank opens for a new one
    assert (lost.agent_exits, lost.observed_by_master, lost.no_restart) == (False, True, "")
    assert lost.relaunch_possible


def test_the_lifecycle_applies_the_policys_restarts_without_a_budget_of_its_own() -> None:
    # The budgets live in the policy: one that grants restarts beyond max_process_restarts is obeyed.
    life, _ = scripted(ActionKind.RESTART_PROCESSES, max_process_restarts=1, max_job_failures=10)
    for i in range(4):
        decision, _ = life.report_failure(0, FailureKind.UNKNOWN, "exit 1", float(i + 1))
        assert (decision.action, decision.outcome) == (ActionKind.RESTART_PROCESSES, "scripted restart_processes")
    assert life.node(0).process_restarts == 4


@pytest.mark.parametrize(
    ("action", "agent_exits", "why"),
    [
        (ActionKind.NONE, False, "a node whose processes failed needs an action"),
        (ActionKind.RESTART_PROCESSES, True, "its agent exits after this report"),
        (ActionKind.ROLLBACK_CHECKPOINT, True, "its agent exits after this report"),
    ],
)
def test_a_decision_nobody_can_carry_out_lets_the_node_go_and_says_why(
    action: ActionKind, agent_exits: bool, why: str
) -> None:
    life, _ = scripted(action)
    decision, out = life.report_failure(0, FailureKind.UNKNOWN, "exit 1", 1.0, agent_exits=agent_exits)
    assert decision.action is ActionKind.REMOVE_NODE
    assert decision.outcome == (
        f"scripted {action.value}; but the failure policy's {action.value} cannot be carried out ({why}): "
        "the node leaves the job"
    )
    assert life.node(0).state is NodeState.REMOVED
    assert life.node(0).process_restarts == 0
    assert not any(isinstance(e, LaunchNode) for e in out.effects)


def test_relaunch_budget_exhausted_removes_the_node_and_the_job_fails() -> None:
    life = make(1, max_relaunches=1, insufficient_nodes_window_s=5.0)
    register_all(life)
    decision, _ = life.report_failure(0, FailureKind.HARDWARE, "GPU fell off the bus", 1.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert decision.avoid_host
    assert "host-0" in life.avoid_hosts
    launch = [e for e in life.start(0.0).effects]  # idempotent, nothing new
    assert launch == []
    with pytest.raises(HostAvoidedError, match="host-0"):
        life.register(1, "again", "host-0", 1.5)
    life.register(1, "b", "host-1", 2.0)
    decision, out = life.node_lost(1, "exit 137", 3.0)
    # The removal left no node: the action taken is the job's stop, with the job's exit reason.
    assert decision.action is ActionKind.ABORT_JOB
    assert "relaunched 1 of 1 times (max_relaunches per 24h), no relaunches left" in decision.outcome
    assert life.node(1).state is NodeState.REMOVED
    assert life.job_state is JobState.FAILED
    assert life.exit_reason == decision.outcome
    assert life.exit_reason.endswith("no node is left: the job stops")
    assert any(isinstance(e, StopNode) and e.node_id == 1 for e in out.effects)


def test_the_one_host_of_a_single_host_backend_is_never_avoided() -> None:
    # The local backend runs every node on one host: a relaunch that avoided it could not be placed.
    cfg = LifecycleConfig(nodes=NodeRange(2, 2))
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0, single_host="vm")
    life.start(0.0)
    life.register(0, "a", "vm", 0.5)
    life.register(1, "b", "vm", 0.5)
    decision, out = life.report_failure(0, FailureKind.HARDWARE, "GPU fell off the bus", 1.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert not decision.avoid_host
    assert decision.outcome.endswith(
        "; but host 'vm' is not avoided: every node of this backend runs on it, so a replacement that avoided it "
        "could not be placed"
    )
    assert life.avoid_hosts == {}
    assert not any(e.kind == "host_avoided" for e in out.events)
    (launch,) = [e for e in out.effects if isinstance(e, LaunchNode)]
    assert launch.avoid_hosts == frozenset()
    replacement, _ = life.register(launch.node_id, "c", "vm", 2.0)  # on the same host
    assert replacement.rank == 0
    # A platform's disruption and a failed health check do not avoid it either; the check says so.
    life.node_disrupted(1, "NodeLost", "the host went away", 3.0, host="vm", avoid_host=True)
    out = life.mark_host_unhealthy("vm", "a failed health check")
    assert [(e.kind, e.data["host"]) for e in out.events] == [("host_not_avoided", "vm")]
    assert life.avoid_hosts == {}
    # Another host (an agent started by hand elsewhere) is still avoided.
    life.mark_host_unhealthy("elsewhere", "a failed health check")
    assert list(life.avoid_hosts) == ["elsewhere"]


def test_a_collective_failure_of_workers_whose_round_was_over_restarts_them_and_spends_no_budget() -> None:
    life = make(2)
    register_all(life)
    life.node_disrupted(1, "NodeLost", "the host went away", 1.0)
    cause = "round 1 dissolved: node '1' left"
    evidence = "RuntimeError: Connection closed by peer"
    decision, out = life.report_failure(
        0, FailureKind.UNKNOWN, evidence, 1.2, answered=True,
        classification=Classification(FailureKind.COMMUNICATION, "collective-failure"), left_behind=cause,
    )  # fmt: skip
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert decision.kind is FailureKind.COMMUNICATION
    assert cause in decision.outcome
    assert "counts against no budget" in decision.outcome
    assert [e.kind for e in out.events] == ["consequence_restart"]
    assert out.events[0].data["cause"] == cause
    assert (life.job_failures, life.node(0).process_restarts) == (0, 0)
    assert life.node(0).state is NodeState.RUNNING
    assert life.pending_work(0).actions == ()  # the answer carries the restart
    # Not answered (a report through a path that does not carry the decision): queued once.
    decision, _ = life.report_failure(0, FailureKind.HANG, "stuck in all_reduce", 1.3, left_behind=cause)
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert [a.kind for a in life.pending_work(0).actions] == [ActionKind.RESTART_PROCESSES]
    assert life.job_failures == 0


@pytest.mark.parametrize("kind", [FailureKind.USER_CODE, FailureKind.NATIVE_CRASH, FailureKind.HARDWARE])
def test_a_failure_of_another_kind_is_the_nodes_own_even_after_its_round_was_over(kind: FailureKind) -> None:
    life = make(2)
    register_all(life)
    life.node_disrupted(1, "NodeLost", "the host went away", 1.0)
    decision, out = life.report_failure(
        0, kind, "Traceback ...", 1.2, answered=True, left_behind="round 1 dissolved: node '1' left"
    )
    assert decision.kind is kind
    assert life.job_failures == 1
    assert "consequence_restart" not in [e.kind for e in out.events]


def test_no_consequence_restart_for_an_agent_that_exits_or_a_job_that_is_finishing() -> None:
    cause = "round 1 dissolved: node '2' left"
    life = make(3, min_nodes=1)
    register_all(life)
    decision, out = life.report_failure(0, FailureKind.COMMUNICATION, "node check failed", 1.0, agent_exits=True,
                                        left_behind=cause)  # fmt: skip
    assert "consequence_restart" not in [e.kind for e in out.events]
    assert life.job_failures == 1
    # Once a node succeeded the job is finishing: nothing restarts, whatever ended the round.
    life.report_success(1, 2.0)
    decision, out = life.report_failure(2, FailureKind.COMMUNICATION, "peer gone", 3.0, left_behind=cause)
    assert decision.action is ActionKind.REMOVE_NODE
    assert "consequence_restart" not in [e.kind for e in out.events]


def test_a_collective_failure_in_a_round_in_force_is_charged_at_once_when_told_not_to_wait_for_a_cause() -> None:
    life = make(2, peer_cause_wait_s=0.0)
    register_all(life)
    decision, _ = life.report_failure(0, FailureKind.COMMUNICATION, "NCCL timeout", 1.0, answered=True)
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert (life.job_failures, life.node(0).process_restarts) == (1, 1)


def test_insufficient_nodes_for_longer_than_the_window_stops_the_job() -> None:
    life = make(3, min_nodes=2, max_relaunches=0, insufficient_nodes_window_s=30.0)
    register_all(life)
    life.node_lost(0, "gone", 1.0)
    life.node_lost(1, "gone", 1.0)
    assert life.job_state is JobState.RUNNING  # one node left, below min 2: the window starts
    life.heartbeat(2, 20.0)
    life.tick(20.0)
    assert life.job_state is JobState.RUNNING
    life.heartbeat(2, 31.0)
    life.tick(31.0)
    assert life.job_state is JobState.FAILED
    assert "insufficient nodes: 1 running < min_nodes 2" in life.exit_reason
    assert life.node(2).state is NodeState.REMOVED


def test_user_code_error_stops_the_job_with_a_reason() -> None:
    life = make(2)
    register_all(life)
    decision, out = life.report_failure(1, FailureKind.USER_CODE, "ZeroDivisionError", 1.0)
    assert {e.node_id for e in out.effects if isinstance(e, StopNode)} == {0, 1}
    assert decision.action is ActionKind.ABORT_JOB
    assert life.job_state is JobState.FAILED
    assert life.exit_reason == "user_code on node 1 (rank 1): the job stops"
    assert life.node(1).state is NodeState.FAILED
    assert life.node(0).state is NodeState.REMOVED
    with pytest.raises(JobFinishedError):
        life.report_failure(0, FailureKind.HOST_OOM, "x", 2.0)
    actions, _ = life.heartbeat(0, 2.0)
    assert actions[0].kind is ActionKind.REMOVE_NODE


def test_too_many_failures_stops_the_job() -> None:
    life = make(1, max_job_failures=2, max_process_restarts=10)
    register_all(life)
    life.report_failure(0, FailureKind.HOST_OOM, "1", 1.0)
    life.report_failure(0, FailureKind.HOST_OOM, "2", 1.0)
    assert life.job_state is JobState.RUNNING
    decision, _ = life.report_failure(0, FailureKind.HOST_OOM, "3", 1.0)
    assert decision.action is ActionKind.ABORT_JOB
    assert life.exit_reason == (
        "node 0 (rank 0) failed (host_oom): 3 failures in 24h, more than max_job_failures 2: the job stops"
    )


def test_the_failure_that_exceeds_the_job_budget_is_named_by_what_its_evidence_shows() -> None:
    life = make(1, max_job_failures=1, max_process_restarts=10)
    register_all(life)
    life.report_failure(0, FailureKind.UNKNOWN, "exit 1", 1.0)
    shown = Classification(FailureKind.DEVICE_OOM, "CUDA out of memory")
    decision, out = life.report_failure(0, FailureKind.UNKNOWN, "CUDA out of memory", 2.0, classification=shown)
    assert decision.action is ActionKind.ABORT_JOB
    assert decision.kind is FailureKind.DEVICE_OOM
    assert life.exit_reason is not None
    assert "failed (device_oom): 2 failures" in life.exit_reason
    failure = next(e for e in out.events if e.kind == "failure")
    assert failure.data["kind"] == "device_oom"
    assert failure.data["reported_kind"] == "unknown"


def test_succeeded_job_is_not_relaunched() -> None:
    life = make(2)
    register_all(life)
    life.report_success(0, 1.0)
    with pytest.raises(IllegalTransitionError, match="terminal"):
        life.report_success(0, 1.5)
    with pytest.raises(NodeStateError):
        life.node_lost(0, "late", 1.5)
    decision, out = life.node_lost(1, "exit 1", 2.0)
    assert decision.action is ActionKind.REMOVE_NODE
    assert "already succeeded" in decision.outcome
    assert not any(isinstance(e, LaunchNode) for e in out.effects)
    assert life.job_state is JobState.SUCCEEDED


def test_all_nodes_succeeding_ends_the_job_succeeded() -> None:
    life = make(2)
    register_all(life)
    life.report_success(0, 1.0)
    assert life.job_state is JobState.RUNNING
    life.report_success(1, 2.0)
    assert life.job_state is JobState.SUCCEEDED
    assert life.exit_reason == "all nodes finished; 2 succeeded"


def test_a_node_that_never_joined_is_let_go_when_the_job_finishes() -> None:
    # Node 1 never started (an unschedulable pod that a finished node's room would place at last): once node 0
    # succeeded it has no training to join, so it is stopped and the job ends instead of waiting for it.
    life = make(2, min_nodes=1)
    life.register(0, "agent-0", "host-0", 0.0)
    life.node_started(1, 0.5)
    out = life.report_success(0, 1.0)
    assert life.node(1).state is NodeState.REMOVED
    assert "never joined its training" in life.node(1).history[-1].reason
    assert any(isinstance(e, StopNode) and e.node_id == 1 for e in out.effects)
    assert life.job_state is JobState.SUCCEEDED
    assert life.exit_reason == "all nodes finished; 1 succeeded"


def test_a_running_node_keeps_training_while_another_finishes() -> None:
    life = make(2)
    register_all(life)
    life.report_success(0, 1.0)
    assert life.node(1).state is NodeState.RUNNING
    assert life.job_state is JobState.RUNNING


def test_start_timeout_relaunches_a_node_that_never_registers() -> None:
    life = make(1, node_start_timeout_s=60.0, insufficient_nodes_window_s=1000.0)
    assert life.tick(59.0).effects == ()
    out = life.tick(61.0)
    assert any(isinstance(e, LaunchNode) and e.rank == 0 for e in out.effects)
    assert life.node(0).state is NodeState.RELAUNCHING
    assert "preemption: not registered" in life.node(0).last_failure


def test_heartbeat_before_register_is_refused_without_change() -> None:
    life = make(1)
    before = life.snapshot()
    with pytest.raises(NodeStateError, match="register before heartbeating"):
        life.heartbeat(0, 1.0)
    assert life.snapshot() == before


def test_stop_removes_live_nodes_and_is_idempotent() -> None:
    life = make(2)
    register_all(life)
    out = life.stop("operator asked", 5.0)
    assert {e.node_id for e in out.effects if isinstance(e, StopNode)} == {0, 1}
    assert life.job_state is JobState.STOPPED
    assert life.exit_reason == "operator asked"
    assert life.stop("again", 6.0) == type(out)()
    with pytest.raises(JobFinishedError):
        life.register(None, "x", "y", 7.0)


def test_snapshot_restore_keeps_nodes_and_ranks_and_restarts_timeouts() -> None:
    life = make(2, min_nodes=1, heartbeat_timeout_s=10.0)
    register_all(life)
    life.tick(11.0)  # both time out and are relaunched
    snap = life.snapshot()
    restored = JobLifecycle(life.config, DefaultFailurePolicy(), 1000.0, snapshot=snap)
    assert {k: attrs.evolve(v, last_heartbeat=0, state_since=0) for k, v in restored.nodes().items()} == {
        k: attrs.evolve(v, last_heartbeat=0, state_since=0) for k, v in life.nodes().items()
    }
    assert {r: n.node_id for r, n in restored.current_nodes().items()} == {0: 2, 1: 3}
    assert restored.tick(1005.0).effects == ()  # fresh timeouts from the restore
    assert restored.start(1005.0).effects == ()
    for node in life.nodes().values():
        assert node_from_dict(node_to_dict(node)) == node


def test_config_validation_names_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="min_nodes \\(3\\) must not exceed max_nodes \\(2\\)"):
        NodeRange(3, 2)
    with pytest.raises(ConfigError, match="heartbeat_timeout_s must be positive, got -1"):
        LifecycleConfig(heartbeat_timeout_s=-1)
    with pytest.raises(ConfigError, match="'2:x'"):
        parse_node_range("2:x")
    assert parse_node_range("2:4", node_unit=2) == NodeRange(2, 4, 2)
    assert parse_node_range("3") == NodeRange(3, 3)


TRACEBACK_EVIDENCE = (
    "local rank 0 exited with exit code 1 after 0 restart(s)\n"
    "Traceback (most recent call last):\n"
    '  File "/job/train.py", line 3, in <module>\n'
    "    step()\n"
    '  File "/job/train.py", line 2, in step\n'
    "    raise ValueError('bad batch')\n"
    "ValueError: bad batch\n"
)


def test_a_failure_is_logged_in_one_line_and_its_whole_evidence_kept_in_the_event_and_the_node() -> None:
    # The worker prints its traceback once; the master's messages (logged, and passed on as the
    # rendezvous reason) name it in one line, while the failure event keeps all of it.
    life = make(1)
    register_all(life)
    _, out = life.report_failure(0, FailureKind.USER_CODE, TRACEBACK_EVIDENCE, 1.0)
    assert out.events
    for event in out.events:
        assert "\n" not in event.message, event.message
    failure = next(e for e in out.events if e.kind == "failure")
    assert failure.message.endswith(
        f"failed: {FailureKind.USER_CODE.value}: local rank 0 exited with exit code 1 after 0 restart(s): "
        "ValueError: bad batch (+5 more lines)"
    )
    assert failure.data["evidence"] == TRACEBACK_EVIDENCE
    assert life.node(0).last_failure == f"{FailureKind.USER_CODE.value}: {TRACEBACK_EVIDENCE}"


def test_failures_older_than_the_budget_window_no_longer_count_against_the_job() -> None:
    life = make(1, max_job_failures=2, max_process_restarts=100, budget_window_s=100.0)
    register_all(life)
    for t in (1.0, 2.0, 150.0, 160.0):  # never more than two within 100 s
        decision, _ = life.report_failure(0, FailureKind.HOST_OOM, str(t), t)
        assert decision.action is ActionKind.RESTART_PROCESSES
    assert life.job_failures == 4
    decision, _ = life.report_failure(0, FailureKind.HOST_OOM, "5", 170.0)
    assert decision.action is ActionKind.ABORT_JOB
    assert life.exit_reason == (
        "node 0 (rank 0) failed (host_oom): 3 failures in 100s, more than max_job_failures 2: the job stops"
    )


def test_a_ranks_relaunches_refill_once_the_window_passed() -> None:
    life = make(1, max_relaunches=1, budget_window_s=100.0)
    register_all(life)
    decision, _ = life.report_failure(0, FailureKind.HARDWARE, "Xid 79", 1.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    life.register(1, "b", "host-1", 2.0)
    assert life.node(1).relaunched_at == (1.0,)
    decision, _ = life.report_failure(1, FailureKind.HARDWARE, "Xid 79", 200.0)
    assert decision.action is ActionKind.RELAUNCH_NODE  # the first relaunch left the window
    life.register(2, "c", "host-2", 201.0)
    assert life.node(2).relaunched_at == (200.0,)  # only the newest max_relaunches are kept
    decision, _ = life.report_failure(2, FailureKind.HARDWARE, "Xid 79", 210.0)
    assert decision.action is ActionKind.ABORT_JOB
    assert "relaunched 1 of 1 times (max_relaunches per 100s), no relaunches left" in decision.outcome


def test_a_disruption_is_not_charged_to_the_ranks_relaunches() -> None:
    life = make(1, max_relaunches=1)
    register_all(life)
    life.node_disrupted(0, "preempted", "preempted by a higher-priority pod", 1.0)
    assert life.node(1).relaunched_at == ()
    assert life.node(1).disruptions == 1


def test_the_budget_windows_survive_a_master_restart_on_wall_time() -> None:
    # The first master's monotonic clock started at wall 1000; the next one's at wall 1050: the
    # journaled times are wall seconds, so a failure keeps counting exactly a window of wall time.
    from dlrover.master.journal import _snapshot, job_fields

    cfg = LifecycleConfig(nodes=NodeRange(1, 1), max_job_failures=1, max_process_restarts=100, budget_window_s=100.0)
    first = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0, wall_offset=1000.0)
    first.start(0.0)
    first.register(0, "a", "host-0", 0.0)
    first.report_failure(0, FailureKind.HOST_OOM, "1", 10.0)  # wall 1010
    snap = first.snapshot()
    restored_snap = _snapshot(job_fields(snap), [node_from_dict(node_to_dict(n)) for n in snap.nodes])
    assert restored_snap is not None
    assert restored_snap.job_failure_times == (1010.0,)

    def restored() -> JobLifecycle:
        assert restored_snap is not None
        life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0, restored_snap, wall_offset=1050.0)
        life.heartbeat(0, 0.0)
        return life

    decision, _ = restored().report_failure(0, FailureKind.HOST_OOM, "2", 55.0)  # wall 1105: 1010 counts
    assert decision.action is ActionKind.ABORT_JOB
    decision, _ = restored().report_failure(0, FailureKind.HOST_OOM, "2", 65.0)  # wall 1115: it expired
    assert decision.action is ActionKind.RESTART_PROCESSES


def test_records_journaled_before_failures_kept_their_times_count_for_ever() -> None:
    from dlrover.master.journal import _snapshot, job_fields

    cfg = LifecycleConfig(nodes=NodeRange(1, 1), max_job_failures=2, max_process_restarts=100, budget_window_s=100.0)
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    life.register(0, "a", "host-0", 0.0)
    snap = life.snapshot()
    job = job_fields(snap)
    job["job_failures"] = 2
    del job["job_failure_times"]
    older_node = node_to_dict(attrs.evolve(snap.nodes[0], relaunch_count=3, disruptions=1))
    del older_node["relaunched_at"]
    node = node_from_dict(older_node)
    assert node.relaunched_at == (None, None)  # three incarnations before, one of them a disruption
    restored_snap = _snapshot(job, [node])
    assert restored_snap is not None
    assert restored_snap.job_failure_times is None
    restored = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0, restored_snap)
    restored.heartbeat(0, 0.0)
    decision, _ = restored.report_failure(0, FailureKind.HOST_OOM, "3", 10_000.0)
    assert decision.action is ActionKind.ABORT_JOB  # the two older failures still count
    with pytest.raises(ConfigError, match="a budget window must be None"):
        LifecycleConfig(budget_window_s=0.0)


def test_a_rank_given_up_by_a_shrink_keeps_its_charged_relaunches_when_the_job_grows_again() -> None:
    life = make(2, min_nodes=1, max_relaunches=1)
    register_all(life)
    decision, _ = life.report_failure(1, FailureKind.HARDWARE, "Xid 79", 1.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    life.register(2, "b", "host-2", 2.0)
    life.resize(ResizeRequest(1, "shrink"), 3.0)
    life.resize(ResizeRequest(2, "grow"), 4.0)
    regrown = life.current_nodes()[1]
    assert regrown.relaunched_at == (1.0,)
    life.register(regrown.node_id, "c", "host-3", 5.0)
    decision, _ = life.node_lost(regrown.node_id, "gone", 6.0)
    # A resize gives no relaunch back: the rank's one relaunch of the day is spent.
    assert decision.action is ActionKind.REMOVE_NODE
    assert "relaunched 1 of 1 times (max_relaunches per 24h), no relaunches left" in decision.outcome
