"""An in-memory `RayCluster` for tests: nodes join and die and agents end when the test says so."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import attrs

from dlrover.master.scheduler.base import SchedulerError
from dlrover.master.scheduler.ray.cluster import AgentFate, AgentLaunch, AgentReport, RayNode

__all__ = ["FakeAgent", "FakeRayCluster"]


@attrs.define
class FakeAgent:
    """What the backend asked of one agent actor, and its fate as the test set it."""

    ray_node: str
    request: dict[str, float]
    command: list[str]
    env: dict[str, str]
    log_path: str | None
    report: AgentReport = attrs.field(factory=lambda: AgentReport(AgentFate.PENDING))
    recheck_answer: AgentReport | None = None
    """What `recheck` answers (None: RUNNING)."""
    stopped_with_grace: float | None = None
    released: bool = False


class FakeRayCluster:
    """Plays a Ray cluster: `add_node`, `kill_node`, `set_fate`; records what the backend asked."""

    def __init__(self, driver_address: str = "127.0.0.1") -> None:
        self._driver_address = driver_address
        self._cond = threading.Condition()
        self._nodes: dict[str, RayNode] = {}
        self.agents: dict[int, FakeAgent] = {}
        self.closed = False
        self._changes = 0
        self._seen_changes = 0

    def add_node(self, node_id: str, address: str = "127.0.0.1", **resources: float) -> None:
        """A node joins with `resources` (Ray's names: CPU, GPU, memory in bytes) at `address`."""
        with self._cond:
            self._nodes[node_id] = RayNode(node_id, True, dict(resources or {"CPU": 1.0}), address)
            self._changed()

    def kill_node(self, node_id: str, *, table_knows: bool = True) -> None:
        """The node dies: its agents' actors die; the node table shows it dead unless `table_knows` is False
        (Ray can report the actor's death before its health check marks the node)."""
        with self._cond:
            for agent in self.agents.values():
                if agent.ray_node == node_id and agent.report.fate in (AgentFate.PENDING, AgentFate.RUNNING):
                    agent.report = AgentReport(AgentFate.DIED, error=f"node {node_id} died")
            if table_knows:
                self.mark_dead(node_id)
            self._changed()

    def mark_dead(self, node_id: str) -> None:
        """The node table shows the node dead."""
        with self._cond:
            self._nodes[node_id] = attrs.evolve(self._nodes[node_id], alive=False)
            self._changed()

    def set_fate(self, node_id: int, report: AgentReport) -> None:
        """What `report` answers for job node `node_id` from now on."""
        with self._cond:
            self.agents[node_id].report = report
            self._changed()

    def _changed(self) -> None:
        self._changes += 1
        self._cond.notify_all()

    # ------------------------------------------------------------------ RayCluster

    def nodes(self) -> Sequence[RayNode]:
        with self._cond:
            return list(self._nodes.values())

    def start_agent(self, launch: AgentLaunch) -> None:
        with self._cond:
            if launch.node_id in self.agents:
                raise SchedulerError(f"node {launch.node_id} has an agent actor already")
            self.agents[launch.node_id] = FakeAgent(
                launch.ray_node, dict(launch.request), list(launch.command), dict(launch.env), launch.log_path
            )

    def report(self, node_id: int) -> AgentReport:
        with self._cond:
            if node_id not in self.agents:
                raise SchedulerError(f"node {node_id} has no agent actor")
            return self.agents[node_id].report

    def driver_address(self) -> str:
        return self._driver_address

    def recheck(self, node_id: int) -> AgentReport:
        with self._cond:
            agent = self.agents[node_id]
            answer = agent.recheck_answer or AgentReport(AgentFate.RUNNING)
            if answer.fate is AgentFate.RUNNING and agent.report.fate is AgentFate.UNREACHABLE:
                agent.report = answer
            return answer

    def wait(self, timeout_s: float) -> bool:
        with self._cond:
            changed = self._cond.wait_for(lambda: self._changes != self._seen_changes, timeout_s)
            self._seen_changes = self._changes
            return changed

    def stop_agent(self, node_id: int, grace_s: float) -> None:
        with self._cond:
            agent = self.agents.get(node_id)
            if agent is None:
                return
            agent.stopped_with_grace = grace_s
            if agent.report.fate in (AgentFate.PENDING, AgentFate.RUNNING):
                agent.report = AgentReport(AgentFate.EXITED, exit_code=-15)
            self._changed()

    def release(self, node_id: int) -> None:
        with self._cond:
            agent = self.agents.get(node_id)
            if agent is not None:
                agent.released = True

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._changed()
