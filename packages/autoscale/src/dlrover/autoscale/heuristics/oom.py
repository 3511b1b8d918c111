"""OOM: relaunch a node killed for memory with a larger request, within a step and a cap."""

from __future__ import annotations

import attrs

from dlrover.autoscale._validate import at_least_one, check_count, check_metric, non_negative_int, positive_int
from dlrover.autoscale.plan import NodeState, ResizeRequest, ScalePlan

__all__ = ["OomConfig", "OomEvent", "plan_oom_relaunch"]


@attrs.frozen
class OomConfig:
    """How memory grows after an out-of-memory kill.

    Args:
        growth_factor: the new request is the old one times this (>= 1)...
        max_step_mb: ...but grows by at most this many MiB per relaunch...
        min_step_mb: ...and by at least this many, so small requests do not creep up.
        cap_mb: and never beyond this (the per-node memory limit).
        max_relaunches: a node that has been OOM-relaunched this many times is not relaunched again.
    """

    growth_factor: float = attrs.field(default=1.5, validator=at_least_one)
    max_step_mb: int = attrs.field(default=32 * 1024, validator=positive_int)
    min_step_mb: int = attrs.field(default=1024, validator=non_negative_int)
    cap_mb: int = attrs.field(default=512 * 1024, validator=positive_int)
    max_relaunches: int = attrs.field(default=3, validator=non_negative_int)


@attrs.frozen
class OomEvent:
    """A node was killed for running out of memory.

    Args:
        node: the node as it was requested.
        previous_relaunches: how many OOM relaunches this node already had.
        peak_memory_mb: the peak memory it used before the kill, when known; the new request covers it.
    """

    node: NodeState
    previous_relaunches: int = 0
    peak_memory_mb: float | None = None

    def __attrs_post_init__(self) -> None:
        check_count("previous_relaunches", self.previous_relaunches)
        if self.peak_memory_mb is not None:
            check_metric("peak_memory_mb", self.peak_memory_mb)


def plan_oom_relaunch(event: OomEvent, config: OomConfig) -> ScalePlan:
    """The relaunch of an OOM-killed node with more memory, or an empty plan saying why there is none.

    Args:
        event: the kill.
        config: growth factor, per-step bounds, cap and relaunch budget.

    Returns:
        A plan resizing the node, or an empty plan whose reason says the cap or the budget is reached.
    """
    node = event.node
    old = node.resources.memory_mb
    who = f"{node.role.value} {node.node_id}"
    if event.previous_relaunches >= config.max_relaunches:
        return ScalePlan.empty(
            f"{who} ran out of memory again after {event.previous_relaunches} OOM relaunches "
            f"(max_relaunches={config.max_relaunches}); not relaunching"
        )
    if old >= config.cap_mb:
        return ScalePlan.empty(
            f"{who} ran out of memory at {old} MiB, already at the cap cap_mb={config.cap_mb}; not relaunching"
        )
    step = old * (config.growth_factor - 1)
    step = max(config.min_step_mb, min(config.max_step_mb, step))
    new = int(min(config.cap_mb, old + step))
    if event.peak_memory_mb is not None and event.peak_memory_mb > new:
        # Growing by one step would not cover what it already used: go straight to the peak (still capped).
        new = int(min(config.cap_mb, event.peak_memory_mb + config.min_step_mb))
    if new <= old:
        return ScalePlan.empty(f"{who} ran out of memory at {old} MiB and the configured growth adds nothing")
    resources = attrs.evolve(node.resources, memory_mb=new)
    capped = " (capped)" if new == config.cap_mb else ""
    return ScalePlan(
        resize=[ResizeRequest(node.node_id, node.role, resources)],
        reason=f"{who} ran out of memory at {old} MiB; relaunching with {new} MiB{capped}",
    )
