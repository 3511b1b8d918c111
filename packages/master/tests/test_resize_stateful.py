"""Hypothesis state machine of the lifecycle under resize requests, capacity changes and failures.

Laws checked after every step: the target and the wanted count stay within the worker group's
range (the target may drop below the minimum only when the backend's capacity did), the job never
has more live nodes than its target, a refused request changes nothing, the nodes a shrink stops
are the first ones by the documented order (checked against a model of that order), and the state
survives the journal's round trip (job fields and node records through JSON) unchanged, and a
resize that neither launches nor removes a node queues no restart and is no ``resize`` event.
"""

from __future__ import annotations

import json

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.diagnosis import FailureKind
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.journal import _snapshot, job_fields
from dlrover.master.lifecycle import JobLifecycle, LifecycleError
from dlrover.master.policy import DefaultFailurePolicy
from dlrover.master.records import (
    LaunchNode,
    LifecycleSnapshot,
    NodeRecord,
    Outcome,
    StopNode,
    node_from_dict,
    node_to_dict,
    pending_work_from_json,
    pending_work_to_json,
)
from dlrover.master.resize import ResizeError, ResizeRequest, ResizeSource
from dlrover.master.states import JobState, NodeState

MIN_NODES = 2
MAX_NODES = 5
HOSTS = ("h0", "h1", "h2")


def _model_leaving_key(node: NodeRecord, avoid_hosts: set[str], step_times: dict[int, float]) -> tuple[object, ...]:
    """The documented order, written out independently of `leaving_order_key`."""
    node_id = node.node_id
    pending = node.state is not NodeState.RUNNING
    avoided = node.host in avoid_hosts
    known = node_id in step_times
    return (not pending, not avoided, not known, -step_times.get(node_id, 0.0), -node.rank)


def _journal_round_trip(life: JobLifecycle) -> LifecycleSnapshot:
    """What a new master reads back of `life`: the job record, the node rows, the pending work rows."""
    snap = life.snapshot()
    job = json.loads(json.dumps(job_fields(snap)))
    nodes = [node_from_dict(json.loads(json.dumps(node_to_dict(n)))) for n in snap.nodes]
    work = {
        node_id: pending_work_from_json(json.loads(json.dumps(pending_work_to_json(owed))))
        for node_id, owed in life.changed_work(every=True).items()
    }
    restored = _snapshot(job, nodes, work)
    assert restored is not None
    return restored


