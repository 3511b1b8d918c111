"""Resize requests: the one way anything asks the lifecycle core to grow or shrink a running job.

A person's `dlrover-master scale`, the Python API, the autoscaler's plans and a scheduler
backend's changed capacity all become a `ResizeRequest`; the core (`JobLifecycle.resize`)
validates it, decides which nodes start or leave, and journals it like every other decision.

Pure: no I/O, no clock. `choose_leaving` is the shrink order, kept apart so it can be tested alone.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Iterable, Mapping

import attrs

from dlrover.common import DLRoverError
from dlrover.master.records import NodeRecord
from dlrover.master.states import NodeState

__all__ = [
    "RESIZE_EVENT",
    "RESIZE_TARGET_EVENT",
    "ResizeError",
    "ResizeRequest",
    "ResizeResult",
    "ResizeSource",
    "choose_leaving",
    "leaving_order_key",
]

RESIZE_EVENT = "resize"
"""The event of a resize that launches or removes nodes: a new round starts (goodput's ``resize``
window, the autoscaler's cool-down and the straggler statistics' reset follow it)."""

RESIZE_TARGET_EVENT = "resize_target"
"""The event of a resize that changes only the target or the wanted count (the backend has no
room for more, or the live nodes already match): no node launches or leaves, nothing restarts."""

_MAX_REASON_CHARS = 2000


class ResizeError(DLRoverError):
    """A resize request was refused (a count outside the group's range, a malformed request);
    nothing changed. The message names the value and what was allowed."""


class ResizeSource(enum.StrEnum):
    """Who asked for a resize."""

    SCALE = "scale"
    """A person or a program: `dlrover-master scale`, the JobService RPC, `Master.resize`."""
    CAPACITY = "capacity"
    """The scheduler backend's capacity changed: room appeared (grow back toward the wanted
    count) or was lost (give back what no longer fits, even below the minimum)."""
    AUTOSCALER = "autoscaler"
    """A plan of the autoscaler."""

    @property
    def sets_wanted(self) -> bool:
        """Whether the request says how many nodes the job should have (every source but the
        backend's capacity, which only says how many fit now)."""
        return self is not ResizeSource.CAPACITY


def _reason(value: str) -> str:
    text = str(value).strip()
    if not text:
        raise ResizeError("a resize request needs a reason")
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "...(truncated)"


def _source(value: ResizeSource | str) -> ResizeSource:
    try:
        return ResizeSource(value)
    except ValueError:
        known = ", ".join(s.value for s in ResizeSource)
        raise ResizeError(f"resize source must be one of {known}, got {value!r}") from None


def _non_negative_int(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResizeError(f"{attribute.name} must be a non-negative integer, got {value!r}")


@attrs.frozen
class ResizeRequest:
    """Ask the job to run `target` nodes.

    Attributes:
        target: the node count wanted. For every source but `CAPACITY` it must lie within the
            worker group's range (`LifecycleConfig.nodes`) and be a multiple of its node unit;
            the core refuses anything else and changes nothing.
        reason: why, in a sentence (kept in the event and the journal).
        source: who asks.
    """

    target: int = attrs.field(validator=_non_negative_int)
    reason: str = attrs.field(converter=_reason)
    source: ResizeSource = attrs.field(default=ResizeSource.SCALE, converter=_source)


@attrs.frozen
class ResizeResult:
    """What a resize request did.

    Attributes:
        wanted_nodes: the node count the job should have from now on.
        target_nodes: the count it is sized to now (fewer than wanted while the backend has no room).
        placeable: how many nodes the backend could hold when it was decided (None: no known limit).
        launched_ranks: ranks whose new nodes were launched (admitted at the next rendezvous round).
        leaving_nodes: nodes told to leave (stopped with the backend's grace to save).
        message: the sentence of the journaled ``resize`` event.
    """

    wanted_nodes: int
    target_nodes: int
    placeable: int | None = None
    launched_ranks: tuple[int, ...] = ()
    leaving_nodes: tuple[int, ...] = ()
    message: str = ""


def leaving_order_key(
    node: NodeRecord, avoid_hosts: Collection[str], pace_s: Mapping[int, float]
) -> tuple[int, int, float, int]:
    """Sort key of the shrink order: the first node by this key leaves first.

    1. nodes not yet running (pending or starting): nobody trains on them yet;
    2. nodes on avoided hosts (a failed health check or a hardware failure there);
    3. the slowest, by their recent pace (`pace_s`; nodes with no known pace after those with one);
    4. the highest rank, so the ranks that stay are the low, contiguous ones.
    """
    not_running = 0 if node.state is not NodeState.RUNNING else 1
    avoided = 0 if node.host and node.host in avoid_hosts else 1
    pace = pace_s.get(node.node_id)
    slowness = -pace if pace is not None and math.isfinite(pace) else math.inf
    return (not_running, avoided, slowness, -node.rank)


def choose_leaving(
    nodes: Iterable[NodeRecord], count: int, avoid_hosts: Collection[str], pace_s: Mapping[int, float]
) -> list[NodeRecord]:
    """The `count` nodes that leave a shrinking job, in the order of `leaving_order_key`.

    Args:
        nodes: the job's live nodes (the current incarnation of each rank).
        count: how many leave (at most all of them).
        avoid_hosts: hosts the job avoids.
        pace_s: recent seconds per step of each node's own work, by node id (its slowest rank's
            step time, or its lead time in a synchronous job: `StragglerWatch.node_paces`).
    """
    ordered = sorted(nodes, key=lambda n: leaving_order_key(n, avoid_hosts, pace_s))
    return ordered[: max(count, 0)]
