"""Nodes pending too long: ask for less, and when a node is already at the smallest request, shrink the job."""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from dlrover.autoscale._validate import check_count, check_metric, fraction, positive_int, positive_number
from dlrover.autoscale.plan import NodeState, ResizeRequest, ScalePlan
from dlrover.autoscale.resources import Resources, Role
from dlrover.common import ConfigError

__all__ = ["PendingConfig", "PendingNode", "plan_pending"]


@attrs.frozen
class PendingConfig:
    """When a pending node is overdue and how much smaller its next request is.

    Args:
        pending_timeout_s: a node pending longer than this is overdue.
        shrink_factor: an overdue node's CPU and memory are multiplied by this...
        min_request: ...but never go below this request.
        cpu_step: CPU requests are rounded down to multiples of this many cores.
        memory_step_mb: memory requests are rounded down to multiples of this many MiB.
    """

    pending_timeout_s: float = attrs.field(default=300.0, validator=positive_number)
    shrink_factor: float = attrs.field(default=0.75, validator=fraction)
    min_request: Resources = attrs.field(factory=lambda: Resources(cpu=1.0, memory_mb=1024))
    cpu_step: float = attrs.field(default=0.5, validator=positive_number)
    memory_step_mb: int = attrs.field(default=256, validator=positive_int)

    def smaller(self, r: Resources) -> Resources:
        """The next, smaller request for `r` (equal to `r` when it cannot shrink)."""
        cpu = max(
            min(self.min_request.cpu, r.cpu), math.floor(r.cpu * self.shrink_factor / self.cpu_step) * self.cpu_step
        )
        mem = max(
            min(self.min_request.memory_mb, r.memory_mb),
            (int(r.memory_mb * self.shrink_factor) // self.memory_step_mb) * self.memory_step_mb,
        )
        return attrs.evolve(r, cpu=cpu, memory_mb=mem)


@attrs.frozen
class PendingNode:
    """A node the scheduler has not been able to start.

    Raises:
        InvalidMetricError: if `pending_since_s` is NaN or negative.
    """

    node: NodeState
    pending_since_s: float

    def __attrs_post_init__(self) -> None:
        check_metric(f"node {self.node.node_id} pending_since_s", self.pending_since_s)


def plan_pending(
    *,
    now_s: float,
    pending: Sequence[PendingNode],
    running_workers: int,
    min_workers: int,
    node_unit: int,
    config: PendingConfig,
) -> ScalePlan:
    """Deal with nodes pending longer than `pending_timeout_s`.

    An overdue node that can ask for less is relaunched with a smaller request. Overdue workers already at the
    smallest request are removed, and with them as many more pending (then running) workers as it takes to keep the
    worker count a multiple of `node_unit`, as long as at least `min_workers` remain.

    Args:
        now_s: the current time on the clock `pending_since_s` uses.
        pending: every pending node (workers and PS).
        running_workers: how many workers are running.
        min_workers: the job's minimum worker count.
        node_unit: the worker count must stay a multiple of this.
        config: timeout and shrink policy.

    Returns:
        The resizes and removals, or an empty plan with the reason.
    """
    check_metric("now_s", now_s)
    check_count("running_workers", running_workers)
    check_count("min_workers", min_workers, minimum=1)
    check_count("node_unit", node_unit, minimum=1)
    ids = [p.node.node_id for p in pending]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"pending node ids repeat: {sorted(ids)}")
    overdue = [p for p in pending if now_s - p.pending_since_s > config.pending_timeout_s]
    if not overdue:
        return ScalePlan.empty(f"no node pending longer than pending_timeout_s={config.pending_timeout_s:g}")
    resize: list[ResizeRequest] = []
    stuck_workers: list[NodeState] = []
    reasons: list[str] = []
    for p in overdue:
        n = p.node
        smaller = config.smaller(n.resources)
        waited = now_s - p.pending_since_s
        if smaller != n.resources:
            resize.append(ResizeRequest(n.node_id, n.role, smaller))
            reasons.append(
                f"{n.role.value} {n.node_id} pending {waited:g}s: asking for {smaller.describe()} "
                f"instead of {n.resources.describe()}"
            )
        elif n.role == Role.WORKER:
            stuck_workers.append(n)
        else:
            reasons.append(
                f"{n.role.value} {n.node_id} pending {waited:g}s at the smallest request; a PS cannot be dropped"
            )
    remove: list[int] = []
    if stuck_workers:
        pending_workers = [p.node for p in pending if p.node.role == Role.WORKER]
        total = running_workers + len(pending_workers)
        keep = (total - len(stuck_workers)) // node_unit * node_unit
        stuck_ids = ", ".join(str(n.node_id) for n in stuck_workers)
        if keep < min_workers:
            reasons.append(
                f"worker(s) {stuck_ids} pending at the smallest request, but removing them would leave {keep} "
                f"worker(s) (node_unit={node_unit}), fewer than min_workers={min_workers}: waiting"
            )
        else:
            remove = [n.node_id for n in stuck_workers]
            stuck = set(remove)
            # Extra removals for node_unit alignment come from other pending workers first (newest first): they
            # have done no work yet.
            extra = total - len(stuck_workers) - keep
            others = sorted((n for n in pending_workers if n.node_id not in stuck), key=lambda n: -n.node_id)
            remove += [n.node_id for n in others[:extra]]
            short = extra - min(extra, len(others))
            reasons.append(
                f"worker(s) {stuck_ids} pending at the smallest request: shrinking the job to {keep} worker(s)"
                + (f", {short} of them running workers the scheduler should stop" if short else "")
            )
            if short:
                # Running node ids are not known here; the master picks which running workers to stop.
                reasons[-1] += " (not listed: running ids are the master's choice)"
    return ScalePlan(remove=remove, resize=resize, reason="; ".join(reasons))
