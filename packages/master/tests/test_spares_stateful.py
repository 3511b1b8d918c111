"""Hypothesis state machine for warm spares in the node lifecycle.

Nodes register, fail (reported or observed), go silent; the backend's room changes and the master keeps
its spares (`keep_spares`); the job is resized. Checked against the laws of spares: a spare holds no
rank and is never a rank's current node; ranks stay unique; the spares never outnumber
`spare_nodes` nor, with the ranked nodes, the backend's room (the ranked nodes come first); only a
running spare is promoted, into the rank of the node it replaces; a lost spare counts no job failure;
and a restored lifecycle has the same spares and ranks.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.diagnosis import FailureKind
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.lifecycle import JobLifecycle, LifecycleError
from dlrover.master.policy import DefaultFailurePolicy
from dlrover.master.records import LaunchNode, LifecycleSnapshot
from dlrover.master.resize import ResizeError, ResizeRequest, ResizeSource
from dlrover.master.states import ALIVE_STATES, NodeState

pytestmark = pytest.mark.timeout(300)

MAX_NODES = 3
TIMEOUT = 10.0


def _timeless(snap: LifecycleSnapshot) -> LifecycleSnapshot:
    return attrs.evolve(snap, nodes=tuple(attrs.evolve(n, last_heartbeat=0.0, state_since=0.0) for n in snap.nodes))


class SpareMachine(RuleBasedStateMachine):
    @initialize(spares=st.integers(1, 2), placeable=st.none() | st.integers(1, 6))
    def setup(self, spares: int, placeable: int | None) -> None:
        self.now = 0.0
        self.spares = spares
        self.placeable = placeable
        cfg = LifecycleConfig(
            nodes=NodeRange(1, MAX_NODES),
            heartbeat_timeout_s=TIMEOUT,
            node_start_timeout_s=None,
            max_relaunches=3,
            max_job_failures=50,
            insufficient_nodes_window_s=1000.0,
            spare_nodes=spares,
        )
        self.life = JobLifecycle(cfg, DefaultFailurePolicy(), self.now)
        self.life.start(self.now, placeable=placeable)
        self.promoted: set[int] = set()

    def _alive(self) -> list[int]:
        return sorted(n.node_id for n in self.life.nodes().values() if n.state in ALIVE_STATES)

    @rule(data=st.data())
    def register(self, data: st.DataObject) -> None:
        pending = [n for n in self.life.nodes().values() if n.state is NodeState.PENDING]
        if not pending or self.life.job_state.finished:
            return
        node = data.draw(st.sampled_from(sorted(pending, key=lambda n: n.node_id)))
        registered, _ = self.life.register(node.node_id, f"a{node.node_id}", f"h{node.node_id}", self.now)
        assert registered.state is NodeState.RUNNING
        assert registered.spare == node.spare

    @rule()
    def heartbeat_all(self) -> None:
        if self.life.job_state.finished:
            return
        for node in self.life.nodes().values():
            if node.state is NodeState.RUNNING:
                self.life.heartbeat(node.node_id, self.now)

    @rule(data=st.data(), observed=st.booleans())
    def fail(self, data: st.DataObject, observed: bool) -> None:
        alive = self._alive()
        if not alive or self.life.job_state.finished:
            return
        node = self.life.node(data.draw(st.sampled_from(alive)))
        failures = self.life.job_failures
        ready = [s.node_id for s in self.life.spare_nodes() if s.state is NodeState.RUNNING]
        if observed:
            decision, out = self.life.node_lost(node.node_id, "the agent exited", self.now)
        else:
            decision, out = self.life.report_failure(node.node_id, FailureKind.HARDWARE, "boom", self.now)
        promoted = [e for e in out.events if e.kind == "spare_promoted"]
        if node.spare:
            assert self.life.job_failures == failures, "a lost spare counts no job failure"
            assert self.life.node(node.node_id).state is NodeState.FAILED
            assert not promoted
            return
        if promoted:
            (event,) = promoted
            assert event.data["spare"] in ready, "only a registered, running spare is promoted"
            assert event.data["replaces"] == node.node_id
            assert event.data["rank"] == node.rank
            assert self.life.current_nodes()[node.rank].node_id == event.data["spare"]
            assert not [e for e in out.effects if isinstance(e, LaunchNode) and e.rank == node.rank]
            self.promoted.add(event.data["spare"])
        elif decision.action.relaunches_node and not self.life.job_state.finished:
            assert not [s for s in ready if s not in {n.node_id for n in self.life.spare_nodes()}]

    @rule(placeable=st.none() | st.integers(0, 6))
    def keep_spares(self, placeable: int | None) -> None:
        self.placeable = placeable
        self.life.keep_spares(self.now, placeable=placeable)
        if self.life.job_state.finished:
            return
        ranked = len(self.life.live_nodes())
        spares = len(self.life.spare_nodes())
        assert spares <= self.spares
        if placeable is not None:
            assert spares <= max(0, placeable - ranked), "the ranked nodes come first"

    @precondition(lambda self: self.life.started)
    @rule(size=st.integers(1, MAX_NODES), placeable=st.none() | st.integers(1, 6))
    def resize(self, size: int, placeable: int | None) -> None:
        ready = {s.node_id for s in self.life.spare_nodes() if s.state is NodeState.RUNNING}
        try:
            out = self.life.resize(ResizeRequest(size, "test", ResizeSource.SCALE), self.now, placeable=placeable)
        except (LifecycleError, ResizeError):
            return
        for event in out.events:
            if event.kind == "spare_promoted":
                assert event.data["spare"] in ready

    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.life.tick(self.now)

    @invariant()
    def spares_hold_no_rank(self) -> None:
        if not hasattr(self, "life"):
            return
        current = self.life.current_nodes()
        ranks = [n.rank for n in current.values()]
        assert len(ranks) == len(set(ranks))
        current_ids = {n.node_id for n in current.values()}
        for node in self.life.nodes().values():
            if node.spare:
                assert node.rank == -1
                assert node.node_id not in current_ids
        assert all(not self.life.node(n).spare for n in self.promoted)
        assert len(self.life.spare_nodes()) <= self.spares

    @invariant()
    def a_restored_lifecycle_has_the_same_spares(self) -> None:
        if not hasattr(self, "life"):
            return
        snap = self.life.snapshot()
        again = JobLifecycle(self.life.config, DefaultFailurePolicy(), self.now, snap)
        assert [n.node_id for n in again.spare_nodes()] == [n.node_id for n in self.life.spare_nodes()]
        assert {r: n.node_id for r, n in again.current_nodes().items()} == {
            r: n.node_id for r, n in self.life.current_nodes().items()
        }
        assert _timeless(again.snapshot()) == _timeless(snap)


TestSpareMachine = SpareMachine.TestCase
TestSpareMachine.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
