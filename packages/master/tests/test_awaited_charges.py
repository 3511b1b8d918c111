"""A collective error or hang reported with no cause known restarts at once and waits for one before
it is charged (`LifecycleConfig.peer_cause_wait_s`)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.lifecycle import JobLifecycle
from dlrover.master.policy import Classification, DefaultFailurePolicy, Failure
from dlrover.master.records import Outcome, node_from_dict, node_to_dict
from dlrover.master.states import JobState, NodeState

WAIT = 40.0  # the default: the 30 s heartbeat timeout and 10 s


def make(nodes: int = 3, policy: DefaultFailurePolicy | None = None, **kw: object) -> JobLifecycle:
    cfg = LifecycleConfig(nodes=NodeRange(nodes, nodes), **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, policy or DefaultFailurePolicy(), 0.0)
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


def test_a_second_collective_error_while_the_first_waits_charges_both() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0, answered=True)
    decision, out = life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 5.0, answered=True)
    assert "no cause is known yet" not in decision.outcome
    assert kinds(out.events)[:2] == ["failure_charged", "failure"]
    assert out.events[0].data["action"] == "restart_processes"  # counted: the restart was made
    assert (life.job_failures, life.node(0).process_restarts) == (2, 2)
    assert life.node(0).awaiting_cause is None
    # With one restart left for the two, the second is decided on what is left: a relaunch.
    tight = make(max_process_restarts=1)
    tight.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0, answered=True)
    decision, _ = tight.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 5.0, answered=True)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert tight.job_failures == 2


def test_when_charging_the_first_of_two_ends_the_node_the_second_is_the_same_trouble() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0, answered=True)
    life._config = attrs.evolve(life.config, max_process_restarts=0)  # the budgets changed meanwhile
    decision, out = life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 5.0, answered=True)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert kinds(out.events)[0] == "failure_charged"
    assert "failure" not in kinds(out.events)
    assert life.job_failures == 1
    assert life.node(0).state is NodeState.RELAUNCHING


def test_a_journal_with_a_wait_left_on_a_node_that_left_resumes_without_it() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0)
    snap = life.snapshot()
    left = [attrs.evolve(n, state=NodeState.REMOVED) if n.node_id == 0 else n for n in snap.nodes]
    resumed = JobLifecycle(life.config, DefaultFailurePolicy(), 5.0, snapshot=attrs.evolve(snap, nodes=tuple(left)))
    assert resumed.node(0).awaiting_cause is None
    beat(resumed, 5.0 + WAIT, 1, 2)
    resumed.tick(5.0 + WAIT)
    assert resumed.job_failures == 0


def test_a_node_with_no_restart_left_is_decided_now() -> None:
    # Restarted to wait for a cause that never came, it would break its peers' round a second time.
    life = make(max_process_restarts=0)
    decision, out = life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0, answered=True)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert "failure_charged" not in kinds(out.events)
    assert life.job_failures == 1
    assert life.node(0).state is NodeState.RELAUNCHING


class RelaunchesCollectiveErrors(DefaultFailurePolicy):
    """A policy of its own that relaunches a node on a collective error, restarts left or not."""

    def decide(self, failure: Failure) -> Decision:
        return Decision(ActionKind.RELAUNCH_NODE, failure.kind, str(failure.node.node_id), "relaunch it")


def test_the_late_charge_carries_out_what_the_policy_decides_then() -> None:
    life = make(policy=RelaunchesCollectiveErrors())
    life.report_failure(0, FailureKind.COMMUNICATION, "NCCL error", 1.0, answered=True)
    assert life.node(0).awaiting_cause is not None
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
    out = life.report_success(0, 2.0)
    assert [e.kind for e in out.events if e.node_id == 0][:2] == ["failure_excused", "node_state"]
    assert life.node(0).awaiting_cause is None
    beat(life, 1.0 + WAIT, 1, 2)
    assert "failure_charged" not in kinds(life.tick(1.0 + WAIT).events)
    assert life.job_failures == 0


def test_a_peer_that_succeeds_explains_a_collective_error_at_the_end() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection closed by peer", 1.0)
    out = life.report_success(1, 1.5)
    assert [e.node_id for e in out.events if e.kind == "failure_excused"] == [0]
    assert life.job_failures == 0


def test_the_nodes_own_crash_or_loss_explains_its_waiting_collective_error_and_is_decided_once() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0)
    life.report_failure(1, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0)
    decision, out = life.report_failure(0, FailureKind.HARDWARE, "Xid 79: GPU has fallen off the bus", 2.0)
    assert kinds(out.events)[:2] == ["failure_excused", "failure"]
    assert decision.kind is FailureKind.HARDWARE
    assert decision.avoid_host
    assert "host-0" in life.avoid_hosts
    assert life.job_failures == 1  # the hardware fault alone; node 1's error was its consequence
    assert life.node(1).awaiting_cause is None
    lost = make()
    lost.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0)
    beat(lost, 31.0, 1, 2)
    lost.tick(31.0)  # node 0 itself went silent
    assert lost.job_failures == 1
    assert lost.node(0).state is NodeState.RELAUNCHING


def test_a_node_a_failed_network_check_lets_go_explains_its_peers_collective_errors() -> None:
    life = make()
    life.report_failure(0, FailureKind.COMMUNICATION, "Connection reset by peer", 1.0)
    _, out = life.report_failure(1, FailureKind.COMMUNICATION, "network check failed", 2.0, agent_exits=True)
    assert [e.node_id for e in out.events if e.kind == "failure_excused"] == [0]


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


class AwaitedChargeMachine(RuleBasedStateMachine):
    """Collective errors, crashes, losses, disruptions, network-check exits and successes of three nodes
    in any order and at any spacing, with budgets tight enough to relaunch, remove and stop, and a master
    that resumes from its snapshot: every failure is charged once or excused once, only running nodes
    wait, no wait outlives its time, and a node's own failure leaves no other node waiting."""

    @initialize(restarts=st.integers(0, 3), job_failures=st.integers(2, 12))
    def setup(self, restarts: int, job_failures: int) -> None:
        cfg = LifecycleConfig(
            nodes=NodeRange(1, 3),
            max_process_restarts=restarts,
            max_relaunches=2,
            max_job_failures=job_failures,
            insufficient_nodes_window_s=1e9,
        )
        self.life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0)
        self.now = 0.0
        self.charges = 0  # `failure` events charged when made, and `failure_charged` events
        self.awaited = 0  # `failure` events that wait for a cause
        self.resolved = 0  # `failure_excused` and `failure_charged` events
        self.record(self.life.start(0.0))
        self.register()

    def record(self, out: Outcome) -> None:
        for ev in out.events:
            if ev.kind == "failure":
                if ev.data.get("charge") == "awaiting_cause":
                    self.awaited += 1
                else:
                    self.charges += 1
            elif ev.kind == "failure_charged":
                self.charges += 1
                self.resolved += 1
            elif ev.kind == "failure_excused":
                self.resolved += 1

    def running(self) -> list[int]:
        return sorted(n.node_id for n in self.life.current_nodes().values() if n.state is NodeState.RUNNING)

    def pick(self, index: int) -> int | None:
        running = self.running()
        return running[index % len(running)] if running else None

    def others_wait(self, node_id: int) -> bool:
        return any(n.awaiting_cause is not None for n in self.life.nodes().values() if n.node_id != node_id)

    @precondition(lambda self: hasattr(self, "life") and not self.life.job_state.finished)
    @rule()
    def register(self) -> None:
        for node in list(self.life.current_nodes().values()):
            if node.state in (NodeState.PENDING, NodeState.STARTING):
                _, out = self.life.register(node.node_id, f"agent-{node.node_id}", f"host-{node.node_id}", self.now)
                self.record(out)

    @precondition(lambda self: hasattr(self, "life") and not self.life.job_state.finished)
    @rule(index=st.integers(0, 2), kind=st.sampled_from([FailureKind.COMMUNICATION, FailureKind.HANG]))
    def collective_error(self, index: int, kind: FailureKind) -> None:
        node = self.pick(index)
        if node is not None:
            self.record(self.life.report_failure(node, kind, "Connection reset by peer", self.now)[1])

    @precondition(lambda self: hasattr(self, "life") and not self.life.job_state.finished)
    @rule(index=st.integers(0, 2), how=st.sampled_from(["crash", "check", "disrupt", "succeed"]))
    def own_end(self, index: int, how: str) -> None:
        node = self.pick(index)
        if node is None:
            return
        if how == "crash":
            out = self.life.report_failure(node, FailureKind.NATIVE_CRASH, "SIGSEGV", self.now)[1]
        elif how == "check":
            out = self.life.report_failure(node, FailureKind.COMMUNICATION, "probe failed", self.now, agent_exits=True)[
                1
            ]
        elif how == "disrupt":
            out = self.life.node_disrupted(node, "Preempted", "spot reclaimed", self.now)
        else:
            out = self.life.report_success(node, self.now)
        self.record(out)
        if not self.life.job_state.finished:
            assert not self.others_wait(node), "a node's own end explains its peers' collective errors"

    @precondition(lambda self: hasattr(self, "life") and not self.life.job_state.finished)
    @rule(seconds=st.sampled_from([1.0, 15.0, 35.0]), silent=st.integers(-1, 2))
    def advance(self, seconds: float, silent: int) -> None:
        self.now += seconds
        quiet = self.pick(silent) if silent >= 0 else None
        for node in self.running():
            if node != quiet:
                self.record(self.life.heartbeat(node, self.now)[1])
        self.record(self.life.tick(self.now))
        for record in self.life.nodes().values():
            awaited = record.awaiting_cause
            assert awaited is None or self.now - awaited.since < self.life.config.peer_cause_wait, record

    @precondition(lambda self: hasattr(self, "life"))
    @rule()
    def resume(self) -> None:
        """A new master process takes over from the journal (the snapshot): every wait starts afresh."""
        before = {n.node_id: n.awaiting_cause is not None for n in self.life.nodes().values()}
        self.life = JobLifecycle(self.life.config, DefaultFailurePolicy(), self.now, snapshot=self.life.snapshot())
        assert {n.node_id: n.awaiting_cause is not None for n in self.life.nodes().values()} == before

    @precondition(lambda self: hasattr(self, "life"))
    @invariant()
    def every_failure_is_charged_or_excused_once(self) -> None:
        waiting = [n for n in self.life.nodes().values() if n.awaiting_cause is not None]
        assert self.awaited == self.resolved + len(waiting)
        assert self.life.job_failures == self.charges
        assert all(n.state is NodeState.RUNNING for n in waiting), waiting


TestAwaitedChargeMachine = AwaitedChargeMachine.TestCase
TestAwaitedChargeMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
