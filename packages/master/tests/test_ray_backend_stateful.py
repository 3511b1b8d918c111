"""The Ray backend as a state machine: any order of launches, stops, node joins and deaths, actor deaths and
exits keeps its promises (one agent per Ray node, avoided hosts avoided, an ended node's record final,
capacity = free Ray nodes - waiting launches, a lost node a disruption only when its Ray node is dead)."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.common import ManualClock
from dlrover.master.scheduler import NodeSpec, ObservedNode, ObservedState
from dlrover.master.scheduler.base import REASON_NODE_LOST
from dlrover.master.scheduler.ray import AgentFate, AgentReport, FakeRayCluster, RayScheduler, RaySettings

pytestmark = pytest.mark.timeout(300)

RAY_NODES = ("n0", "n1", "n2", "n3")
ENDED = (ObservedState.SUCCEEDED, ObservedState.FAILED, ObservedState.STOPPED)


class RayBackendMachine(RuleBasedStateMachine):
    @initialize(first=st.integers(min_value=0, max_value=2))
    def start(self, first: int) -> None:
        self.clock = ManualClock()
        self.cluster = FakeRayCluster()
        self.cluster.add_node("head", CPU=0.0)
        self.joined: list[str] = []
        for name in RAY_NODES[:first]:
            self.join(name)
        self.backend = RayScheduler(
            ["dlrover-run", "train.py"],
            self.cluster,
            settings=RaySettings(death_confirm_s=3.0),
            clock=self.clock,
            watch=False,
        )
        self.next_id = 0
        self.avoid: dict[int, frozenset[str]] = {}
        self.final: dict[int, ObservedNode] = {}
        self.stopped: set[int] = set()

    def join(self, name: str) -> None:
        self.cluster.add_node(name, CPU=1.0)
        self.joined.append(name)

    def alive(self) -> set[str]:
        return {n.node_id for n in self.cluster.nodes() if n.alive and n.node_id != "head"}

    @rule(avoid=st.frozensets(st.sampled_from(RAY_NODES), max_size=2))
    def launch(self, avoid: frozenset[str]) -> None:
        node_id = self.next_id
        self.next_id += 1
        self.backend.launch(NodeSpec(job_name="j", node_id=node_id, rank=node_id, avoid_hosts=avoid))
        self.avoid[node_id] = avoid

    @precondition(lambda self: len(self.joined) < len(RAY_NODES))
    @rule()
    def a_ray_node_joins(self) -> None:
        self.join(next(n for n in RAY_NODES if n not in self.joined))

    @precondition(lambda self: bool(self.alive()))
    @rule(data=st.data(), table_knows=st.booleans())
    def a_ray_node_dies(self, data: st.DataObject, table_knows: bool) -> None:
        self.cluster.kill_node(data.draw(st.sampled_from(sorted(self.alive()))), table_knows=table_knows)

    @rule(data=st.data())
    def the_node_table_catches_up(self, data: st.DataObject) -> None:
        dead_actors = {a.ray_node for a in self.cluster.agents.values() if a.report.fate is AgentFate.DIED}
        candidates = sorted(dead_actors & self.alive())
        if candidates:
            self.cluster.mark_dead(data.draw(st.sampled_from(candidates)))

    def placed(self) -> list[int]:
        return sorted(self.cluster.agents)

    @precondition(lambda self: bool(self.cluster.agents))
    @rule(data=st.data(), fate=st.sampled_from(["run", "exit0", "exit1", "died", "unreachable", "start_failed"]))
    def an_agent_changes(self, data: st.DataObject, fate: str) -> None:
        node_id = data.draw(st.sampled_from(self.placed()))
        if self.cluster.agents[node_id].report.fate not in (AgentFate.PENDING, AgentFate.RUNNING):
            return  # Ray does not bring an ended actor back
        report = {
            "run": AgentReport(AgentFate.RUNNING),
            "exit0": AgentReport(AgentFate.EXITED, exit_code=0),
            "exit1": AgentReport(AgentFate.EXITED, exit_code=1),
            "died": AgentReport(AgentFate.DIED, error="killed"),
            "unreachable": AgentReport(AgentFate.UNREACHABLE, error="reset"),
            "start_failed": AgentReport(AgentFate.START_FAILED, error="no such file"),
        }[fate]
        self.cluster.set_fate(node_id, report)
        if fate == "unreachable":
            answers = [None, AgentReport(AgentFate.UNREACHABLE, error="still"), AgentReport(AgentFate.DIED)]
            self.cluster.agents[node_id].recheck_answer = data.draw(st.sampled_from(answers))

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: self.next_id > 0)
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        node_id = data.draw(st.integers(min_value=0, max_value=self.next_id - 1))
        before = self.backend.observe()[node_id]
        self.backend.stop(node_id)
        if before.state not in ENDED:
            self.stopped.add(node_id)

    @rule()
    def observe(self) -> None:
        seen = self.backend.observe()
        alive = self.alive()
        for node_id, node in seen.items():
            if node_id in self.final:
                assert node == self.final[node_id], (node_id, node, self.final[node_id])
            if node_id in self.stopped:
                assert node.state is ObservedState.STOPPED, (node_id, node)
            if node.state in ENDED:
                self.final[node_id] = node
            if node.disruption:
                assert node.reason == REASON_NODE_LOST
                assert node.host not in alive
            if node.host:
                assert node.host not in self.avoid[node_id]

    @invariant()
    def one_agent_per_ray_node(self) -> None:
        seen = self.backend.observe()
        active = [
            self.backend.placed_host(node_id)
            for node_id, node in seen.items()
            if node.state in (ObservedState.PENDING, ObservedState.RUNNING) and self.backend.placed_host(node_id)
        ]
        assert len(active) == len(set(active)), active

    @invariant()
    def capacity_is_free_ray_nodes_less_waiting_launches(self) -> None:
        seen = self.backend.observe()
        held = {
            self.backend.placed_host(node_id)
            for node_id, node in seen.items()
            if node.state in (ObservedState.PENDING, ObservedState.RUNNING)
        }
        waiting = sum(1 for node_id, node in seen.items() if node.state is ObservedState.PENDING and not node.host)
        free = len(self.alive() - (held - {""}))
        assert self.backend.capacity() == free - waiting

    def teardown(self) -> None:
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()
            assert self.cluster.closed


TestRayBackend = RayBackendMachine.TestCase
