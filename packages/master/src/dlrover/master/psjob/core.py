"""The PS job's decisions: which task to launch, relaunch, restart or leave out, and when the job ends.

A pure core: it is given what the scheduler backend observes and returns what to do, with a reason for each
decision. What TensorFlow's parameter-server architecture needs of it:

- A worker that ends is relaunched at its address; the chief's `ClusterCoordinator` retries the steps it had on
  the others meanwhile and schedules on the worker again once it answers. A worker past its relaunches is left
  out while `min_workers` still run.
- A parameter server that ends takes its variables with it: the chief's coordinator fails. The server is
  relaunched at its address and the chief restarted (not charged: it did nothing wrong), which restores the
  variables from its newest checkpoint. The chief's old incarnation must have ended before the new one starts,
  since both would serve the chief's address.
- A chief that fails is relaunched (charged) and resumes from its newest checkpoint; a chief that succeeds ends
  the job, and every other task is stopped.
- A task the kernel killed for memory comes back with more (`PsJobSpec.oom_memory_growth`), up to the cap.
- A task the platform took away (eviction, preemption, a lost host) is relaunched without charging its budget.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.autoscale import Resources, Role
from dlrover.master.psjob.spec import PsJobSpec, TaskKey
from dlrover.master.scheduler.base import REASON_OOM_KILLED, ObservedNode, ObservedState

__all__ = ["JobOutcome", "Launch", "PsDecision", "PsEvent", "PsJobCore", "Stop", "TaskPhase"]

_ENDED = (ObservedState.SUCCEEDED, ObservedState.FAILED, ObservedState.STOPPED)


class TaskPhase(enum.StrEnum):
    """Where one task stands."""

    LAUNCHED = "launched"
    """Its current node was asked for and has not been seen running yet."""
    RUNNING = "running"
    WAITING = "waiting"
    """Between incarnations: the chief, waiting for its old incarnation to end before the new one starts."""
    SUCCEEDED = "succeeded"
    LEFT_OUT = "left_out"
    """Ended for good: out of relaunches, the job going on without it."""


@attrs.frozen
class Launch:
    """Start a node for a task."""

    task: TaskKey
    node_id: int
    relaunch_count: int
    resources: Resources | None


@attrs.frozen
class Stop:
    """Stop a node."""

    task: TaskKey
    node_id: int
    reason: str


@attrs.frozen
class PsEvent:
    """Something the job's event log should say."""

    kind: str
    message: str
    task: TaskKey | None = None
    node_id: int | None = None
    data: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class JobOutcome:
    """How the job ended."""

    succeeded: bool
    reason: str


@attrs.frozen
class PsDecision:
    """What to do after a look: stops first, then launches; the events say why."""

    launches: tuple[Launch, ...] = ()
    stops: tuple[Stop, ...] = ()
    events: tuple[PsEvent, ...] = ()
    outcome: JobOutcome | None = None


@attrs.define
class _Task:
    key: TaskKey
    resources: Resources | None
    node_id: int | None = None
    phase: TaskPhase = TaskPhase.LAUNCHED
    launches: int = 0
    charged: int = 0
    stopping: int | None = None  # a node of this task the core asked to stop, whose end is expected


