"""The external backend: someone else starts the agents (Slurm `srun`, a person on each node).

`launch` only records that a slot is open; the agent that registers fills it. `stop` cannot
reach a process it did not start: the master tells the agent to stop on its next heartbeat.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import attrs

from dlrover.master.scheduler.base import NodeSpec, ObservedNode, ObservedState, SchedulerError

__all__ = ["ExternalScheduler"]


class ExternalScheduler:
    """Slots for agents that register themselves."""

    name = "external"
    relaunches_nodes = False
    """A relaunch only opens a slot: nobody here starts the agent that fills it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[int, ObservedNode] = {}

    def capacity(self) -> int | None:
        """Unknown: whoever starts the agents decides how many come (None)."""
        return None

    def launch(self, spec: NodeSpec) -> None:
        """Open a slot; the node stays PENDING as far as this backend can tell."""
        with self._lock:
            if spec.node_id in self._nodes:
                raise SchedulerError(f"node {spec.node_id} was already launched")
            self._nodes[spec.node_id] = ObservedNode(spec.node_id, ObservedState.PENDING)

    def stop(self, node_id: int) -> None:
        """Close the slot (the agent itself is told on its heartbeat)."""
        with self._lock:
            node = self._nodes.get(node_id)
            if node is not None and node.state is ObservedState.PENDING:
                self._nodes[node_id] = attrs.evolve(node, state=ObservedState.STOPPED)

    def observe(self) -> Mapping[int, ObservedNode]:
        """Open slots as PENDING, closed ones as STOPPED: agents' liveness comes from heartbeats."""
        with self._lock:
            return dict(self._nodes)

    def close(self) -> None:
        """Close every slot."""
        with self._lock:
            for node_id, node in self._nodes.items():
                self._nodes[node_id] = attrs.evolve(node, state=ObservedState.STOPPED)
