"""A collective error or hang reported with no cause known restarts at once and waits for one before
it is charged (`LifecycleConfig.peer_cause_wait_s`)."""

from __future__ import annotations

import pytest

from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.lifecycle import JobLifecycle
from dlrover.master.policy import Classification, DefaultFailurePolicy, Failure
from dlrover.master.records import node_from_dict, node_to_dict
from dlrover.master.states import JobState, NodeState

WAIT = 40.0  # the default: the 30 s heartbeat timeout and 10 s


def make(nodes: int = 3, **kw: object) -> JobLifecycle:
    cfg = LifecycleConfig(nodes=NodeRange(nodes, nodes), **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    for node_id in sorted(life.nodes()):
        life.register(node_id, f"agent-{node_id}", f"host-{node_id}", 0.0)
    return life


def beat(life: JobLifecycle, now: float, *nodes: int) -> None:
    for node_id in nodes:
        life.heartbeat(node_id, now)


def kinds(out_events: object) -> list[str]:
    return [e.kind for e in out_events]  # type: ignore[attr-defined]


def test_the_default_wait_outlasts_the_heartbeat_timeout() -> None:
    assert LifecycleConfig().peer_cause_wait == WAIT
    assert LifecycleConfig(heartbeat_timeout_s=5.0).peer_cause_wait == 15.0
    assert LifecycleConfig(peer_cause_wait_s=0.0).peer_cause_wait == 0.0
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="peer_cause_wait_s"):
            LifecycleConfig(peer_cause_wait_s=bad)


def test_a_collective_error_with_no_cause_restarts_at_once_and_is_charged_when_none_comes() -> None:
    life = make()
    decision, out = life.report_failure(0, FailureKind.COMMUNICATION, "NCCL watchdog timeout", 1.0)
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert "no cause is known yet" in decision.outcome
    assert f"charged in {WAIT:g}s" in decision.outcome
    assert kinds(out.events) == ["failure", "process_restart"]
    assert out.events[0].data["charge"] == "awaiting_cause"
    assert [a.kind for a in life.pending_actions(0)] == [ActionKind.RESTART_PROCESSES]  # not answered: queued
    assert (life.job_failures, life.node(0).process_restarts) == (0, 0)
    life.heartbeat(0, 2.0)  # the restart is delivered
    beat(life, 1.0 + WAIT - 1.0, 0, 1, 2)
    assert kinds(life.tick(1.0 + WAIT - 1.0).events) == []
    beat(life, 1.0 + WAIT, 0, 1, 2)
    out = life.tick(1.0 + WAIT)
    assert kinds(out.events) == ["failure_charged"]
    assert (life.job_failures, life.node(0).process_restarts) == (1, 1)
    assert life.node(0).awaiting_cause is None
    assert life.pending_actions(0) == ()  # counted, not restarted a second time
    assert 0 in out.changed_nodes
    assert out.job_changed


def test_a_peer_lost_at_its_heartbeat_timeout_explains_the_collective_errors_it_caused() -> None:
    life = make()
    # Node 2 is killed outright (agent and workers): 0 and 1 see their collectives break at once.
    for node_id in (0, 1):
        decision, _ = life.report_failure(node_id, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0)
        assert decision.action is ActionKind.RESTART_PROCESSES
    beat(life, 31.0, 0, 1)
    out = life.tick(31.0)  # node 2 silent past the 30 s timeout: lost, relaunched
    excused = [e for e in out.events if e.kind == "failure_excused"]
    assert [e.node_id for e in excused] == [0, 1]
    assert all(e.data["cause_node"] == 2 for e in excused)
    assert "counts against no budget" in excused[0].message
    assert life.job_failures == 1  # node 2's loss alone
    assert [life.node(n).process_restarts for n in (0, 1)] == [0, 0]
    beat(life, 100.0, 0, 1)
    assert "failure_charged" not in kinds(life.tick(100.0).events)


def test_a_peers_crash_reported_after_the_collective_error_explains_it() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection closed by peer", 1.0)
    life.report_failure(1, FailureKind.NATIVE_CRASH, "Segmentation fault", 1.5)
    assert life.node(0).awaiting_cause is None
    assert life.job_failures == 1


def test_a_peer_the_platform_took_away_explains_the_collective_errors_it_caused() -> None:
    life = make()
    life.report_failure(0, FailureKind.HANG, "no step for 300 s", 1.0)
    out = life.node_disrupted(2, "Preempted", "spot instance reclaimed", 2.0)
    assert [e.node_id for e in out.events if e.kind == "failure_excused"] == [0]
    assert life.job_failures == 0


