"""A TensorFlow parameter-server job's shape: its task groups, their addresses and each task's `TF_CONFIG`.

A PS job is a chief (which runs the user's script and its `ClusterCoordinator`), parameter servers and workers
(which run TensorFlow's standard server and take what the chief schedules), and optionally an evaluator (which
runs the user's script beside the cluster, not in it). Every task keeps its address for the whole job: TensorFlow's
coordinator reconnects to a relaunched worker or parameter server only at the address it knew.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from dlrover.autoscale import Resources, Role
from dlrover.common import ConfigError
from dlrover.common.validators import non_negative_int, positive_finite, positive_int

__all__ = ["PS_ROLES", "PsJobSpec", "TaskKey", "tf_config"]

PS_ROLES = (Role.CHIEF, Role.PS, Role.WORKER, Role.EVALUATOR)
"""The roles of a PS job, in the order their tasks start (servers before the chief that connects to them)."""

_START_ORDER = {Role.PS: 0, Role.WORKER: 1, Role.CHIEF: 2, Role.EVALUATOR: 3}


@attrs.frozen(order=False)
class TaskKey:
    """One task of the job: its role and its index within the role (stable across relaunches)."""

    role: Role
    index: int

    def __str__(self) -> str:
        return f"{self.role.value}:{self.index}"

    @property
    def start_order(self) -> tuple[int, int]:
        """Sort key: parameter servers, then workers, then the chief and the evaluator."""
        return (_START_ORDER[self.role], self.index)


def _optional_positive_finite(inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        positive_finite(inst, attribute, value)


def _resources_by_role(_inst: object, attribute: attrs.Attribute[object], value: object) -> None:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{attribute.name} must map roles to Resources, got {value!r}")
    for role, resources in value.items():
        if role not in PS_ROLES or not isinstance(resources, Resources):
            raise ConfigError(f"{attribute.name}: {role!r} -> {resources!r} is not a PS-job role and its Resources")


@attrs.frozen
class PsJobSpec:
    """What a PS job runs.

    Attributes:
        ps: parameter servers (at least one).
        workers: workers (at least one).
        min_workers: the job goes on while at least this many workers run (a worker that used up its relaunches
            is left out; TensorFlow's coordinator schedules on the others); fewer stops it.
        evaluator: whether to run an evaluator (the user's script with `TF_CONFIG` task type `evaluator`).
        resources: what each task of a role is launched with; a role not named asks for nothing in particular.
        max_relaunches: relaunches allowed per task (a chief restarted because a parameter server was lost is not
            charged: it did nothing wrong).
        oom_memory_growth: a task the kernel killed for memory comes back with its memory times this.
        max_task_memory_mb: the most memory an OOM relaunch may grow a task to; None: no cap.
        task_start_timeout_s: a task's node not running this long after its launch is stopped and relaunched
            (charged); None waits forever.

    Raises:
        ConfigError: a count below one, `min_workers` above `workers`, a growth below 1, a role's memory above
            `max_task_memory_mb`, a start timeout that is not positive.
    """

    ps: int = attrs.field(default=1, validator=positive_int)
    workers: int = attrs.field(default=1, validator=positive_int)
    min_workers: int = attrs.field(default=1, validator=positive_int)
    evaluator: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    resources: Mapping[Role, Resources] = attrs.field(factory=dict, validator=_resources_by_role)
    max_relaunches: int = attrs.field(default=3, validator=non_negative_int)
    oom_memory_growth: float = 1.5
    max_task_memory_mb: int | None = attrs.field(default=None, validator=attrs.validators.optional(positive_int))
    task_start_timeout_s: float | None = attrs.field(default=600.0, validator=_optional_positive_finite)

    def __attrs_post_init__(self) -> None:
        if self.min_workers > self.workers:
            raise ConfigError(f"min_workers ({self.min_workers}) must not exceed workers ({self.workers})")
        growth = self.oom_memory_growth
        if isinstance(growth, bool) or not isinstance(growth, (int, float)) or not 1 <= growth < float("inf"):
            raise ConfigError(f"oom_memory_growth must be a finite number >= 1, got {growth!r}")
        cap = self.max_task_memory_mb
        for role, resources in self.resources.items():
            if cap is not None and resources.memory_mb > cap:
                raise ConfigError(
                    f"{role.value} memory {resources.memory_mb} MiB exceeds max_task_memory_mb {cap}: the cap would "
                    "forbid the first launch"
                )

    def count(self, role: Role) -> int:
        """How many tasks of `role` the job runs."""
        return {Role.CHIEF: 1, Role.PS: self.ps, Role.WORKER: self.workers, Role.EVALUATOR: int(self.evaluator)}[role]

    def tasks(self) -> list[TaskKey]:
        """Every task, in start order."""
        keys = [TaskKey(role, i) for role in PS_ROLES for i in range(self.count(role))]
        return sorted(keys, key=lambda k: k.start_order)


def tf_config(cluster: Mapping[Role, Sequence[str]], task: TaskKey) -> str:
    """The `TF_CONFIG` of `task` in a cluster of `role -> addresses` (index order), as JSON text.

    The evaluator's addresses, if any, are left out of the cluster, as TensorFlow expects.

    Raises:
        ConfigError: the task's role has no address at its index (an evaluator needs none).
    """
    spec = {
        role.value: list(addresses) for role, addresses in cluster.items() if role is not Role.EVALUATOR and addresses
    }
    if task.role is not Role.EVALUATOR and not 0 <= task.index < len(cluster.get(task.role, ())):
        raise ConfigError(f"task {task} has no address in the cluster {spec}")
    return json.dumps({"cluster": spec, "task": {"type": task.role.value, "index": task.index}}, sort_keys=True)