class ResizeMachine(RuleBasedStateMachine):
    @initialize(placeable=st.none() | st.integers(0, MAX_NODES + 2))
    def setup(self, placeable: int | None) -> None:
        self.now = 0.0
        cfg = LifecycleConfig(
            nodes=NodeRange(MIN_NODES, MAX_NODES),
            heartbeat_timeout_s=1e9,
            node_start_timeout_s=None,
            node_pending_timeout_s=None,
            insufficient_nodes_window_s=1e9,
            max_job_failures=1000,
        )
        self.life = JobLifecycle(cfg, DefaultFailurePolicy(), self.now)
        self.life.start(self.now, placeable=placeable)
        self.capacity_limited = placeable is not None and placeable < MIN_NODES

    def _tick(self) -> None:
        self.now += 1.0

    @rule(data=st.data())
    def register_one(self, data: st.DataObject) -> None:
        pending = [n for n in self.life.live_nodes() if n.state is NodeState.PENDING]
        if not pending or self.life.job_state.finished:
            return
        hosts = [h for h in HOSTS if h not in self.life.avoid_hosts]
        if not hosts:
            return
        node = data.draw(st.sampled_from(pending))
        host = data.draw(st.sampled_from(hosts))
        self._tick()
        self.life.register(node.node_id, f"agent-{node.node_id}", host, self.now)

    @rule(host=st.sampled_from(HOSTS[1:]))
    def avoid_host(self, host: str) -> None:
        self.life.mark_host_unhealthy(host, "health check failed")

    @rule(
        count=st.integers(-1, MAX_NODES + 2),
        placeable=st.none() | st.integers(0, MAX_NODES + 2),
        times=st.dictionaries(st.integers(0, 30), st.floats(0.01, 10.0), max_size=6),
    )
    def scale(self, count: int, placeable: int | None, times: dict[int, float]) -> None:
        before = self.life.snapshot()
        live_before = {n.node_id: n for n in self.life.live_nodes()}
        self._tick()
        try:
            out = self.life.resize(
                ResizeRequest(max(count, 0), "property", ResizeSource.SCALE), self.now, placeable=placeable,
                pace_s=times,
            )  # fmt: skip
        except (ResizeError, LifecycleError):
            assert self.life.snapshot() == before, "a refused resize changed the state"
            in_range = MIN_NODES <= max(count, 0) <= MAX_NODES
            assert not in_range or self.life.job_state.finished or self.life.count(NodeState.SUCCEEDED)
            return
        assert MIN_NODES <= count <= MAX_NODES
        self.capacity_limited = placeable is not None and placeable < MIN_NODES
        self._check_leaving(out.effects, live_before, times)
        self._check_no_move_no_restart(out, live_before, before)

    @rule(placeable=st.integers(0, MAX_NODES + 2))
    def capacity(self, placeable: int) -> None:
        if self.life.job_state.finished or self.life.count(NodeState.SUCCEEDED):
            return
        live_before = {n.node_id: n for n in self.life.live_nodes()}
        before = self.life.snapshot()
        self._tick()
        out = self.life.resize(
            ResizeRequest(self.life.wanted_nodes, "capacity", ResizeSource.CAPACITY), self.now, placeable=placeable
        )
        self.capacity_limited = placeable < MIN_NODES
        self._check_leaving(out.effects, live_before, {})
        self._check_no_move_no_restart(out, live_before, before)

    @rule(data=st.data(), kind=st.sampled_from([FailureKind.UNKNOWN, FailureKind.HARDWARE]))
    def fail(self, data: st.DataObject, kind: FailureKind) -> None:
        live = self.life.live_nodes()
        if not live or self.life.job_state.finished:
            return
        node = data.draw(st.sampled_from(live))
        self._tick()
        self.life.report_failure(node.node_id, kind, "boom", self.now)

    @precondition(lambda self: not self.life.job_state.finished)
    @rule()
    def tick(self) -> None:
        self._tick()
        self.life.tick(self.now)

    def _check_no_move_no_restart(
        self, out: Outcome, live_before: dict[int, NodeRecord], before: LifecycleSnapshot
    ) -> None:
        """A resize that neither launches nor removes a node queues no action and is no ``resize``
        event; one that also changes neither the target nor the wanted count changes nothing."""
        launched = [e for e in out.effects if isinstance(e, LaunchNode)]
        stopped = [e for e in out.effects if isinstance(e, StopNode) and e.node_id in live_before]
        if launched or stopped:
            return
        assert "resize" not in [e.kind for e in out.events], out.events
        assert self.life.snapshot().actions == before.actions
        assert self.life.snapshot().planned_round == before.planned_round
        if (self.life.target_nodes, self.life.wanted_nodes) == (before.target_nodes, before.wanted_nodes):
            assert out == Outcome()
            assert self.life.snapshot() == before

    def _check_leaving(
        self, effects: tuple[object, ...], live_before: dict[int, NodeRecord], times: dict[int, float]
    ) -> None:
        stopped = [e.node_id for e in effects if isinstance(e, StopNode) and e.node_id in live_before]
        if not stopped:
            return
        avoided = set(self.life.avoid_hosts)
        ordered = sorted(live_before.values(), key=lambda n: _model_leaving_key(n, avoided, times))
        assert stopped == [n.node_id for n in ordered[: len(stopped)]], (stopped, ordered)

    @invariant()
    def target_in_range(self) -> None:
        life = self.life
        assert MIN_NODES <= life.wanted_nodes <= MAX_NODES
        assert 0 <= life.target_nodes <= life.wanted_nodes <= MAX_NODES
        if life.target_nodes < MIN_NODES:
            assert self.capacity_limited, "only lost capacity takes the target below the minimum"

    @invariant()
    def no_more_live_nodes_than_the_target(self) -> None:
        if self.life.job_state is JobState.RUNNING:
            assert len(self.life.live_nodes()) <= self.life.target_nodes

    @invariant()
    def journal_round_trip(self) -> None:
        snap = self.life.snapshot()
        restored = _journal_round_trip(self.life)
        assert restored == snap
        resumed = JobLifecycle(self.life.config, DefaultFailurePolicy(), self.now, restored)
        assert (resumed.target_nodes, resumed.wanted_nodes) == (self.life.target_nodes, self.life.wanted_nodes)
        assert _timeless(resumed.snapshot()) == _timeless(snap)


def _timeless(snap: LifecycleSnapshot) -> LifecycleSnapshot:
    return attrs.evolve(snap, nodes=tuple(attrs.evolve(n, last_heartbeat=0.0, state_since=0.0) for n in snap.nodes))


ResizeMachine.TestCase.settings = settings(ResizeMachine.TestCase.settings, stateful_step_count=30)
TestResize = ResizeMachine.TestCase
