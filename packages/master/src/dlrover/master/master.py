"""The job master: composes the lifecycle core, checkpoint tracker, journal, scheduler and metrics.

Every public method takes the master's lock, calls one core method, journals what changed, then
applies the effects (launch or stop nodes) and publishes events. A refused request raises the
core's error before anything changes. Time comes from the injected `Clock`; `tick()` is called
periodically by whoever hosts the master (see `MasterRuntime`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from dlrover.common import Clock, ConfigError
from dlrover.master.checkpoints import CheckpointTracker
from dlrover.master.config import MasterConfig
from dlrover.master.eventlog import EventLog, GoodputTracker, event_to_dict
from dlrover.master.journal import (
    Blob,
    CheckpointCommit,
    JournalBatch,
    JournaledEvent,
    StateJournal,
    job_fields,
)
from dlrover.master.lifecycle import JobLifecycle, LifecycleError
from dlrover.master.metrics import MasterMetrics
from dlrover.master.policy import DefaultFailurePolicy, FailureDecision, FailurePolicy
from dlrover.master.records import Action, Event, LaunchNode, NodeRecord, Outcome, StopNode
from dlrover.master.scheduler.base import NodeSpec, ObservedState, SchedulerBackend, SchedulerError
from dlrover.master.states import ALIVE_STATES, FailureKind, JobState, NodeState

__all__ = ["JobStatus", "Master", "ResourceSample", "StatefulCollaborator"]

_log = logging.getLogger(__name__)


@runtime_checkable
class StatefulCollaborator(Protocol):
    """A library whose state the master journals as an opaque JSON blob (rendezvous, shards).

    The master calls `export_state` on every tick and journals the blob when its version grew;
    on start it hands the last journaled blob to `import_state`.
    """

    @property
    def state_name(self) -> str:
        """The blob's name in the journal (unique per master)."""
        ...

    def export_state(self) -> tuple[int, str]:
        """The state's version (growing with each change) and its JSON text."""
        ...

    def import_state(self, version: int, data: str) -> None:
        """Resume from a journaled blob."""
        ...


@attrs.frozen
class ResourceSample:
    """A node's latest resource use, as its agent reported it."""

    cpu_percent: float = 0.0
    memory_bytes: int = 0
    gpu_percent: float = 0.0
    gpu_memory_bytes: int = 0


@attrs.frozen
class JobStatus:
    """A summary of the job for people and tools.

    Attributes:
        job_name: the job.
        state: the job's state.
        exit_reason: why it ended (empty while running).
        nodes: the current incarnation of every rank, by rank.
        min_nodes: fewest nodes it trains with.
        max_nodes: most nodes it runs.
        job_failures: failures so far.
        step: the newest step any current node reported (-1 before any).
        committed_step: the newest committed checkpoint step.
        goodput: useful training time over elapsed time so far.
        elapsed_s: seconds since the job started (wall clock).
        total_relaunches: nodes replaced so far.
        now: the master's monotonic time when the status was taken.
    """

    job_name: str
    state: JobState
    exit_reason: str
    nodes: tuple[NodeRecord, ...]
    min_nodes: int
    max_nodes: int
    job_failures: int
    step: int
    committed_step: int | None
    goodput: float
    elapsed_s: float
    total_relaunches: int
    now: float


