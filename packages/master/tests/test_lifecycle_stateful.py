"""Hypothesis state machine for the node lifecycle, checked against a trivially correct model.

The model predicts, for every failure, what the default policy plus the budgets must do; the
invariants check the issue's laws: no illegal transition, every failure ends in a relaunch, a
removal or a job stop with a reason, budgets never exceeded, logical ranks stable across
replacement.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.diagnosis import LOST_NODE_KIND, PEER_CONSEQUENCE_KINDS, ActionKind, FailureKind
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.lifecycle import JobLifecycle, LifecycleError
from dlrover.master.policy import DefaultFailurePolicy
from dlrover.master.records import LifecycleSnapshot, NodeRecord
from dlrover.master.states import ALIVE_STATES, TRANSITIONS, IllegalTransitionError, JobState, NodeState

MAX_NODES = 3
MIN_NODES = 2
MAX_RESTARTS = 2
MAX_RELAUNCHES = 2
MAX_FAILURES = 8
TIMEOUT = 15.0
START_TIMEOUT = 20.0
WINDOW = 30.0
BUDGET_WINDOW = 40.0  # failures older than this no longer count against the budgets
# Kinds the default policy relaunches for (dlrover.diagnosis.kind_decided_alone); failures the
# master observed itself are relaunched whatever their kind.
NODE_LEVEL = {FailureKind.HARDWARE, FailureKind.PREEMPTION}


def _timeless(snap: LifecycleSnapshot) -> LifecycleSnapshot:
    return attrs.evolve(snap, nodes=tuple(attrs.evolve(n, last_heartbeat=0.0, state_since=0.0) for n in snap.nodes))


class LifecycleMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.now = 0.0
        cfg = LifecycleConfig(
            nodes=NodeRange(MIN_NODES, MAX_NODES),
            heartbeat_timeout_s=TIMEOUT,
            node_start_timeout_s=START_TIMEOUT,
            max_process_restarts=MAX_RESTARTS,
            max_relaunches=MAX_RELAUNCHES,
            max_job_failures=MAX_FAILURES,
            budget_window_s=BUDGET_WINDOW,
            insufficient_nodes_window_s=WINDOW,
            # This model charges every failure when it is reported; waiting for a peer's failure to
            # explain a collective error has its own machine (test_awaited_charges.py).
            peer_cause_wait_s=0.0,
        )
        self.life = JobLifecycle(cfg, DefaultFailurePolicy(), self.now)
        self.life.start(self.now)
        # The model: failures, restarts per node, relaunches per rank, whether anything succeeded.
        self.failures: list[float] = []  # when each failure came
        self.restarts: dict[int, int] = {}
        self.relaunches: dict[int, list[float]] = {rank: [] for rank in range(MAX_NODES)}  # charged, when
        self.disruption_relaunches = dict.fromkeys(range(MAX_NODES), 0)  # relaunches charged to no budget
        self.succeeded = False
        self.created = MAX_NODES
        self.low_since: float | None = None  # since when fewer than MIN_NODES run (model of the window rule)

    def _current(self, rank: int) -> int:
        return self.life.current_nodes()[rank].node_id

    def _expected(self, node: NodeRecord, kind: FailureKind, *, observed: bool = False) -> ActionKind:
        self.failures.append(self.now)
        if self._within(self.failures) > MAX_FAILURES or kind is FailureKind.USER_CODE:
            return ActionKind.ABORT_JOB
        if self.succeeded:
            return ActionKind.REMOVE_NODE
        restartable = not observed and kind not in NODE_LEVEL and node.state is NodeState.RUNNING
        if restartable and self.restarts.get(node.node_id, 0) < MAX_RESTARTS:
            return ActionKind.RESTART_PROCESSES
        if self._within(self.relaunches[node.rank]) < MAX_RELAUNCHES:
            return ActionKind.RELAUNCH_NODE
        return ActionKind.REMOVE_NODE

    def _within(self, times: list[float]) -> int:
        """How many of `times` count against a budget now."""
        return sum(1 for t in times if t > self.now - BUDGET_WINDOW)

    def _account(self, node_id: int, action: ActionKind) -> None:
        rank = self.life.node(node_id).rank
        if action is ActionKind.RESTART_PROCESSES:
            self.restarts[node_id] = self.restarts.get(node_id, 0) + 1
        elif action is ActionKind.RELAUNCH_NODE:
            self.relaunches[rank].append(self.now)
            self.created += 1

    @rule(rank=st.integers(0, MAX_NODES - 1), started=st.booleans())
    def register(self, rank: int, started: bool) -> None:
        node_id = self._current(rank)
        node = self.life.node(node_id)
        if self.life.job_state.finished or node.state is not NodeState.PENDING:
            return
        if started:
            self.life.node_started(node_id, self.now)
        digest = f"{node_id}"
        registered, _ = self.life.register(node_id, f"a{rank}", f"h{node_id}", self.now, registration_digest=digest)
        assert registered.state is NodeState.RUNNING
        assert registered.rank == rank

    @rule(rank=st.integers(0, MAX_NODES - 1), claim=st.booleans())
    def register_again(self, rank: int, claim: bool) -> None:
        """An agent whose registration answer was lost asks again with the same digest: while its node runs
        it gets that node and nothing else changes; otherwise it is refused and nothing changes."""
        node_id = self._current(rank)
        node = self.life.node(node_id)
        digest = node.registration_digest
        if not digest or self.life.job_state.finished:
            return  # registered by an agent without a key (`register_without_id`): a repeat is a conflict
        before = _timeless(self.life.snapshot())
        claimed = node_id if claim else None
        if node.state is NodeState.RUNNING:
            again, out = self.life.register(claimed, node.name, node.host, self.now, registration_digest=digest)
            assert (again.node_id, out.events, out.effects) == (node_id, (), ())
        elif claim:
            with pytest.raises(LifecycleError):
                self.life.register(claimed, node.name, node.host, self.now, registration_digest=digest)
        else:
            return  # an agent claiming no node may take a free slot: a new registration, not a repeat
        assert _timeless(self.life.snapshot()) == before

    @rule(rank=st.integers(0, MAX_NODES - 1), step=st.integers(0, 100))
    def heartbeat(self, rank: int, step: int) -> None:
        node_id = self._current(rank)
        if self.life.node(node_id).state is NodeState.RUNNING and not self.life.job_state.finished:
            self.life.heartbeat(node_id, self.now, step=step)

    @rule()
    def heartbeat_all(self) -> None:
        if self.life.job_state.finished:
            return
        for node in self.life.current_nodes().values():
            if node.state is NodeState.RUNNING:
                self.life.heartbeat(node.node_id, self.now)

    @rule(rank=st.integers(0, MAX_NODES - 1), kind=st.sampled_from(FailureKind))
    def fail(self, rank: int, kind: FailureKind) -> None:
        node_id = self._current(rank)
        if self.life.job_state.finished or self.life.node(node_id).state not in ALIVE_STATES:
            before = self.life.snapshot()
            try:
                self.life.report_failure(node_id, kind, "boom", self.now)
            except LifecycleError:
                pass
            else:
                raise AssertionError("a failure of a finished node or job was accepted")
            assert self.life.snapshot() == before
            return
        expected = self._expected(self.life.node(node_id), kind)
        others_alive = any(n.state in ALIVE_STATES and n.node_id != node_id for n in self.life.nodes().values())
        if expected is ActionKind.REMOVE_NODE and not others_alive and not self.succeeded:
            # The removal leaves no node: the action taken is the job's stop, with its reason.
            expected = ActionKind.ABORT_JOB
        decision, _ = self.life.report_failure(node_id, kind, "boom", self.now)
        assert decision.action is expected, (decision, expected)
        assert decision.outcome
        if self.life.job_state is JobState.FAILED:
            assert decision.outcome == self.life.exit_reason
        self._account(node_id, decision.action)

    @rule(rank=st.integers(0, MAX_NODES - 1), kind=st.sampled_from(FailureKind))
    def fail_after_the_round_was_over(self, rank: int, kind: FailureKind) -> None:
        """The rendezvous says the node's workers ran in a round that was over (a peer left or restarted):
        a collective error or hang restarts them and is charged nowhere. (Other kinds, with the same
        answer as without `left_behind`, are `test_lifecycle`'s; this rule draws only these two.)"""
        node_id = self._current(rank)
        node = self.life.node(node_id)
        if self.life.job_state.finished or node.state is not NodeState.RUNNING or kind not in PEER_CONSEQUENCE_KINDS:
            return  # other kinds and states take the `fail` rule's path, which it checks
        before = self.life.snapshot()
        decision, out = self.life.report_failure(node_id, kind, "peer gone", self.now, left_behind="round dissolved")
        assert decision.action is ActionKind.RESTART_PROCESSES
        assert [e.kind for e in out.events] == ["consequence_restart"]
        after = self.life.snapshot()
        assert (after.job_failures, after.nodes) == (before.job_failures, before.nodes)  # nothing charged
        assert self.life.node(node_id).process_restarts == node.process_restarts

    @rule(rank=st.integers(0, MAX_NODES - 1), lose_host=st.booleans())
    def disrupt(self, rank: int, lose_host: bool) -> None:
        """The platform takes the node away (evicted, preempted, host lost): relaunched, no budget charged."""
        node_id = self._current(rank)
        node = self.life.node(node_id)
        host = node.host or f"h{node_id}"
        if self.life.job_state.finished or node.state not in ALIVE_STATES:
            before = self.life.snapshot()
            try:
                self.life.node_disrupted(node_id, "Evicted", "the kubelet evicted it", self.now, host=host)
            except LifecycleError:
                pass
            else:
                raise AssertionError("a disruption of a finished node or job was accepted")
            assert self.life.snapshot() == before
            return
        failures = self.life.job_failures
        self.life.node_disrupted(node_id, "NodeLost", "the node stopped", self.now, host=host, avoid_host=lose_host)
        assert self.life.job_failures == failures
        if lose_host:
            assert host in self.life.avoid_hosts
        if self.succeeded:
            assert self.life.node(node_id).state is NodeState.REMOVED
            return
        assert self.life.node(node_id).state is NodeState.RELAUNCHING
        replacement = self.life.node(self._current(rank))
        assert replacement.disruptions == node.disruptions + 1
        self.disruption_relaunches[rank] += 1
        self.created += 1

    @precondition(lambda self: not self.life.job_state.finished)
    @rule(rank=st.integers(0, MAX_NODES - 1))
    def succeed(self, rank: int) -> None:
        node_id = self._current(rank)
        if self.life.node(node_id).state is NodeState.RUNNING:
            self.life.report_success(node_id, self.now)
            self.succeeded = True

    @rule(name=st.sampled_from(["x", "y", "a0"]))
    def register_without_id(self, name: str) -> None:
        before = self.life.snapshot()
        try:
            node, _ = self.life.register(None, name, f"ext-{self.created}-{name}", self.now)
        except LifecycleError:
            assert self.life.snapshot() == before
            return
        assert node.state is NodeState.RUNNING

    @rule(seconds=st.sampled_from([1.0, 5.0, 11.0, 21.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        before = self.life.nodes()
        candidates = sorted(
            n.node_id
            for n in before.values()
            if (n.state is NodeState.RUNNING and self.now - n.last_heartbeat > TIMEOUT)
            or (n.state in (NodeState.PENDING, NodeState.STARTING) and self.now - n.state_since > START_TIMEOUT)
        )
        was_finished = self.life.job_state.finished
        self.life.tick(self.now)
        if was_finished:
            assert self.life.nodes() == before
            return
        # The core fails timed-out nodes one by one in id order, until the job ends.
        for node_id in candidates:
            node = self.life.node(node_id)
            failed_now = any(t.to_state is NodeState.FAILED and t.at == self.now for t in node.history)
            if not failed_now:
                assert self.life.job_state.finished, f"node {node_id} timed out but was not failed"
                continue
            old = before[node_id]
            kind = LOST_NODE_KIND
            assert node.last_failure.startswith(kind.value)
            assert ("no heartbeat" if old.state is NodeState.RUNNING else "not registered") in node.last_failure
            expected = self._expected(old, kind, observed=True)
            observed = {
                NodeState.RELAUNCHING: ActionKind.RELAUNCH_NODE,
                NodeState.REMOVED: ActionKind.REMOVE_NODE,
                NodeState.FAILED: ActionKind.ABORT_JOB,
            }[node.state]
            assert observed is expected, (node_id, observed, expected)
            self._account(node_id, expected)

    @rule()
    def stop(self) -> None:
        was_finished = self.life.job_state.finished
        self.life.stop("operator", self.now)
        if not was_finished:
            assert self.life.job_state is JobState.STOPPED

    @rule(
        rank=st.integers(0, MAX_NODES - 1),
        change=st.sampled_from(["fail", "tick", "stop", "register", "succeed"]),
        kind=st.sampled_from(FailureKind),
    )
    def change_rolled_back(self, rank: int, change: str, kind: FailureKind) -> None:
        """A change whose journal write failed is rolled back: the state is exactly as before."""
        before, current = self.life.snapshot(), self.life.current_nodes()
        savepoint = self.life.savepoint()
        node_id = self._current(rank)
        try:
            if change == "fail":
                self.life.report_failure(node_id, kind, "boom", self.now + 1.0)
            elif change == "tick":
                self.life.tick(self.now + 2 * WINDOW)
            elif change == "stop":
                self.life.stop("operator", self.now)
            elif change == "register":
                self.life.register(node_id, f"r{node_id}", f"h{node_id}", self.now)
            else:
                self.life.report_success(node_id, self.now)
        except (LifecycleError, IllegalTransitionError):
            pass
        self.life.rollback(savepoint)
        assert self.life.snapshot() == before
        assert self.life.current_nodes() == current

    # ------------------------------------------------------------- invariants

    @invariant()
    def every_transition_is_legal_and_explained(self) -> None:
        for node in self.life.nodes().values():
            assert node.history[0].from_state is None
            assert node.history[0].to_state is NodeState.PENDING
            for record in node.history[1:]:
                assert record.from_state is not None
                assert record.to_state in TRANSITIONS[record.from_state]
                assert record.reason
            assert node.history[-1].to_state is node.state

    @invariant()
    def every_failure_ends_in_relaunch_removal_or_job_stop(self) -> None:
        for node in self.life.nodes().values():
            if node.state is NodeState.FAILED:
                assert self.life.job_state.finished
                assert self.life.exit_reason
            if node.state is NodeState.RELAUNCHING:
                assert node.replaced_by is not None
        if self.life.job_state.finished:
            assert self.life.exit_reason
            assert not any(n.state in ALIVE_STATES for n in self.life.nodes().values())

    @invariant()
    def budgets_are_never_exceeded(self) -> None:
        # Failures count within the budget window: over the job's life there may be more.
        assert self._within(self.failures) <= MAX_FAILURES + 1
        window = self.life.config.budget_window
        for node in self.life.nodes().values():
            assert node.process_restarts <= MAX_RESTARTS
            # Disruptions (the platform's doing) are counted in relaunch_count but charged to no budget.
            assert len(node.relaunched_at) <= node.relaunch_count - node.disruptions
            assert window.count(node.relaunched_at, self.now) <= MAX_RELAUNCHES
            assert len(node.relaunched_at) <= MAX_RELAUNCHES  # only the newest are kept

    @invariant()
    def ranks_are_stable_across_replacement(self) -> None:
        nodes = self.life.nodes()
        current = self.life.current_nodes()
        assert sorted(current) == list(range(MAX_NODES))
        for rank, node in current.items():
            assert node.rank == rank
        for node in nodes.values():
            if node.replaced_by is not None:
                assert nodes[node.replaced_by].rank == node.rank
                assert nodes[node.replaced_by].relaunch_count == node.relaunch_count + 1
            alive_same_rank = [n for n in nodes.values() if n.rank == node.rank and n.state in ALIVE_STATES]
            assert len(alive_same_rank) <= 1

    @invariant()
    def restore_of_snapshot_equals_the_state(self) -> None:
        snap = self.life.snapshot()
        restored = JobLifecycle(self.life.config, DefaultFailurePolicy(), self.now, snapshot=snap)
        # Heartbeat times restart at the restore (a fresh timeout); everything else is equal.
        assert _timeless(restored.snapshot()) == _timeless(snap)
        assert restored.current_nodes().keys() == self.life.current_nodes().keys()
        assert {r: n.node_id for r, n in restored.current_nodes().items()} == {
            r: n.node_id for r, n in self.life.current_nodes().items()
        }

    @invariant()
    def too_few_nodes_for_the_window_stops_the_job(self) -> None:
        life = self.life
        if life.job_state.finished:
            if "insufficient nodes" in life.exit_reason:
                assert self.low_since is not None
                assert self.now - self.low_since >= WINDOW
            return
        if self.succeeded:
            self.low_since = None
            return
        if self.low_since is not None:
            assert self.now - self.low_since < WINDOW, "too few nodes for longer than the window, yet running"
        if life.count(NodeState.RUNNING) < MIN_NODES:
            self.low_since = self.now if self.low_since is None else self.low_since
        else:
            self.low_since = None

    @invariant()
    def the_model_agrees_on_counts(self) -> None:
        assert len(self.life.nodes()) == self.created
        assert self.life.job_failures == len(self.failures)
        for rank, times in self.relaunches.items():
            extra = self.disruption_relaunches[rank]
            assert sum(1 for n in self.life.nodes().values() if n.rank == rank) == len(times) + extra + 1
            # What a rank's node keeps of its charged relaunches: the newest, no more than the budget.
            kept = self.life.node(self._current(rank)).relaunched_at
            assert list(kept) == times[len(times) - min(len(times), MAX_RELAUNCHES) :]


LifecycleMachine.TestCase.settings = settings(LifecycleMachine.TestCase.settings, stateful_step_count=25)
TestLifecycle = LifecycleMachine.TestCase
