"""Elastic sizing while the job runs: grow toward the planned size when there is room, shrink on preemption."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from dlrover.autoscale._validate import check_count, positive_int
from dlrover.autoscale.plan import LaunchRequest, NodeState, ScalePlan
from dlrover.autoscale.resources import Resources, Role
from dlrover.common import ConfigError

__all__ = ["ElasticConfig", "plan_toward_target"]


@attrs.frozen
class ElasticConfig:
    """Limits on each step toward the planned size.

    Args:
        max_launch_per_plan: the most workers one plan starts, so a large gap closes in bounded steps.
    """

    max_launch_per_plan: int = attrs.field(default=64, validator=positive_int)


def plan_toward_target(
    *,
    target_workers: int,
    worker_resources: Resources,
    alive: Sequence[NodeState],
    preempted: int,
    free_slots: int,
    min_workers: int,
    node_unit: int,
    config: ElasticConfig,
) -> ScalePlan:
    """Move the worker count toward `target_workers` in multiples of `node_unit`.

    With room in the cluster the job grows (replacing preempted workers first, since the room is the same); with
    more workers alive than planned it shrinks; when preemption left a count that is not a multiple of `node_unit`
    and there is no room to round it up, the extra workers are removed so the job can continue at the smaller size.

    Args:
        target_workers: the planned worker count (a multiple of node_unit, at least min_workers).
        worker_resources: the request of new workers.
        alive: the workers running or pending now (preempted ones excluded).
        preempted: how many workers were preempted since the last plan (for the reason).
        free_slots: how many more workers of `worker_resources` the cluster can start now.
        min_workers: below this the job cannot run.
        node_unit: the worker count must be a multiple of this.
        config: step limits.

    Returns:
        Launches or removals, or an empty plan with the reason.

    Raises:
        InvalidMetricError: if a count is negative or not an integer.
        ConfigError: if `target_workers` is not a multiple of `node_unit` or below `min_workers`.
    """
    for name, value, lo in (
        ("target_workers", target_workers, 1),
        ("preempted", preempted, 0),
        ("free_slots", free_slots, 0),
        ("min_workers", min_workers, 1),
        ("node_unit", node_unit, 1),
    ):
        check_count(name, value, minimum=lo)
    if target_workers % node_unit or target_workers < min_workers:
        raise ConfigError(
            f"target_workers={target_workers} must be a multiple of node_unit={node_unit} "
            f"and at least min_workers={min_workers}"
        )
    workers = sorted((n for n in alive if n.role == Role.WORKER), key=lambda n: n.node_id)
    if len(workers) != len(alive):
        raise ConfigError("alive must hold workers only")
    have = len(workers)
    target = target_workers
    lost = f"{preempted} worker(s) preempted; " if preempted else ""
    if have > target:
        drop = [n.node_id for n in workers[target:]]
        return ScalePlan(remove=drop, reason=f"{lost}{have} workers alive, planned {target}: removing {len(drop)}")
    room = min(free_slots, target - have, config.max_launch_per_plan)
    grow_to = (have + room) // node_unit * node_unit
    if grow_to > have:
        return ScalePlan(
            launch=[LaunchRequest(Role.WORKER, grow_to - have, worker_resources)],
            reason=f"{lost}{have} workers alive, planned {target}, room for {free_slots}: growing to {grow_to}",
        )
    aligned = have // node_unit * node_unit
    if aligned == have:
        why = "at the planned size" if have == target else f"no room to add node_unit={node_unit} worker(s)"
        return ScalePlan.empty(f"{lost}{have} workers alive, planned {target}: {why}")
    if aligned < min_workers:
        return ScalePlan.empty(
            f"{lost}{have} workers alive is not a multiple of node_unit={node_unit} and the aligned {aligned} is "
            f"below min_workers={min_workers}: waiting for capacity"
        )
    drop = [n.node_id for n in workers[aligned:]]
    return ScalePlan(
        remove=drop,
        reason=(
            f"{lost}{have} workers alive and no room to reach a multiple of node_unit={node_unit}: "
            f"shrinking to {aligned}"
        ),
    )