class Master:
    """One job's master.

    Args:
        config: the master's configuration.
        scheduler: starts, stops and observes nodes.
        journal: where state survives a restart; restored from at construction.
        clock: the time source.
        policy: decides what to do about failures (the diagnosis package's policy plugs in here).
        checkpoints: checkpoint tracking; one restored from the journal's commits when None.
        collaborators: libraries whose state is journaled as blobs (rendezvous, shards).
        metrics: Prometheus metrics; a fresh registry when None.
        event_log: JSON-lines timeline; none when None.
        agent_env: environment handed to every launched agent (master address, token file).
    """

    def __init__(
        self,
        config: MasterConfig,
        scheduler: SchedulerBackend,
        journal: StateJournal,
        clock: Clock,
        *,
        policy: FailurePolicy | None = None,
        checkpoints: CheckpointTracker | None = None,
        collaborators: Sequence[StatefulCollaborator] = (),
        metrics: MasterMetrics | None = None,
        event_log: EventLog | None = None,
        agent_env: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self._config = config
        self._scheduler = scheduler
        self._journal = journal
        self._clock = clock
        self._lock = threading.RLock()
        self._metrics = metrics or MasterMetrics(config.job_name)
        self._event_log = event_log
        self._agent_env = agent_env
        self._collaborators = list(collaborators)
        self._resources: dict[int, ResourceSample] = {}
        self._observed: dict[int, ObservedState] = {}
        self._progress: tuple[float, int, int] | None = None  # (wall time, step, samples) of the last progress event
        self._goodput = GoodputTracker()
        self._event_count = 0
        restored = journal.load()
        self._check_same_job(restored.job)
        self._restored = restored.lifecycle is not None
        self._job_journaled = self._restored
        now = clock.now()
        self._lifecycle = JobLifecycle(config.lifecycle, policy or DefaultFailurePolicy(), now, restored.lifecycle)
        self._checkpoints = checkpoints or CheckpointTracker(restored.checkpoints)
        self._blob_versions: dict[str, int] = {}
        self._deferred: list[LaunchNode | StopNode] = []
        for collaborator in self._collaborators:
            blob = restored.blobs.get(collaborator.state_name)
            if blob is not None:
                collaborator.import_state(blob.version, blob.data)
                self._blob_versions[collaborator.state_name] = blob.version
        if restored.last_event_seq:
            for event in self._all_events():
                self._goodput.add(event_to_dict(event))
                self._event_count += 1
        if self._restored:
            self._record(Outcome(events=(Event("master_restart", "the master restarted and resumed the job"),)))

    def _identity(self) -> dict[str, Any]:
        """What must not change between a master and the one that resumes its job."""
        nodes = self._config.lifecycle.nodes
        return {
            "job_name": self._config.job_name,
            "min_nodes": nodes.min_nodes,
            "max_nodes": nodes.max_nodes,
            "node_unit": nodes.node_unit,
        }

    def _check_same_job(self, job: Mapping[str, Any] | None) -> None:
        if job is None or "job_identity" not in job:
            return
        stored, mine = dict(job["job_identity"]), self._identity()
        if stored != mine:
            changed = ", ".join(f"{k} {stored.get(k)!r} -> {v!r}" for k, v in mine.items() if stored.get(k) != v)
            raise ConfigError(
                f"the state directory holds another job ({changed}); use a new state directory or the same settings"
            )

    def _all_events(self) -> list[JournaledEvent]:
        events: list[JournaledEvent] = []
        after = 0
        while True:
            page = self._journal.events(after_seq=after, limit=10_000)
            if not page:
                return events
            events.extend(page)
            after = page[-1].seq

    # ---------------------------------------------------------------- plumbing

    @property
    def config(self) -> MasterConfig:
        """The configuration in force."""
        return self._config

    @property
    def metrics(self) -> MasterMetrics:
        """The master's metrics."""
        return self._metrics

    @property
    def restored(self) -> bool:
        """Whether the job was resumed from the journal."""
        return self._restored

    @property
    def job_state(self) -> JobState:
        """The job's state."""
        with self._lock:
            return self._lifecycle.job_state

    def _stamp(self, events: Iterable[Event]) -> tuple[JournaledEvent, ...]:
        wall = self._clock.wall_time()
        return tuple(JournaledEvent(0, wall, e.kind, e.message, e.node_id, e.rank, dict(e.data)) for e in events)

    def _record(
        self,
        outcome: Outcome,
        *,
        checkpoint: CheckpointCommit | None = None,
        blobs: Mapping[str, Blob] | None = None,
    ) -> None:
        """Journal what changed, then apply effects and publish events."""
        stamped = self._stamp(outcome.events)
        nodes = tuple(self._lifecycle.node(i) for i in sorted(outcome.changed_nodes))
        job = None
        if outcome.job_changed or not self._job_journaled:
            job = {**job_fields(self._lifecycle.snapshot()), "job_identity": self._identity()}
        batch = JournalBatch(nodes=nodes, job=job, events=stamped, checkpoint=checkpoint, blobs=blobs or {})
        seqs = self._journal.commit(batch)
        self._job_journaled = True
        journaled = tuple(attrs.evolve(e, seq=s) for e, s in zip(stamped, seqs, strict=False))
        for event in journaled:
            _log.info("%s", event.message)
            self._goodput.add(event_to_dict(event))
            self._event_count += 1
        if self._event_log is not None:
            self._event_log.write(journaled)
        self._metrics.observe_events(journaled)
        self._metrics.set_node_counts({s: self._lifecycle.count(s) for s in NodeState})
        for effect in outcome.effects:
            self._apply(effect)

    def _apply(self, effect: LaunchNode | StopNode) -> None:
        if isinstance(effect, StopNode):
            self._scheduler.stop(effect.node_id)
            return
        env = self._agent_env() if callable(self._agent_env) else dict(self._agent_env or {})
        spec = NodeSpec(
            job_name=self._config.job_name,
            node_id=effect.node_id,
            rank=effect.rank,
            relaunch_count=effect.relaunch_count,
            avoid_hosts=effect.avoid_hosts,
            env={
                **env,
                "DLROVER_JOB_NAME": self._config.job_name,
                "DLROVER_NODE_ID": str(effect.node_id),
                "DLROVER_NODE_RANK": str(effect.rank),
                "DLROVER_NODE_RELAUNCH_COUNT": str(effect.relaunch_count),
            },
        )
        try:
            self._scheduler.launch(spec)
        except SchedulerError as exc:
            # A launch that fails is a failure of that node: relaunch or give up within budgets.
            node = self._lifecycle.node(effect.node_id)
            if node.state in ALIVE_STATES and not self._lifecycle.job_state.finished:
                _decision, outcome = self._lifecycle.report_failure(
                    effect.node_id, FailureKind.NODE_EXIT, f"launch failed: {exc}", self._clock.now()
                )
                self._record(outcome)

    # ---------------------------------------------------------------- commands

    def prepare(self) -> None:
        """Create the job's nodes without launching them, so agents may register at once.

        Idempotent. The launches wait for `start()`: a launched agent needs the server's address,
        which exists only once the server runs, and the server must not run before there are
        nodes to register.
        """
        with self._lock:
            outcome = self._lifecycle.start(self._clock.now())
            self._deferred.extend(outcome.effects)
            self._record(attrs.evolve(outcome, effects=()))

    def start(self) -> None:
        """Create (if `prepare` did not) and launch the job's nodes; nothing to do for a resumed job."""
        with self._lock:
            self.prepare()
            deferred, self._deferred = self._deferred, []
            for effect in deferred:
                self._apply(effect)

    def register(self, node_id: int | None, name: str, host: str, *, proven_node_id: int | None = None) -> NodeRecord:
        """An agent registers; see `JobLifecycle.register`.

        Raises:
            LifecycleError: refused; nothing changed.
        """
        with self._lock:
            node, outcome = self._lifecycle.register(
                node_id, name, host, self._clock.now(), proven_node_id=proven_node_id
            )
            self._record(outcome)
            return node

    def heartbeat(
        self,
        node_id: int,
        *,
        step: int | None = None,
        samples: int | None = None,
        resources: ResourceSample | None = None,
    ) -> tuple[tuple[Action, ...], JobState]:
        """A node's heartbeat; returns the actions waiting for it and the job's state.

        Heartbeats are not journaled: liveness is re-established after a restart anyway.

        Raises:
            LifecycleError: refused; nothing changed.
        """
        with self._lock:
            actions, outcome = self._lifecycle.heartbeat(node_id, self._clock.now(), step=step, samples=samples)
            self._metrics.heartbeat()
            if outcome.changed_nodes:
                if resources is not None:
                    self._resources[node_id] = resources
                self._maybe_progress()
            return actions, self._lifecycle.job_state

    def _maybe_progress(self) -> None:
        # Cheap check first: this runs on every heartbeat, the scan below once per interval.
        wall = self._clock.wall_time()
        last = self._progress
        if last is not None and wall - last[0] < self._config.progress_event_interval_s:
            return
        current = [n for n in self._lifecycle.current_nodes().values() if n.state is NodeState.RUNNING]
        step = max((n.step for n in current), default=-1)
        if step < 0 or (last is not None and step <= last[1]):
            return
        samples = sum(n.samples for n in current)
        if last is not None and wall > last[0]:
            dt = wall - last[0]
            self._metrics.observe_progress(step, (step - last[1]) / dt, max(samples - last[2], 0) / dt)
        self._progress = (wall, step, samples)
        self._record(Outcome(events=(Event("progress", f"step {step}", data={"step": step, "samples": samples}),)))

    def report_failure(self, node_id: int, kind: FailureKind, evidence: str) -> FailureDecision:
        """A node failed; returns the decision as applied.

        Raises:
            LifecycleError: refused; nothing changed.
        """
        with self._lock:
            decision, outcome = self._lifecycle.report_failure(node_id, kind, evidence, self._clock.now())
            self._record(outcome)
            return decision

    def report_success(self, node_id: int) -> JobState:
        """A node's training finished successfully; returns the job's state.

        Raises:
            LifecycleError: refused; nothing changed.
        """
        with self._lock:
            self._record(self._lifecycle.report_success(node_id, self._clock.now()))
            return self._lifecycle.job_state

    def mark_host_unhealthy(self, host: str, reason: str) -> None:
        """Avoid `host` for future nodes (a failed health check)."""
        with self._lock:
            self._record(self._lifecycle.mark_host_unhealthy(host, reason))

    def report_checkpoint_steps(
        self, world_size: int, ranks: Mapping[int, Iterable[int]]
    ) -> tuple[int | None, int | None]:
        """Ranks report the steps they hold; returns (newest complete step, newest committed step).

        Raises:
            CheckpointError: refused; nothing changed.
        """
        with self._lock:
            report = self._checkpoints.report(world_size, ranks, self._clock.now())
            for _step, latency in report.newly_complete:
                self._metrics.observe_checkpoint_latency(latency)
            latest = self._checkpoints.latest_commit
            return report.complete_step, latest.step if latest else None

    def commit_checkpoint(self, step: int, path: str) -> CheckpointCommit:
        """Commit a step held by every rank; journaled before it returns.

        Raises:
            CheckpointError: refused; nothing changed.
        """
        with self._lock:
            self._checkpoints.check_commit(step)
            commit = self._checkpoints.commit(step, path, self._clock.wall_time())
            ev = Event("checkpoint", f"checkpoint step {step} committed", data={"step": step, "path": path})
            self._record(Outcome(events=(ev,)), checkpoint=commit)
            return commit

    def stop(self, reason: str) -> JobState:
        """Stop the job on request; returns the job's final state."""
        with self._lock:
            self._record(self._lifecycle.stop(reason, self._clock.now()))
            return self._lifecycle.job_state

    def tick(self) -> None:
        """Observe the scheduler, handle timeouts, journal collaborators, refresh metrics."""
        with self._lock:
            self._observe_scheduler()
            self._record(self._lifecycle.tick(self._clock.now()))
            self._journal_collaborators()
            self._metrics.set_goodput(self._goodput.goodput(self._clock.wall_time()).ratio)

    def _observe_scheduler(self) -> None:
        for node_id, seen in self._scheduler.observe().items():
            if self._observed.get(node_id) is seen.state:
                continue
            self._observed[node_id] = seen.state
            try:
                node = self._lifecycle.node(node_id)
            except LifecycleError:
                continue  # launched by a previous master incarnation and forgotten: not ours to judge
            if node.state not in ALIVE_STATES or self._lifecycle.job_state.finished:
                continue
            now = self._clock.now()
            if seen.state is ObservedState.RUNNING:
                self._record(self._lifecycle.node_started(node_id, now))
            elif seen.state is ObservedState.SUCCEEDED and node.state is NodeState.RUNNING:
                self._record(self._lifecycle.report_success(node_id, now))
            elif seen.state in (ObservedState.SUCCEEDED, ObservedState.FAILED, ObservedState.STOPPED):
                evidence = f"the agent exited with status {seen.exit_code} ({seen.state.value})"
                self._record(self._lifecycle.report_failure(node_id, FailureKind.NODE_EXIT, evidence, now)[1])

    def _journal_collaborators(self) -> None:
        blobs: dict[str, Blob] = {}
        for collaborator in self._collaborators:
            version, data = collaborator.export_state()
            if version > self._blob_versions.get(collaborator.state_name, -1):
                blobs[collaborator.state_name] = Blob(version, data)
        if blobs:
            self._record(Outcome(), blobs=blobs)
            for name, blob in blobs.items():
                self._blob_versions[name] = blob.version

    # ----------------------------------------------------------------- queries

    def node(self, node_id: int) -> NodeRecord:
        """One node.

        Raises:
            UnknownNodeError: no node has this id.
        """
        with self._lock:
            return self._lifecycle.node(node_id)

    def nodes(self) -> dict[int, NodeRecord]:
        """Every node incarnation by id."""
        with self._lock:
            return self._lifecycle.nodes()

    def resources(self, node_id: int) -> ResourceSample | None:
        """A node's latest resource sample."""
        with self._lock:
            return self._resources.get(node_id)

    def events(self, after_seq: int = 0, limit: int = 100) -> tuple[JournaledEvent, ...]:
        """The job's events after `after_seq`."""
        return self._journal.events(after_seq, limit)

    def status(self) -> JobStatus:
        """A summary of the job."""
        with self._lock:
            current = tuple(self._lifecycle.current_nodes().values())
            latest = self._checkpoints.latest_commit
            goodput = self._goodput.goodput(self._clock.wall_time())
            return JobStatus(
                job_name=self._config.job_name,
                state=self._lifecycle.job_state,
                exit_reason=self._lifecycle.exit_reason,
                nodes=current,
                min_nodes=self._config.lifecycle.nodes.min_nodes,
                max_nodes=self._config.lifecycle.nodes.max_nodes,
                job_failures=self._lifecycle.job_failures,
                step=max((n.step for n in current), default=-1),
                committed_step=latest.step if latest else None,
                goodput=goodput.ratio,
                elapsed_s=goodput.elapsed_s,
                total_relaunches=self._lifecycle.count(NodeState.RELAUNCHING),
                now=self._clock.now(),
            )

    def state_digest(self) -> str:
        """A fingerprint of everything a request could change (for tests: refused input changes nothing)."""
        with self._lock:
            snap = self._lifecycle.snapshot()
            data = {
                "job": job_fields(snap),
                "nodes": [attrs.asdict(n) for n in snap.nodes],
                "actions": {
                    i: [attrs.asdict(a) for a in self._lifecycle.pending_actions(i)]
                    for i in sorted(self._lifecycle.nodes())
                },
                "ckpt_world": self._checkpoints.world_size,
                "ckpt_complete": self._checkpoints.complete_step,
                "ckpt_held": {r: sorted(s) for r, s in self._checkpoints.held().items()},
                "commits": [attrs.asdict(c) for c in self._checkpoints.commits()],
                "events": self._event_count,
            }
            return json.dumps(data, sort_keys=True, default=str)
