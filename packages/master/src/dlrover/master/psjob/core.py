"""The PS job's decisions: which task to launch, relaunch, restart or leave out, and when the job ends.

A pure core: it is given what the scheduler backend observes, and the time, and returns what to do, with a reason
for each decision. What TensorFlow's parameter-server architecture needs of it:

- A worker that ends is relaunched at its address; the chief's `ClusterCoordinator` retries the steps it had on
  the others meanwhile and schedules on the worker again once it answers. A worker past its relaunches is left
  out while `min_workers` still run, and the cluster restarts without it (a planned restart, as when a parameter
  server is added): a chief started later with it still in `TF_CONFIG` would wait for it for good.
- A parameter server that ends takes its variables with it: the chief's coordinator fails. The server is
  relaunched at its address and the chief restarted (not charged: it did nothing wrong), which restores the
  variables from its newest checkpoint.
- A chief that fails is relaunched (charged) and resumes from its newest checkpoint; a chief that succeeds ends
  the job, and every other task is stopped. An evaluator that succeeds is done; one that fails is relaunched.
- A task the kernel killed for memory comes back with more (`PsJobSpec.oom_memory_growth`), up to the cap; one
  that ran out at the cap is out of relaunches.
- A task the platform took away (eviction, preemption, a lost host) is relaunched without charging its budget.
- A task whose node has not started within `PsJobSpec.task_start_timeout_s` is stopped and relaunched (charged).

A task's new node is launched only once its old one has ended (or is no longer reported): both would serve the
task's address.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.autoscale import Resources, Role
from dlrover.master.psjob.node import ADDRESS_IN_USE_EXIT_CODE
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
    """Between incarnations: waiting for the old node to end before the new one starts at the same address."""
    SUCCEEDED = "succeeded"
    LEFT_OUT = "left_out"
    """Ended for good: out of relaunches, the job going on without it."""
    HELD = "held"
    """Stopped for a planned restart of the whole cluster (a parameter server added, a worker left out); started
    again with it."""


@attrs.frozen
class Launch:
    """Start a node for a task."""

    task: TaskKey
    node_id: int
    relaunch_count: int
    resources: Resources | None


@attrs.frozen
class Stop:
    """Stop a node; `graceful`: give it its grace to save (SIGTERM first), else end it as soon as the backend
    can (nothing to save; the Kubernetes backend keeps a 1 s grace so the pod outlives its processes)."""

    task: TaskKey
    node_id: int
    reason: str
    graceful: bool = True


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
    launched_at: float = 0.0
    restart: bool = False  # WAITING for a restart the task did not cause (the chief after a lost PS)
    waiting_since: int = -1  # the look that put it into WAITING
    held_ended: bool = False  # HELD or LEFT_OUT, and its node has ended


class PsJobCore:
    """Decides the PS job's launches, relaunches and end from what its scheduler backend observes.

    Args:
        spec: the job's task groups, resources, budgets and start timeout.

    Call `start(now)` once, then `observe(observed, now)` with every look at the backend; carry out each
    decision's stops, then its launches. `now` is any monotonic time in seconds.
    """

    def __init__(self, spec: PsJobSpec) -> None:
        self._spec = spec
        self._tasks = {key: _Task(key, spec.resources.get(key.role)) for key in spec.tasks()}
        self._next_node_id = 0
        self._started = False
        self._outcome: JobOutcome | None = None
        self._owner: dict[int, TaskKey] = {}
        self._looks = 0
        self._resize_to: PsJobSpec | None = None  # a planned restart of the whole cluster, under way
        self._resize_reason = ""
        self._cluster_held = False  # the chief has ended for the resize and every other task is being stopped

    @property
    def spec(self) -> PsJobSpec:
        """The job's shape."""
        return self._spec

    @property
    def resizing(self) -> bool:
        """Whether a planned restart of the whole cluster (more parameter servers, fewer workers) is under way."""
        return self._resize_to is not None

    @property
    def outcome(self) -> JobOutcome | None:
        """How the job ended; None while it runs."""
        return self._outcome

    def phase(self, task: TaskKey) -> TaskPhase:
        """Where `task` stands."""
        return self._tasks[task].phase

    def node_of(self, task: TaskKey) -> int | None:
        """The task's newest node (None before its first launch)."""
        return self._tasks[task].node_id

    def task_of(self, node_id: int) -> TaskKey | None:
        """The task a node was launched as; None for a node this core never launched. (After a restart without a
        worker the others are numbered again: an old node's key is the one it had.)"""
        return self._owner.get(node_id)

    def relaunches(self, task: TaskKey) -> tuple[int, int]:
        """(launches after the first, those charged to its budget)."""
        t = self._tasks[task]
        return max(t.launches - 1, 0), t.charged

    def start(self, now: float, first_node_id: int = 0) -> PsDecision:
        """Launch every task, servers first, numbering nodes from `first_node_id` (above any node a previous
        master of the job launched: their names stay theirs while they end).

        Raises:
            RuntimeError: called twice.
            ValueError: `first_node_id` is negative.
        """
        if self._started:
            raise RuntimeError("the PS job was started already")
        if first_node_id < 0:
            raise ValueError(f"first_node_id must be non-negative, got {first_node_id}")
        self._started = True
        self._next_node_id = first_node_id
        launches = tuple(self._launch(self._tasks[key], now) for key in self._spec.tasks())
        counts = {role.value: self._spec.count(role) for role in Role if self._spec.count(role)}
        event = PsEvent("job_started", f"PS job started: {counts}", data={"tasks": counts})
        return PsDecision(launches=launches, events=(event,))

    def observe(self, observed: Mapping[int, ObservedNode], now: float) -> PsDecision:
        """Act on what the backend sees now.

        A task's node the backend does not report stays as it was (until its start timeout, if it never ran);
        an old node a task waits on that is no longer reported counts as ended.
        """
        if not self._started or self._outcome is not None:
            return PsDecision()
        self._looks += 1
        out = _Collector(now)
        for task in sorted(self._tasks.values(), key=lambda t: t.key.start_order):
            self._look_at(task, observed, now, out)
            if self._finished():
                break
        if not self._finished() and self._resize_to is not None:
            self._advance_resize(out)
        return out.decision(self._outcome)

    def add_ps(self, reason: str, now: float) -> PsDecision:
        """Plan a restart of the whole job with one more parameter server, for `reason`.

        The chief is stopped first (SIGTERM: a chief that handles it checkpoints at its next step and exits), then
        every other task; then all start again with the new cluster, and the chief restores its newest checkpoint,
        which TensorFlow re-partitions over the parameter servers it now has. Nothing is charged.

        Returns:
            The stop of the chief and an event; an event alone, saying why, when the job is not steady (a task
            starting or being replaced, a resize under way) or has ended.
        """
        if not self._started or self._outcome is not None:
            return PsDecision()
        out = _Collector(now)
        unsteady = [str(t.key) for t in self._tasks.values() if t.phase in (TaskPhase.LAUNCHED, TaskPhase.WAITING)]
        if self._resize_to is not None or unsteady:
            why = "a resize is under way" if self._resize_to is not None else f"{', '.join(unsteady)} not running"
            out.event("ps_add_deferred", f"adding a parameter server waits: {why} ({reason})")
            return out.decision(None)
        chief = self._tasks[TaskKey(Role.CHIEF, 0)]
        if chief.phase is not TaskPhase.RUNNING or chief.node_id is None:
            out.event("ps_add_deferred", f"adding a parameter server waits: the chief is {chief.phase.value}")
            return out.decision(None)
        self._resize_to = attrs.evolve(self._spec, ps=self._spec.ps + 1)
        self._resize_reason = reason
        self._cluster_held = False
        self._hold(chief, "planned restart with one more parameter server: checkpoint and exit", out)
        out.event("ps_adding", f"the job restarts with {self._spec.ps + 1} parameter servers: {reason}; the chief "
                  "stops first, so its newest checkpoint is the one restored", chief,
                  ps=self._spec.ps + 1)  # fmt: skip
        return out.decision(None)

    # ------------------------------------------------------------------ decisions

    def _finished(self) -> bool:
        return self._outcome is not None

    def _hold(self, task: _Task, why: str, out: _Collector) -> None:
        if task.node_id is not None:
            out.stops.append(Stop(task.key, task.node_id, why))
        task.phase = TaskPhase.HELD
        task.held_ended = task.node_id is None

    def _advance_resize(self, out: _Collector) -> None:
        """Stop the cluster once the chief has ended, and start it again, resized, once every node has ended (those
        of workers left out too: a worker that takes a left-out one's index takes its address)."""
        assert self._resize_to is not None
        chief = self._tasks[TaskKey(Role.CHIEF, 0)]
        if not self._cluster_held:
            if not chief.held_ended or out.launches:
                return  # a node launched in this look is held in the next, once the backend has it
            self._cluster_held = True
            for task in self._tasks.values():
                if task.phase in (TaskPhase.LAUNCHED, TaskPhase.RUNNING, TaskPhase.WAITING):
                    self._hold(task, f"planned restart: {self._resize_reason}", out)
        held = [t for t in self._tasks.values() if t.phase is TaskPhase.HELD]
        left_out = [t for t in self._tasks.values() if t.key.role is Role.WORKER and t.phase is TaskPhase.LEFT_OUT]
        if not all(t.held_ended for t in (*held, *left_out)):
            return
        before = self._spec
        self._spec, renumbered = self._without_left_out_workers(self._resize_to)
        self._resize_to = None
        for key in self._spec.tasks():
            if key not in self._tasks:
                self._tasks[key] = _Task(key, self._spec.resources.get(key.role))
                held.append(self._tasks[key])
        for task in sorted(held, key=lambda t: t.key.start_order):
            out.launches.append(self._launch(task, out.now))
        spec = self._spec
        if spec.ps != before.ps:
            out.event("ps_added", f"the job starts again with {spec.ps} parameter servers ({self._resize_reason}); "
                      "the chief restores its newest checkpoint over them", ps=spec.ps,
                      workers=spec.workers)  # fmt: skip
        else:
            out.event("cluster_restarted", f"the job starts again with {spec.workers} worker(s) "
                      f"({self._resize_reason}); the chief restores its newest checkpoint", ps=spec.ps,
                      workers=spec.workers, renumbered=renumbered)  # fmt: skip

    def _without_left_out_workers(self, target: PsJobSpec) -> tuple[PsJobSpec, dict[str, str]]:
        """`target` with only the workers not left out, numbered again from 0 in their order (their budgets kept),
        and which worker became which (those whose number changed); the left-out ones are forgotten."""
        workers = sorted((t for t in self._tasks.values() if t.key.role is Role.WORKER), key=lambda t: t.key.index)
        kept = [t for t in workers if t.phase is not TaskPhase.LEFT_OUT]
        for task in workers:
            del self._tasks[task.key]
        renumbered = {}
        for index, task in enumerate(kept):
            old, task.key = task.key, TaskKey(Role.WORKER, index)
            if old != task.key:
                renumbered[str(old)] = str(task.key)
            self._tasks[task.key] = task
        spec = attrs.evolve(target, workers=len(kept), min_workers=min(target.min_workers, len(kept)))
        return spec, renumbered

    def _restart_without(self, task: _Task, why: str, out: _Collector) -> None:
        """Plan a restart of the cluster without the worker just left out (unless one is under way: it leaves the
        worker out when it starts the cluster again)."""
        if self._resize_to is not None:
            out.event("cluster_restarting", f"the restart under way leaves {task.key} out of the cluster ({why})",
                      task)  # fmt: skip
            return
        self._resize_to = self._spec
        self._resize_reason = f"{task.key} left out"
        self._cluster_held = False
        chief = self._tasks[TaskKey(Role.CHIEF, 0)]
        if chief.phase is TaskPhase.WAITING:
            chief.phase = TaskPhase.HELD  # its old node is being stopped already; no new one starts
            chief.held_ended = False
            how = "the chief, restarting already, starts again with the cluster"
        else:
            self._hold(chief, "planned restart without a worker: checkpoint and exit", out)
            how = "the chief stops first, so its newest checkpoint is the one restored"
        out.event("cluster_restarting", f"the job restarts without {task.key} ({why}): a chief started with it in "
                  f"its cluster would wait for it; {how}", task)  # fmt: skip

    def _look_at(self, task: _Task, observed: Mapping[int, ObservedNode], now: float, out: _Collector) -> None:
        if task.node_id is None or task.phase is TaskPhase.SUCCEEDED:
            return
        seen = observed.get(task.node_id)
        if task.phase is TaskPhase.LEFT_OUT:
            task.held_ended = task.held_ended or seen is None or seen.state in _ENDED
            return
        if task.phase is TaskPhase.HELD:
            succeeded = seen is not None and seen.state is ObservedState.SUCCEEDED
            if succeeded and task.key.role is Role.CHIEF:
                task.phase = TaskPhase.SUCCEEDED  # it finished before the planned stop reached it
                self._finish(True, f"the chief (node {task.node_id}) finished the training", out)
            elif succeeded and task.key.role is Role.EVALUATOR:
                task.phase = TaskPhase.SUCCEEDED
                out.event("task_succeeded", f"{task.key} (node {task.node_id}) finished", task)
            elif seen is None or seen.state in _ENDED:
                task.held_ended = True
            return
        if task.phase is TaskPhase.WAITING:
            if task.key.role is Role.CHIEF and seen is not None and seen.state is ObservedState.SUCCEEDED:
                task.phase = TaskPhase.SUCCEEDED  # it finished before the restart reached it
                self._finish(True, f"the chief (node {seen.node_id}) finished the training", out)
                return
            if task.waiting_since == self._looks or (seen is not None and seen.state not in _ENDED):
                return  # told to stop in this very look, or still running
            old = task.node_id
            kind = "task_restarted" if task.restart else "task_relaunched"
            out.launches.append(self._launch(task, now))
            out.event(kind, f"{task.key} starts again at its address as node {task.node_id} (node {old} ended)",
                      task, charged=task.charged, budget=self._spec.max_relaunches)  # fmt: skip
            return
        if seen is not None and seen.state in _ENDED:
            self._ended(task, seen, out)
        elif seen is not None and seen.state is ObservedState.RUNNING:
            task.phase = TaskPhase.RUNNING
        elif task.phase is TaskPhase.LAUNCHED and self._start_timed_out(task, now):
            timeout = self._spec.task_start_timeout_s
            stuck = ObservedNode(task.node_id, ObservedState.PENDING, reason="StartTimeout")
            self._failed(task, stuck, f"did not start within {timeout:g} s", out, old_ended=False)

    def _start_timed_out(self, task: _Task, now: float) -> bool:
        timeout = self._spec.task_start_timeout_s
        return timeout is not None and now - task.launched_at > timeout

    def _ended(self, task: _Task, seen: ObservedNode, out: _Collector) -> None:
        key = task.key
        if seen.state is ObservedState.SUCCEEDED and key.role in (Role.CHIEF, Role.EVALUATOR):
            task.phase = TaskPhase.SUCCEEDED
            if key.role is Role.CHIEF:
                self._finish(True, f"the chief (node {seen.node_id}) finished the training", out)
            else:
                out.event("task_succeeded", f"{key} (node {seen.node_id}) finished", task)
            return
        self._failed(task, seen, _how_it_ended(seen), out, old_ended=True)

    def _failed(self, task: _Task, seen: ObservedNode, how: str, out: _Collector, *, old_ended: bool) -> None:
        key = task.key
        out.event("task_failed", f"{key} (node {seen.node_id}) {how}", task, exit_code=seen.exit_code,
                  reason=seen.reason, disruption=seen.disruption)  # fmt: skip
        if not old_ended:  # whatever comes next, the node that failed to start must go
            out.stops.append(Stop(key, seen.node_id, f"replaced: {how}", graceful=False))
        charged = not seen.disruption
        if charged and task.charged >= self._spec.max_relaunches:
            self._out_of_relaunches(task, f"{how} after {self._spec.max_relaunches} relaunches", out)
            return
        resources, why_not = self._next_resources(task, seen)
        if why_not:
            self._out_of_relaunches(task, f"{how}: {why_not}", out)
            return
        if resources is not task.resources and task.resources is not None and resources is not None:
            out.event("oom_more_memory", f"{key} was killed for memory at {task.resources.memory_mb} MiB: it comes "
                      f"back with {resources.memory_mb} MiB", task, old_memory_mb=task.resources.memory_mb,
                      memory_mb=resources.memory_mb)  # fmt: skip
        elif seen.reason == REASON_OOM_KILLED:
            out.event("oom_no_limit", f"{key} was killed for memory but ran without a memory request: it comes "
                      "back as it was", task)  # fmt: skip
        task.charged += int(charged)
        task.resources = resources
        if self._resize_to is not None and key.role is not Role.CHIEF:
            self._fail_into_restart(task, old_ended, out)
            return
        self._replace(task, old_ended, restart=False, out=out, note="" if charged else " (a disruption: not charged)")
        if key.role is Role.PS:
            self._restart_chief(f"parameter server {key} was lost with its variables", out)

    def _fail_into_restart(self, task: _Task, old_ended: bool, out: _Collector) -> None:
        """A task failed while the cluster restarts: it starts again with the cluster, not before. A lost parameter
        server leaves the chief nothing to checkpoint: a chief still stopping is killed rather than given its
        grace."""
        task.phase = TaskPhase.HELD
        task.held_ended = old_ended
        out.event("task_held", f"{task.key} starts again with the cluster (a planned restart is under way)", task)
        chief = self._tasks[TaskKey(Role.CHIEF, 0)]
        if task.key.role is Role.PS and chief.phase is TaskPhase.HELD and not chief.held_ended:
            assert chief.node_id is not None
            out.stops.append(Stop(chief.key, chief.node_id, f"{task.key} was lost: nothing left to checkpoint",
                                  graceful=False))  # fmt: skip

    def _next_resources(self, task: _Task, seen: ObservedNode) -> tuple[Resources | None, str]:
        """The next incarnation's resources, or why there is none (it ran out of memory at the cap)."""
        if seen.reason != REASON_OOM_KILLED or task.resources is None:
            return task.resources, ""
        old = task.resources.memory_mb
        cap = self._spec.max_task_memory_mb
        grown = math.ceil(old * self._spec.oom_memory_growth)
        if cap is not None:
            grown = min(grown, cap)
        if grown <= old:
            limit = (
                f"max_task_memory_mb {cap}" if cap is not None else f"oom_memory_growth {self._spec.oom_memory_growth}"
            )
            return None, f"it ran out of memory at {old} MiB, the most it may have ({limit})"
        return attrs.evolve(task.resources, memory_mb=grown), ""

    def _replace(self, task: _Task, old_ended: bool, *, restart: bool, out: _Collector, note: str = "") -> None:
        """Start the task's next node: now if its old node ended, else once it has (stopping it)."""
        old = task.node_id
        task.restart = restart
        if restart and old is not None:
            # Its parameter server is gone with the variables: nothing left to checkpoint, no grace to wait out.
            out.stops.append(Stop(task.key, old, "restart", graceful=False))
        task.phase = TaskPhase.WAITING
        task.waiting_since = self._looks
        if old_ended:
            out.launches.append(self._launch(task, out.now))
            kind = "task_restarted" if restart else "task_relaunched"
            out.event(kind, f"{task.key} starts again at its address as node {task.node_id}{note}", task,
                      charged=task.charged, budget=self._spec.max_relaunches)  # fmt: skip

    def _out_of_relaunches(self, task: _Task, why: str, out: _Collector) -> None:
        key = task.key
        if key.role is Role.WORKER:
            task.phase = TaskPhase.LEFT_OUT
            running = sum(
                1 for t in self._tasks.values() if t.key.role is Role.WORKER and t.phase is not TaskPhase.LEFT_OUT
            )
            if running >= self._spec.min_workers:
                out.event("task_left_out", f"{key} {why}: the job goes on with {running} worker(s) (min_workers "
                          f"{self._spec.min_workers})", task)  # fmt: skip
                # Its node may still be stopping (it never started in time): a successor at its address waits.
                task.held_ended = not any(stop.node_id == task.node_id for stop in out.stops)
                self._restart_without(task, why, out)
                return
            self._finish(False, f"{key} {why}, leaving {running} worker(s), fewer than min_workers "
                         f"{self._spec.min_workers}", out)  # fmt: skip
            return
        if key.role is Role.EVALUATOR:
            task.phase = TaskPhase.LEFT_OUT
            out.event("task_left_out", f"{key} {why}: the job goes on without it", task)
            return
        self._finish(False, f"{key} {why}", out)

    def _restart_chief(self, why: str, out: _Collector) -> None:
        if self._resize_to is not None:
            return  # the chief is stopping anyway, and starts again after the resize, restoring everything
        chief = self._tasks[TaskKey(Role.CHIEF, 0)]
        if chief.phase is not TaskPhase.LAUNCHED and chief.phase is not TaskPhase.RUNNING:
            return  # already on its way to a new incarnation, which restores everything
        out.event("chief_restarting", f"the chief (node {chief.node_id}) restarts to restore the variables from "
                  f"its newest checkpoint: {why}", chief)  # fmt: skip
        self._replace(chief, False, restart=True, out=out)

    def _finish(self, succeeded: bool, reason: str, out: _Collector) -> None:
        self._outcome = JobOutcome(succeeded, reason)
        never_started = {launch.node_id for launch in out.launches}
        out.launches.clear()  # nothing starts after the end
        stopping = {stop.node_id for stop in out.stops}
        for task in self._tasks.values():
            node = task.node_id
            if node is None or node in never_started or node in stopping:
                continue
            if task.phase in (TaskPhase.LAUNCHED, TaskPhase.RUNNING, TaskPhase.WAITING, TaskPhase.HELD):
                out.stops.append(Stop(task.key, node, "the job ended"))
        out.event("job_succeeded" if succeeded else "job_failed", reason)

    def _launch(self, task: _Task, now: float) -> Launch:
        node_id = self._next_node_id
        self._next_node_id += 1
        task.node_id = node_id
        task.phase = TaskPhase.LAUNCHED
        task.launches += 1
        task.launched_at = now
        task.restart = False
        self._owner[node_id] = task.key
        return Launch(task.key, node_id, task.launches - 1, task.resources)


def _how_it_ended(seen: ObservedNode) -> str:
    if seen.state is ObservedState.SUCCEEDED:
        return "exited with status 0, which a server never does"
    if seen.state is ObservedState.STOPPED:
        return "was stopped by someone else"
    if seen.exit_code is None:
        what = "failed"
    elif seen.exit_code < 0:
        what = f"was killed by signal {-seen.exit_code}"
    elif seen.exit_code == ADDRESS_IN_USE_EXIT_CODE:
        what = f"exited with status {seen.exit_code}: it could not listen at its address (another process has it)"
    else:
        what = f"exited with status {seen.exit_code}"
    return f"{what} ({seen.reason})" if seen.reason else what


class _Collector:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.launches: list[Launch] = []
        self.stops: list[Stop] = []
        self.events: list[PsEvent] = []

    def event(self, kind: str, message: str, task: _Task | None = None, **data: Any) -> None:
        self.events.append(PsEvent(kind, message, task.key if task else None, task.node_id if task else None, data))

    def decision(self, outcome: JobOutcome | None) -> PsDecision:
        return PsDecision(tuple(self.launches), tuple(self.stops), tuple(self.events), outcome)
