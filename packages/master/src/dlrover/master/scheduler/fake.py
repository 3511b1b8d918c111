"""The in-memory scheduler: records what it is told; tests set what it observes."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import attrs

from dlrover.master.scheduler.base import NodeSpec, ObservedNode, ObservedState, SchedulerError

__all__ = ["FakeScheduler"]


class FakeScheduler:
    """Launches nothing; `set_state` plays the cluster."""

    name = "fake"

    def __init__(self, *, relaunches_nodes: bool = True) -> None:
        self.relaunches_nodes = relaunches_nodes
        self._lock = threading.Lock()
        self._nodes: dict[int, ObservedNode] = {}
        self.specs: dict[int, NodeSpec] = {}
        self.stopped: list[int] = []
        self.closed = False
        self.fail_launches: bool | int = False
        """True: every launch fails; a number n: the next n launches fail (counting down)."""
        self.launch_attempts: list[int] = []
        """The node id of every launch asked for, failed ones included, in order."""
        self.slots: int | None = None
        """How many nodes fit (None: no limit); tests change it to play capacity changes."""

    def capacity(self) -> int | None:
        """`slots` less the nodes pending or running (None when `slots` is None)."""
        with self._lock:
            if self.slots is None:
                return None
            held = sum(1 for n in self._nodes.values() if n.state in (ObservedState.PENDING, ObservedState.RUNNING))
            return self.slots - held

    def launch(self, spec: NodeSpec) -> None:
        """Record the spec; the node is PENDING until `set_state` says otherwise."""
        with self._lock:
            self.launch_attempts.append(spec.node_id)
            if self.fail_launches:
                if self.fail_launches is not True:
                    self.fail_launches -= 1
                raise SchedulerError(f"cannot launch node {spec.node_id}: launches are failing (test switch)")
            if spec.node_id in self._nodes:
                raise SchedulerError(f"node {spec.node_id} was already launched")
            self.specs[spec.node_id] = spec
            self._nodes[spec.node_id] = ObservedNode(spec.node_id, ObservedState.PENDING)

    def stop(self, node_id: int) -> None:
        """Mark the node STOPPED (unless it already ended)."""
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                return
            self.stopped.append(node_id)
            if node.state in (ObservedState.PENDING, ObservedState.RUNNING):
                self._nodes[node_id] = attrs.evolve(node, state=ObservedState.STOPPED)

    def observe(self) -> Mapping[int, ObservedNode]:
        """What `set_state` last said of each node."""
        with self._lock:
            return dict(self._nodes)

    def set_state(
        self,
        node_id: int,
        state: ObservedState,
        exit_code: int | None = None,
        host: str = "",
        *,
        reason: str = "",
        evidence: str = "",
        disruption: bool = False,
    ) -> None:
        """Play the cluster: the node is now in `state` (with the platform's `reason`, `evidence` and
        whether it was a `disruption`, as `ObservedNode` has them)."""
        with self._lock:
            self._nodes[node_id] = ObservedNode(node_id, state, exit_code, host, reason, evidence, disruption)

    def close(self) -> None:
        """Stop every node still pending or running."""
        with self._lock:
            self.closed = True
            for node_id, node in self._nodes.items():
                if node.state in (ObservedState.PENDING, ObservedState.RUNNING):
                    self._nodes[node_id] = attrs.evolve(node, state=ObservedState.STOPPED)