class PsJobCore:
    """Decides the PS job's launches, relaunches and end from what its scheduler backend observes.

    Args:
        spec: the job's task groups, resources and budgets.

    Call `start()` once, then `observe()` with every look at the backend; carry out each decision's stops, then
    its launches.
    """

    def __init__(self, spec: PsJobSpec) -> None:
        self._spec = spec
        self._tasks = {key: _Task(key, spec.resources.get(key.role)) for key in spec.tasks()}
        self._next_node_id = 0
        self._started = False
        self._outcome: JobOutcome | None = None
        self._owner: dict[int, TaskKey] = {}

    @property
    def spec(self) -> PsJobSpec:
        """The job's shape."""
        return self._spec

    @property
    def outcome(self) -> JobOutcome | None:
        """How the job ended; None while it runs."""
        return self._outcome

    def phase(self, task: TaskKey) -> TaskPhase:
        """Where `task` stands."""
        return self._tasks[task].phase

    def node_of(self, task: TaskKey) -> int | None:
        """The task's current node (None before its first launch)."""
        return self._tasks[task].node_id

    def task_of(self, node_id: int) -> TaskKey | None:
        """The task a node was launched for; None for a node this core never launched."""
        return self._owner.get(node_id)

    def relaunches(self, task: TaskKey) -> tuple[int, int]:
        """(launches after the first, those charged to its budget)."""
        t = self._tasks[task]
        return max(t.launches - 1, 0), t.charged

    def start(self) -> PsDecision:
        """Launch every task, servers first.

        Raises:
            RuntimeError: called twice.
        """
        if self._started:
            raise RuntimeError("the PS job was started already")
        self._started = True
        launches = tuple(self._launch(self._tasks[key]) for key in self._spec.tasks())
        counts = {role.value: self._spec.count(role) for role in Role if self._spec.count(role)}
        event = PsEvent("job_started", f"PS job started: {counts}", data={"tasks": counts})
        return PsDecision(launches=launches, events=(event,))

    def observe(self, observed: Mapping[int, ObservedNode]) -> PsDecision:
        """Act on what the backend sees now; nodes it does not report are left as they were."""
        if not self._started or self._outcome is not None:
            return PsDecision()
        out = _Collector()
        for task in sorted(self._tasks.values(), key=lambda t: t.key.start_order):
            if task.stopping is not None:
                seen = observed.get(task.stopping)
                if seen is not None and seen.state in _ENDED:
                    task.stopping = None
                    if task.phase is TaskPhase.WAITING:
                        out.launches.append(self._launch(task))
                        out.event("task_restarted", f"{task.key} starts again as node {task.node_id}", task)
            if task.node_id is None or task.phase in (TaskPhase.WAITING, TaskPhase.SUCCEEDED, TaskPhase.LEFT_OUT):
                continue
            seen = observed.get(task.node_id)
            if seen is None:
                continue
            if seen.state is ObservedState.RUNNING and task.phase is TaskPhase.LAUNCHED:
                task.phase = TaskPhase.RUNNING
            elif seen.state in _ENDED:
                self._ended(task, seen, out)
            if self._finished():
                break
        return out.decision(self._outcome)

    # ------------------------------------------------------------------ decisions

    def _finished(self) -> bool:
        return self._outcome is not None

    def _ended(self, task: _Task, seen: ObservedNode, out: _Collector) -> None:
        key = task.key
        if key.role is Role.CHIEF and seen.state is ObservedState.SUCCEEDED:
            task.phase = TaskPhase.SUCCEEDED
            self._finish(True, f"the chief (node {seen.node_id}) finished the training", out)
            return
        how = _how_it_ended(seen)
        out.event("task_failed", f"{key} (node {seen.node_id}) {how}", task, exit_code=seen.exit_code,
                  reason=seen.reason, disruption=seen.disruption)  # fmt: skip
        comes_back, resources = self._next_resources(task, seen, out)
        if not comes_back:
            return
        charged = not seen.disruption
        if charged and task.charged >= self._spec.max_relaunches:
            self._out_of_relaunches(task, how, out)
            return
        task.charged += int(charged)
        task.resources = resources
        out.launches.append(self._launch(task))
        out.event("task_relaunched", f"{key} relaunched at its address as node {task.node_id}"
                  + ("" if charged else " (a disruption: not charged)"), task,
                  charged=task.charged, budget=self._spec.max_relaunches)  # fmt: skip
        if key.role is Role.PS:
            self._restart_chief(f"parameter server {key} was lost with its variables", out)

    def _next_resources(self, task: _Task, seen: ObservedNode, out: _Collector) -> tuple[bool, Resources | None]:
        """(whether there is a next incarnation, its resources): none after running out of memory at the cap."""
        if seen.reason != REASON_OOM_KILLED or task.resources is None:
            if seen.reason == REASON_OOM_KILLED:
                out.event("oom_no_limit", f"{task.key} was killed for memory but ran without a memory request: "
                          "it comes back as it was", task)  # fmt: skip
            return True, task.resources
        old = task.resources.memory_mb
        cap = self._spec.max_task_memory_mb
        grown = math.ceil(old * self._spec.oom_memory_growth)
        if cap is not None:
            grown = min(grown, cap)
        if grown <= old:
            self._finish(False, f"{task.key} ran out of memory at {old} MiB, the most it may have "
                         f"(max_task_memory_mb {cap})", out)  # fmt: skip
            return False, None
        out.event("oom_more_memory", f"{task.key} was killed for memory at {old} MiB: it comes back with {grown} MiB",
                  task, old_memory_mb=old, memory_mb=grown)  # fmt: skip
        return True, attrs.evolve(task.resources, memory_mb=grown)

    def _out_of_relaunches(self, task: _Task, how: str, out: _Collector) -> None:
        key = task.key
        budget = self._spec.max_relaunches
        if key.role is Role.WORKER:
            task.phase = TaskPhase.LEFT_OUT
            running = sum(
                1 for t in self._tasks.values() if t.key.role is Role.WORKER and t.phase is not TaskPhase.LEFT_OUT
            )
            if running >= self._spec.min_workers:
                out.event("task_left_out", f"{key} {how} after {budget} relaunches: the job goes on with {running} "
                          f"worker(s) (min_workers {self._spec.min_workers})", task)  # fmt: skip
                return
            self._finish(False, f"{key} {how} after {budget} relaunches, leaving {running} worker(s), fewer than "
                         f"min_workers {self._spec.min_workers}", out)  # fmt: skip
            return
        if key.role is Role.EVALUATOR:
            task.phase = TaskPhase.LEFT_OUT
            out.event("task_left_out", f"{key} {how} after {budget} relaunches: the job goes on without it", task)
            return
        self._finish(False, f"{key} {how} after {budget} relaunches", out)

    def _restart_chief(self, why: str, out: _Collector) -> None:
        chief = self._tasks[TaskKey(Role.CHIEF, 0)]
        if chief.phase is TaskPhase.WAITING or chief.node_id is None:
            return  # already restarting: one new incarnation restores everything
        out.stops.append(Stop(chief.key, chief.node_id, f"restart: {why}"))
        chief.stopping = chief.node_id
        chief.phase = TaskPhase.WAITING
        out.event("chief_restarting", f"the chief (node {chief.node_id}) restarts to restore the variables from "
                  f"its newest checkpoint: {why}", chief)  # fmt: skip

    def _finish(self, succeeded: bool, reason: str, out: _Collector) -> None:
        self._outcome = JobOutcome(succeeded, reason)
        for task in self._tasks.values():
            live = task.node_id is not None and task.phase in (TaskPhase.LAUNCHED, TaskPhase.RUNNING)
            if live and task.node_id is not None:
                out.stops.append(Stop(task.key, task.node_id, "the job ended"))
        out.event("job_succeeded" if succeeded else "job_failed", reason)

    def _launch(self, task: _Task) -> Launch:
        node_id = self._next_node_id
        self._next_node_id += 1
        task.node_id = node_id
        task.phase = TaskPhase.LAUNCHED
        task.launches += 1
        self._owner[node_id] = task.key
        return Launch(task.key, node_id, task.launches - 1, task.resources)


def _how_it_ended(seen: ObservedNode) -> str:
    if seen.state is ObservedState.SUCCEEDED:
        return "exited with status 0, which a server never does"
    if seen.state is ObservedState.STOPPED:
        return "was stopped by someone else"
    what = "failed" if seen.exit_code is None else (
        f"was killed by signal {-seen.exit_code}" if seen.exit_code < 0 else f"exited with status {seen.exit_code}"
    )  # fmt: skip
    return f"{what} ({seen.reason})" if seen.reason else what


class _Collector:
    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.stops: list[Stop] = []
        self.events: list[PsEvent] = []

    def event(self, kind: str, message: str, task: _Task | None = None, **data: Any) -> None:
        self.events.append(PsEvent(kind, message, task.key if task else None, task.node_id if task else None, data))

    def decision(self, outcome: JobOutcome | None) -> PsDecision:
        return PsDecision(tuple(self.launches), tuple(self.stops), tuple(self.events), outcome)
