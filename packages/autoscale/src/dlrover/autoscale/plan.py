"""`ScalePlan`: what the scheduler must do to move a job from the nodes it has to the nodes it should have.

Every producer in this package (the planner, the runtime heuristics, the initial planner) returns one of these
with a reason, and never acts itself: the master's scheduler backend carries it out and records the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from dlrover.autoscale._validate import non_negative_int, positive_int
from dlrover.autoscale.resources import Resources, Role


def _launches(items: Iterable[LaunchRequest]) -> tuple[LaunchRequest, ...]:
    return tuple(items)


def _ids(items: Iterable[int]) -> tuple[int, ...]:
    return tuple(items)


def _resizes(items: Iterable[ResizeRequest]) -> tuple[ResizeRequest, ...]:
    return tuple(items)


__all__ = ["NodeState", "LaunchRequest", "ResizeRequest", "ScalePlan", "diff_to_target"]


@attrs.frozen
class NodeState:
    """A job node the scheduler has started (running or pending).

    Args:
        node_id: the job-unique id of the node; higher ids were started later.
        role: worker or parameter server.
        resources: what the node requested.
    """

    node_id: int = attrs.field(validator=non_negative_int)
    role: Role
    resources: Resources


@attrs.frozen
class LaunchRequest:
    """Start `count` new nodes of `role`, each requesting `resources`."""

    role: Role
    count: int = attrs.field(validator=positive_int)
    resources: Resources


@attrs.frozen
class ResizeRequest:
    """Replace node `node_id` with one requesting `resources` (a relaunch: running nodes cannot be resized in place)."""

    node_id: int = attrs.field(validator=non_negative_int)
    role: Role
    resources: Resources


@attrs.frozen
class ScalePlan:
    """Launch, remove and resize actions, and the reason for them.

    Args:
        launch: new nodes to start.
        remove: ids of nodes to stop for good.
        resize: nodes to relaunch with a different request.
        reason: why; shown in the job's events and status.
    """

    launch: tuple[LaunchRequest, ...] = attrs.field(default=(), converter=_launches)
    remove: tuple[int, ...] = attrs.field(default=(), converter=_ids)
    resize: tuple[ResizeRequest, ...] = attrs.field(default=(), converter=_resizes)
    reason: str = ""

    @classmethod
    def empty(cls, reason: str) -> ScalePlan:
        """A plan that changes nothing, with the reason nothing changes."""
        return cls(reason=reason)

    @property
    def is_empty(self) -> bool:
        """Whether the plan has no action."""
        return not (self.launch or self.remove or self.resize)

    def launched(self, role: Role) -> int:
        """How many new nodes of `role` the plan starts."""
        return sum(r.count for r in self.launch if r.role == role)


def _role_diff(
    nodes: Sequence[NodeState], role: Role, count: int, resources: Resources
) -> tuple[list[LaunchRequest], list[int], list[ResizeRequest]]:
    mine = sorted((n for n in nodes if n.role == role), key=lambda n: n.node_id)
    # Keep the oldest nodes: they hold the lowest ranks, and removing the newest disturbs the fewest peers.
    keep, drop = mine[:count], mine[count:]
    launch = [LaunchRequest(role, count - len(keep), resources)] if count > len(keep) else []
    resize = [ResizeRequest(n.node_id, role, resources) for n in keep if n.resources != resources]
    return launch, [n.node_id for n in drop], resize


def diff_to_target(
    current: Iterable[NodeState],
    targets: Iterable[tuple[Role, int, Resources]],
    reason: str,
) -> ScalePlan:
    """The plan that turns `current` nodes into the `targets` (role, count, resources per node).

    Roles absent from `targets` are left alone.

    Raises:
        ValueError: if a role appears twice in `targets`, or node ids repeat in `current`.
    """
    nodes = list(current)
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError(f"node ids repeat in the current nodes: {sorted(ids)}")
    launch: list[LaunchRequest] = []
    remove: list[int] = []
    resize: list[ResizeRequest] = []
    seen: set[Role] = set()
    for role, count, resources in targets:
        if role in seen:
            raise ValueError(f"role {role.value} appears twice in the targets")
        seen.add(role)
        lr, rm, rs = _role_diff(nodes, role, count, resources)
        launch += lr
        remove += rm
        resize += rs
    return ScalePlan(launch=launch, remove=remove, resize=resize, reason=reason)