def test_collective_errors_do_not_explain_each_other() -> None:
    # Either may be the cause (its own bad link): both wait, nothing explains them, both are charged.
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0)
    life.report_failure(1, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0)
    beat(life, 1.0 + WAIT, 0, 1, 2)
    out = life.tick(1.0 + WAIT)
    assert [e.node_id for e in out.events if e.kind == "failure_charged"] == [0, 1]
    assert life.job_failures == 2


def test_a_second_failure_while_the_first_waits_charges_both() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0, answered=True)
    decision, out = life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 5.0, answered=True)
    assert "no cause is known yet" not in decision.outcome
    assert kinds(out.events)[:2] == ["failure_charged", "failure"]
    assert (life.job_failures, life.node(0).process_restarts) == (2, 2)
    assert life.node(0).awaiting_cause is None


def test_the_late_charge_carries_out_what_the_policy_decides_when_the_budget_is_spent() -> None:
    life = make(max_process_restarts=0)
    life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0, answered=True)
    beat(life, 1.0 + WAIT, 0, 1, 2)
    out = life.tick(1.0 + WAIT)
    charged = next(e for e in out.events if e.kind == "failure_charged")
    assert charged.data["action"] == ActionKind.RELAUNCH_NODE.value
    assert life.node(0).state is NodeState.RELAUNCHING
    assert life.job_state is JobState.RUNNING


def test_alone_or_not_told_to_wait_a_collective_error_is_charged_at_once() -> None:
    alone = make(1)
    alone.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0)
    assert alone.job_failures == 1
    eager = make(peer_cause_wait_s=0.0)
    eager.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0)
    assert eager.job_failures == 1


def test_a_node_that_ends_while_its_charge_waits_is_charged_nothing() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0)
    life.report_success(0, 2.0)
    out = life.tick(3.0)
    assert [e.kind for e in out.events if e.node_id == 0] == ["failure_excused"]
    assert life.node(0).awaiting_cause is None
    assert life.job_failures == 0


def test_the_classification_decides_the_wait_and_the_late_charge() -> None:
    life = make()
    shown = Classification(FailureKind.COMMUNICATION, "gloo pair closed")
    life.report_failure(0, FailureKind.UNKNOWN, "exit 1", 1.0, classification=shown)
    awaited = life.node(0).awaiting_cause
    assert awaited is not None
    assert (awaited.kind, awaited.decided, awaited.reason) == (
        FailureKind.UNKNOWN,
        FailureKind.COMMUNICATION,
        shown.reason,
    )
    decided: list[Classification | None] = []
    policy = life._policy
    original = policy.decide

    def recording(failure: Failure) -> Decision:
        decided.append(failure.classification)
        return original(failure)

    policy.decide = recording  # type: ignore[method-assign]
    beat(life, 1.0 + WAIT, 0, 1, 2)
    charged = next(e for e in life.tick(1.0 + WAIT).events if e.kind == "failure_charged")
    assert charged.data["reported_kind"] == "unknown"
    assert decided == [shown]  # the policy decides the late charge on the evidence as it was read


def test_an_awaited_charge_is_journaled_and_a_resumed_master_waits_afresh() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0, exit_code=6)
    node = life.node(0)
    assert node_from_dict(node_to_dict(node)) == node
    resumed = JobLifecycle(life.config, DefaultFailurePolicy(), 500.0, snapshot=life.snapshot())
    awaited = resumed.node(0).awaiting_cause
    assert awaited is not None
    assert awaited.since == 500.0
    assert awaited.exit_code == 6
    beat(resumed, 500.0 + WAIT - 1.0, 0, 1, 2)
    assert resumed.tick(500.0 + WAIT - 1.0).events == ()
    beat(resumed, 500.0 + WAIT, 0, 1, 2)
    assert [e.kind for e in resumed.tick(500.0 + WAIT).events] == ["failure_charged"]


def test_a_rollback_restores_the_awaited_charge() -> None:
    life = make()
    point = life.savepoint()
    life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0)
    life.rollback(point)
    assert life.node(0).awaiting_cause is None


def test_a_node_whose_collective_error_waited_in_vain_is_charged_at_once_for_a_while() -> None:
    # A broken link of its own fails every restart again: whatever the spacing of its reports, it meets
    # its budgets on the same failure.
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0, answered=True)
    charged_at = 1.0 + WAIT
    beat(life, charged_at, 0, 1, 2)
    life.tick(charged_at)
    assert life.job_failures == 1
    decision, _ = life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", charged_at + 5.0, answered=True)
    assert "no cause is known yet" not in decision.outcome
    assert life.job_failures == 2
    # Three waits later it is given the benefit of the doubt again.
    later = charged_at + 3 * WAIT
    beat(life, later, 0, 1, 2)
    decision, _ = life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", later, answered=True)
    assert "no cause is known yet" in decision.outcome
