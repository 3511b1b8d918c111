"""The job master: composes the lifecycle core, checkpoint tracker, journal, scheduler and metrics.

Every public method takes the master's lock, calls one core method, journals what changed, then
applies the effects (launch or stop nodes) and publishes events. A refused request raises the
core's error before anything changes. A change the journal cannot take (a full disk, a locked
database) is rolled back before the `JournalError` reaches the caller: memory never runs ahead of
the journal, and no effect or event of that change is emitted, so the same request succeeds
once the journal works again. Time comes from the injected `Clock`; `tick()` is called
periodically by whoever hosts the master (see `MasterRuntime`).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs

from dlrover.common import Clock, ConfigError, DLRoverError
from dlrover.diagnosis import (
    KINDS_NOT_FROM_DATA,
    LOST_NODE_KIND,
    MEMORY_RECORD,
    OOM_RECORD_KIND,
    PEER_CONSEQUENCE_KINDS,
    SLOW_NODE_KIND,
    Decision,
    FailureKind,
    PeerExcuse,
    RankStepStats,
    StragglerConfig,
)
from dlrover.master.autoscaler import AutoscaleDecision, AutoscaleMode, Autoscaler, JobView
from dlrover.master.checkpoints import CheckpointTracker
from dlrover.master.config import LifecycleConfig, MasterConfig
from dlrover.master.eventlog import EventLog, event_to_dict
from dlrover.master.goodput import (
    MAX_MARKS_PER_REPORT,
    STEPS_EVENT,
    AttemptReport,
    GoodputAccountant,
    GoodputBreakdown,
    SampleRate,
)
from dlrover.master.identity import registration_digest
from dlrover.master.journal import (
    Blob,
    ChangeLine,
    CheckpointCommit,
    JournalBatch,
    JournaledEvent,
    JournalError,
    JournalState,
    StateJournal,
    job_fields,
)
from dlrover.master.launch_retry import LaunchRetries
from dlrover.master.lifecycle import JobLifecycle, LifecycleError
from dlrover.master.metrics import MasterMetrics
from dlrover.master.oom_evidence import OOM_EVIDENCE_BLOB, OomEvidenceLedger
from dlrover.master.peer_excuses import PeerExcuses
from dlrover.master.policy import ClassifyingPolicy, DefaultFailurePolicy, FailurePolicy
from dlrover.master.profiles import ProfileRecorder, ThroughputBySize, build_run_profile
from dlrover.master.records import Action, Event, LaunchNode, NodeRecord, Outcome, ResourceSample, StopNode
from dlrover.master.resize import (
    RESIZE_EVENT,
    RESIZE_TARGET_EVENT,
    ResizeError,
    ResizeRequest,
    ResizeResult,
    ResizeSource,
)
from dlrover.master.scheduler.base import (
    REASON_NODE_LOST,
    REASON_OOM_KILLED,
    AdjustableCapacity,
    AdoptsNodes,
    NodeMemoryRecords,
    NodePlacement,
    NodeRejectedError,
    NodeShapeLimit,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerBackend,
    SchedulerError,
    SingleHost,
)
from dlrover.master.states import ALIVE_STATES, JobState, NodeState
from dlrover.master.stragglers import StragglerFinding, StragglerWatch

__all__ = [
    "JobStatus",
    "LoggedCollaborator",
    "Master",
    "NodeMembership",
    "ResourceSample",
    "PlannedRoundAware",
    "RoundWitness",
    "SpareAware",
    "StateChanges",
    "StatefulCollaborator",
]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

_GONE_STATES = frozenset({NodeState.FAILED, NodeState.RELAUNCHING, NodeState.REMOVED})

# Events after which the job trains at another pace for a while: the autoscaler measures none of that time.
_DISRUPTIONS = frozenset(
    {
        "job_start",
        "master_restart",
        "resize",
        "failure",
        "process_restart",
        "planned_restart",
        "consequence_restart",
        "relaunch",
        "oom_relaunch",
        "node_created",
        "node_state",
        "node_reconnect",
    }
)
AUTOSCALE_EVENT = "autoscale_plan"
LAUNCH_RETRY_EVENT = "launch_retry"


def _capped_by_backend(config: LifecycleConfig, scheduler: SchedulerBackend) -> LifecycleConfig:
    """`config` with its OOM memory cap lowered to the largest node the backend can ever place."""
    if not isinstance(scheduler, NodeShapeLimit):
        return config
    largest = scheduler.largest_node().memory_mb
    cap = config.max_node_memory_mb
    if largest < 1 or (cap is not None and cap <= largest):
        return config
    memory = config.node_resources.memory_mb if config.node_resources is not None else 0
    if memory > largest:
        return config  # refused at start (`check_node_fits`), with the value named
    return attrs.evolve(config, max_node_memory_mb=largest)


@runtime_checkable
class StatefulCollaborator(Protocol):
    """A library whose state the master journals as an opaque JSON blob (rendezvous, shards).

    The master calls `export_state` every `state_export_interval_s` (from its tick), after node
    departures, at shutdown, and whenever the library asks (`Master.journal_collaborator`), and
    journals the blob when its version grew; on start it hands the last journaled blob to
    `import_state`. `export_state` may take the library's own lock.
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
class StateChanges:
    """What a log-structured collaborator hands the journal: a new blob of its whole state, the
    change lines it made (numbered; a blob of version v holds the lines up to v), or both."""

    blob: Blob | None = None
    lines: tuple[ChangeLine, ...] = ()


@runtime_checkable
class LoggedCollaborator(Protocol):
    """A library whose state the master journals as a blob plus the change lines made after it (the
    shard service, whose whole state grows with the workers while each change is small).

    The master calls `export_changes` when a `StatefulCollaborator` would be exported, journals what
    is newer than what it journaled (a blob only when newer than the stored one), then tells the
    library with `changes_journaled`; on start it hands the stored blob and the lines after it to
    `import_changes`. Lines are journaled in one transaction each time, in order; a library decides
    itself when a new blob is due (a blob drops the lines it holds).
    """

    @property
    def state_name(self) -> str:
        """The blob's name in the journal (unique per master)."""
        ...

    def export_changes(self) -> StateChanges:
        """A new blob if one is due, and every change line not yet acknowledged, oldest first."""
        ...

    def changes_journaled(self, through: int, blob: Blob | None) -> None:
        """Every line numbered up to `through` is durable; `blob`, when given, was written with them."""
        ...

    def import_changes(self, blob: Blob, lines: Sequence[ChangeLine]) -> None:
        """Resume from the stored blob and the lines after it."""
        ...


@runtime_checkable
class NodeMembership(Protocol):
    """A library told by the master when nodes leave the job, so it lets go of them (rendezvous, shards).

    Called under the master's lock: an implementation may take its own lock, but must never wait
    for the master's. Exceptions are logged with their traceback and do not stop the master.
    """

    def node_departed(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        """The node failed or was removed: it is gone for good (a replacement comes with a new id).

        `data_suspect`: False when the cause cannot be the samples its processes trained (a
        preemption, a lost host, a network fault, a planned removal: `KINDS_NOT_FROM_DATA`).
        """
        ...

    def processes_restarted(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        """The node's training processes are being restarted; the node stays (`data_suspect`: as above)."""
        ...

    def node_finished(self, node_id: int, reason: str) -> None:
        """The node's training processes succeeded: it stops calling, and its peers may still train."""
        ...

    def job_finished(self, reason: str) -> None:
        """The job ended."""
        ...


@runtime_checkable
class PlannedRoundAware(Protocol):
    """A library told which nodes the next round is planned for (the rendezvous: it forms that
    round as soon as all of them joined, and waits for a slow one; `RendezvousManager.expect_round`).

    Called under the master's lock, on every ``planned_round`` event: a resize let nodes go or
    gave spares a rank, or a spare takes a failed node's rank. It may take its own lock, never the
    master's. Exceptions are logged and do not stop the master.
    """

    def round_planned(self, node_ids: frozenset[int], reason: str) -> None:
        """The next round is for exactly `node_ids` (each of them restarts for it, or joins it)."""
        ...


@runtime_checkable
class RoundWitness(Protocol):
    """A library that knows which rounds of training are over (the rendezvous), asked when a node
    reports a failure: a collective error or hang of workers whose round is already over is most
    likely the consequence of what ended it (a peer left, was lost, or restarted), and no budget
    is spent on it (`JobLifecycle.report_failure`'s `left_behind`).

    Called under the master's lock; it may take its own lock, never the master's.
    """

    def round_broken(self, node_id: int, reason: str) -> None:
        """The node's processes restart for a cause of their own (a failure of another kind than a
        collective error or hang, or a planned round): its peers' collectives break."""
        ...

    def left_behind(self, node_id: int) -> str | None:
        """Why the node's workers still run in a round that is over, or None."""
        ...


@runtime_checkable
class SpareAware(Protocol):
    """A library told which nodes are the job's warm spares (the rendezvous: it admits none of them).

    Called under the master's lock with the whole set whenever it changes (a spare created, lost,
    released, or promoted to a rank), and once at start (a restarted master's spares included),
    so an implementation simply holds the last set it was given. It may take its own lock, never
    the master's. Exceptions are logged and do not stop the master.
    """

    def spares_changed(self, node_ids: frozenset[int]) -> None:
        """From now on exactly `node_ids` are spares."""
        ...


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
        breakdown: useful time and the rest by bucket (see `dlrover.master.goodput`).
        samples_per_second: the job's samples per second over `samples_rate_window_s`.
        committed_path: where the newest committed checkpoint is ("" without one).
        committed_wall_time: when it was committed (wall seconds; 0 without one).
        target_nodes: how many nodes the job is sized to now (see `Master.resize`).
        wanted_nodes: how many nodes the last resize asked for (`max_nodes` until one does).
        capacity: how many more nodes the backend could place now (None: unknown or unbounded;
            negative: it holds that many more than it has room for).
        spares: the warm spares that are pending, starting or running (they hold no rank).
        spare_nodes: how many spares the job keeps (`LifecycleConfig.spare_nodes`).
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
    breakdown: GoodputBreakdown = attrs.field(factory=lambda: GoodputAccountant().breakdown())
    samples_per_second: float = 0.0
    committed_path: str = ""
    committed_wall_time: float = 0.0
    target_nodes: int = 0
    wanted_nodes: int = 0
    capacity: int | None = None
    spares: tuple[NodeRecord, ...] = ()
    spare_nodes: int = 0


def _holds_pending_work(job: Mapping[str, Any] | None) -> bool:
    """Whether a journaled job record holds the nodes' pending work, as schema 1 wrote it: the
    master's first write then replaces it (with the work in rows of their own)."""
    return job is not None and ("pending_actions" in job or "planned_round" in job)


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
        membership: libraries told when nodes depart, restart their processes, or the job ends.
        profile_recorder: records the job's profile when it ends (`dlrover.master.profiles`); None records none.
    """

    # The spare set the libraries were last given: none, as a library starts (a restarted master's
    # spares differ from it, so they are told again).
    _told_spares: frozenset[int] = frozenset()
    # A heartbeat brought a step newer than the last progress event's since the last scan for progress.
    _new_step = False

    def __init__(
        self,
        config: MasterConfig,
        scheduler: SchedulerBackend,
        journal: StateJournal,
        clock: Clock,
        *,
        policy: FailurePolicy | None = None,
        checkpoints: CheckpointTracker | None = None,
        collaborators: Sequence[StatefulCollaborator | LoggedCollaborator] = (),
        metrics: MasterMetrics | None = None,
        event_log: EventLog | None = None,
        agent_env: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
        membership: Sequence[NodeMembership] = (),
        profile_recorder: ProfileRecorder | None = None,
    ) -> None:
        self._config = config
        self._profile_recorder = profile_recorder
        self._profile_recorded = False
        self._plan_announced = False
        self._throughput = ThroughputBySize()
        self._peak_memory: dict[int, int] = {}  # per node: the most host memory its agent reported, bytes
        self._peak_gpu_memory: dict[int, int] = {}
        self._scheduler = scheduler
        self._journal = journal
        self._clock = clock
        self._lock = threading.RLock()
        self._metrics = metrics or MasterMetrics(config.job_name)
        self._event_log = event_log
        self._agent_env = agent_env
        self._collaborators = list(collaborators)
        self._membership = list(membership)
        self._last_export: float | None = None
        self._resources: dict[int, ResourceSample] = {}
        self._observed: dict[int, ObservedState] = {}
        self._progress: tuple[float, int, int] | None = None  # (wall time, step, samples) of the last progress event
        self._goodput = GoodputAccountant()
        self._metrics.read_goodput_from(self._goodput_now)
        self._samples = SampleRate(config.samples_rate_window_s)
        # Attempt reports accounted but not yet journaled (a `steps` event), and when the last went.
        self._unjournaled_steps: list[AttemptReport] = []
        self._steps_journaled_at: float | None = None
        self._event_count = 0
        self._excuses = PeerExcuses(stale_after_s=config.lifecycle.heartbeat_timeout_s)
        self._stragglers = StragglerWatch(
            StragglerConfig(
                k=config.straggler_factor,
                window_steps=config.straggler_window,
                min_samples=config.straggler_min_samples,
            ),
            stale_after_s=config.lifecycle.heartbeat_timeout_s,  # a silent node's ranks
            # Every node's stats come once an interval; half of one leaves room for heartbeats that come early.
            check_every_s=config.heartbeat_interval_s / 2,
        )
        restored = journal.load()
        self._check_same_job(restored.job)
        self._restored = restored.lifecycle is not None
        self._job_journaled = self._restored and not _holds_pending_work(restored.job)
        now = clock.now()
        self._policy = policy or DefaultFailurePolicy()
        auto = config.autoscale
        self._autoscaler = Autoscaler(auto, now) if auto.mode is not AutoscaleMode.OFF else None
        self._oom_evidence = OomEvidenceLedger.from_blob(restored.blobs.get(OOM_EVIDENCE_BLOB))
        self._memory_announced = False
        self._lifecycle = JobLifecycle(
            _capped_by_backend(config.lifecycle, scheduler),
            self._policy,
            now,
            restored.lifecycle,
            scheduler_relaunches=scheduler.relaunches_nodes,
            single_host=scheduler.host if isinstance(scheduler, SingleHost) else None,
            wall_offset=clock.wall_time() - now,
        )
        self._checkpoints = checkpoints or CheckpointTracker(restored.checkpoints)
        self._blob_versions: dict[str, int] = {OOM_EVIDENCE_BLOB: self._oom_evidence.version}
        self._lines_journaled: dict[str, int] = {}  # per logged collaborator: its newest durable line
        self._deferred: list[LaunchNode | StopNode] = []
        self._launch_retries = LaunchRetries(config.launch_retry)
        self._take_over(restored)

    def _take_over(self, restored: JournalState) -> None:
        """Hand the collaborators their journaled state and, for a resumed job, catch up with it."""
        self._import_collaborators(restored.blobs, restored.changes)
        if self._restored and self._membership:
            self._reconcile_membership()
        if restored.last_event_seq:
            self._replay_events()
        if self._restored:
            self._resumed()

    def _import_collaborators(self, blobs: Mapping[str, Blob], changes: Mapping[str, Sequence[ChangeLine]]) -> None:
        """Hand each collaborator the state the journal holds for it.

        Raises:
            JournalError: change lines without the blob they follow.
        """
        for collaborator in self._collaborators:
            name = collaborator.state_name
            blob = blobs.get(name)
            if isinstance(collaborator, LoggedCollaborator):
                lines = changes.get(name, ())
                if blob is None:
                    if lines:
                        raise JournalError(f"the journal holds {len(lines)} change line(s) of {name!r} but no blob")
                    continue
                collaborator.import_changes(blob, lines)
                self._blob_versions[name] = blob.version
                self._lines_journaled[name] = max([blob.version, *(line.seq for line in lines)])
            elif blob is not None:
                collaborator.import_state(blob.version, blob.data)
                self._blob_versions[name] = blob.version

    def _resumed(self) -> None:
        """Journal the restart, and tell a backend that adopts nodes which ones the journal holds alive: it
        reports, at the first tick, one whose pod vanished while no master watched, relaunched at once as a
        disruption rather than after a heartbeat or start timeout charged to the job."""
        self._record(Outcome(events=(Event("master_restart", "the master restarted and resumed the job"),)))
        if isinstance(self._scheduler, AdoptsNodes):
            alive = [n.node_id for n in self._lifecycle.nodes().values() if n.state in ALIVE_STATES]
            self._scheduler.adopt(alive)

    def _replay_events(self) -> None:
        """Account for the journaled events again, as a restarted master: goodput, samples, and the
        autoscaler's measurements and the counts it gave back (so it does not flap)."""
        retrying: dict[int, str] = {}  # the nodes the previous master was to launch again, and why
        for event in self._all_events():
            self._account(event_to_dict(event), replay=True)
            if self._autoscaler is not None and event.kind == AUTOSCALE_EVENT:
                self._autoscaler.replay(event.data)
            if event.kind == LAUNCH_RETRY_EVENT and event.node_id is not None:
                retrying[event.node_id] = str(event.data.get("error", ""))
            self._event_count += 1
        self._resume_launch_retries(retrying)

    def _resume_launch_retries(self, retrying: Mapping[int, str]) -> None:
        """Take over the launch retries of the previous master: a node still pending whose launch it was
        to send again gets a fresh schedule (unless the backend turns out to have it, see `_retry_launches`)."""
        now = self._clock.now()
        nodes = self._lifecycle.nodes()
        for node_id, error in sorted(retrying.items()):
            if node_id not in nodes or nodes[node_id].state is not NodeState.PENDING:
                continue  # launched, decided or gone since
            self._launch_retries.resume(node_id, now, error)
            _log.info("node %d: its launch waited when the master restarted (%s); sent again", node_id, error)

    @staticmethod
    def _departure_data_suspect(node: NodeRecord) -> bool:
        """Whether the samples the gone node's processes trained may have caused its departure: it
        failed (a node removed without failing left as planned) and its record keeps its failure
        suspect (`NodeRecord.failure_data_suspect`)."""
        return node.failure_data_suspect and any(t.to_state is NodeState.FAILED for t in node.history)

    def _reconcile_membership(self) -> None:
        """Tell the libraries again which nodes are gone, finished or spares and whether the job ended.

        The previous master may have died after journaling a departure or a success and before
        journaling the libraries' reaction to it; repeating the news is harmless (leaving or
        finishing twice is a no-op). Each piece of news is delivered on its own, so one a library
        cannot take does not keep the others from it.
        """
        nodes = self._lifecycle.nodes().values()
        news: list[Callable[[NodeMembership], None]] = [
            # Told again as it was decided: a library that took the news already holds nothing of the node
            # (nothing is charged twice), one the previous master died before telling charges it now.
            functools.partial(
                _departed,
                n.node_id,
                "it left the job before the master restarted",
                data_suspect=self._departure_data_suspect(n),
            )
            for n in nodes
            if n.state in _GONE_STATES
        ]
        news += [
            functools.partial(_finished, n.node_id, "it finished before the master restarted")
            for n in nodes
            if n.state is NodeState.SUCCEEDED
        ]
        if self._lifecycle.job_state.finished:
            news.append(functools.partial(_job_finished, self._lifecycle.exit_reason))
        for member in self._membership:
            for call in news:
                try:
                    call(member)
                except Exception:
                    _log.exception("%s could not catch up after a restart", type(member).__name__)
        self._sync_spares()  # and which nodes are spares

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
        changes: Mapping[str, Sequence[ChangeLine]] | None = None,
    ) -> None:
        """Journal what changed, then apply effects and publish events (the core is already changed)."""
        journaled = self._journal_outcome(outcome, checkpoint=checkpoint, blobs=blobs, changes=changes)
        self._publish(outcome, journaled)

    def _transact(self, change: Callable[[], tuple[_T, Outcome]], *, blobs: Mapping[str, Blob] | None = None) -> _T:
        """Run one core change and journal it (with `blobs` in the same transaction); if either
        fails, the core goes back to where it was.

        Called under the lock. Effects and events are published only once the change is journaled.

        Raises:
            JournalError: the journal refused the change; nothing changed.
            LifecycleError: the core refused it; nothing changed.
        """
        savepoint = self._lifecycle.savepoint()
        try:
            result, outcome = change()
            journaled = self._journal_outcome(outcome, blobs=blobs)
        except BaseException:
            self._lifecycle.rollback(savepoint)
            raise
        self._publish(outcome, journaled)
        return result

    def _journal_outcome(
        self,
        outcome: Outcome,
        *,
        checkpoint: CheckpointCommit | None = None,
        blobs: Mapping[str, Blob] | None = None,
        changes: Mapping[str, Sequence[ChangeLine]] | None = None,
    ) -> tuple[JournaledEvent, ...]:
        """Write what changed in one journal transaction; returns the events as numbered."""
        stamped = self._stamp(outcome.events)
        nodes = tuple(self._lifecycle.node(i) for i in sorted(outcome.changed_nodes))
        job = None
        if outcome.job_changed or not self._job_journaled:
            job = {**job_fields(self._lifecycle.snapshot(with_nodes=False)), "job_identity": self._identity()}
        # The first write of a master stores every node's pending work: a journal of schema 1
        # kept it in the job record, which that write replaces.
        work = self._lifecycle.changed_work(every=not self._job_journaled)
        batch = JournalBatch(
            nodes=nodes,
            job=job,
            events=stamped,
            checkpoint=checkpoint,
            blobs=blobs or {},
            work=work,
            changes=changes or {},
        )
        seqs = self._journal.commit(batch)
        self._job_journaled = True
        self._lifecycle.work_journaled()
        return tuple(attrs.evolve(e, seq=s) for e, s in zip(stamped, seqs, strict=False))

    def _publish(self, outcome: Outcome, journaled: tuple[JournaledEvent, ...]) -> None:
        """Publish a journaled change: log, metrics, effects, and the libraries' part."""
        for event in journaled:
            if event.kind != STEPS_EVENT:
                _log.info("%s", event.message)
            if self._autoscaler is not None and event.kind in _DISRUPTIONS:
                self._autoscaler.disrupted(self._clock.now(), resized=event.kind == "resize")
            if event.kind == "resize":
                # Every worker restarts for the new round: step times from before would make the
                # first slow steps of a joining node look like a straggler.
                self._stragglers.forget_all()
            self._account(event_to_dict(event), replay=False)
            self._event_count += 1
        if self._event_log is not None:
            self._event_log.write(journaled)
        self._metrics.observe_events(journaled)
        self._metrics.set_node_counts(self._lifecycle.counts())
        for effect in outcome.effects:
            self._apply(effect)
        departed = bool(self._membership) and self._notify_membership(outcome.events)
        # After the departures: a spare promoted into a failed node's rank joins the round that
        # the departure dissolved.
        if self._sync_spares() or departed:
            # A departure changed the rendezvous and shards: journal that now, not a cadence later.
            try:
                self._journal_collaborators()
            except JournalError:
                # The departure itself is journaled (a restarted master repeats it to the
                # libraries); their new state follows with the next export.
                _log.exception("could not journal the rendezvous and shards after a departure; the next export will")

    def _account(self, event: Mapping[str, Any], *, replay: bool) -> None:
        """Feed the goodput accounting; a live `steps` event was accounted when it arrived."""
        if event["kind"] == STEPS_EVENT and not replay:
            return
        try:
            self._goodput.add_event(event)
        except DLRoverError as exc:
            _log.warning("event %s left out of the goodput accounting: %s", event.get("seq"), exc)

    def _journal_steps(self, *, force: bool = False) -> None:
        """Journal the attempt reports accounted since the last `steps` event, at most once per
        `progress_event_interval_s` (and whenever `force`): a master restart replays them."""
        if not self._unjournaled_steps:
            return
        wall = self._clock.wall_time()
        last = self._steps_journaled_at
        if not force and last is not None and wall - last < self._config.progress_event_interval_s:
            return
        merged = _merge_reports(self._unjournaled_steps)
        marks = sum(len(r.marks) for r in merged)
        data = {"attempts": [r.to_dict() for r in merged]}
        try:
            self._record(Outcome(events=(Event(STEPS_EVENT, f"{marks} step mark(s)", data=data),)))
        except JournalError:
            # An observation: kept and journaled with the next one.
            _log.warning("could not journal %d step mark(s); retried later", marks, exc_info=True)
            return
        self._unjournaled_steps = []
        self._steps_journaled_at = wall

    def _notify_membership(self, events: Iterable[Event]) -> bool:
        """Tell the libraries about departures, successes, process restarts and the job's end; True if any."""
        notified = False
        events = list(events)
        for ev in events:
            if ev.kind == "node_state" and ev.node_id is not None:
                left = NodeState(ev.data["from"]) in ALIVE_STATES
                call: Callable[[NodeMembership], None]
                if left and ev.data["to"] == NodeState.SUCCEEDED.value:
                    call = functools.partial(_finished, ev.node_id, ev.message)
                elif left and ev.data["to"] in (NodeState.FAILED.value, NodeState.REMOVED.value):
                    # A removal is planned (a shrink, a stop): never the data's doing. A failure's suspicion
                    # is the one its record keeps, which a restarted master tells again (one decision).
                    suspect = ev.data["to"] == NodeState.FAILED.value and self._departure_data_suspect(
                        self._lifecycle.node(ev.node_id)
                    )
                    call = functools.partial(_departed, ev.node_id, ev.message, data_suspect=suspect)
                else:
                    continue
            elif ev.kind in ("process_restart", "planned_restart", "consequence_restart") and ev.node_id is not None:
                # A planned round's restart kills the node's workers as surely as a failure's, and a
                # consequence restart follows a peer's failure: neither is the data's doing.
                suspect = ev.kind == "process_restart" and _kind_of(ev) not in KINDS_NOT_FROM_DATA
                call = functools.partial(
                    _restarted, ev.node_id, ev.message, breaks_round=_breaks_round(ev), data_suspect=suspect
                )
            elif ev.kind == "planned_round":
                call = functools.partial(_round_planned, frozenset(ev.data["nodes"]), ev.message)
            elif ev.kind == "job_end":
                call = functools.partial(_job_finished, ev.message)
            else:
                continue
            notified = True
            for member in self._membership:
                try:
                    call(member)
                except Exception:
                    # One library's bug must not stop the master deciding; it is logged in full.
                    _log.exception("%s could not handle: %s", type(member).__name__, ev.message)
        return notified

    def _sync_spares(self) -> bool:
        """Tell the libraries the spare set when it changed; True if one was told."""
        spares = frozenset(n.node_id for n in self._lifecycle.spare_nodes())
        if spares == self._told_spares:
            return False
        told, failed = False, False
        for member in self._membership:
            if not isinstance(member, SpareAware):
                continue
            told = True
            try:
                member.spares_changed(spares)
            except Exception:
                failed = True  # told again at the next sync, not only when the set changes
                _log.exception("%s could not take the spare nodes %s", type(member).__name__, sorted(spares))
        if not failed:
            self._told_spares = spares
        return told

    def _apply(self, effect: LaunchNode | StopNode, *, retry: bool = False) -> None:
        """Carry an effect out; a launch (not a `retry`) waits for its retry unsent while a launch failed
        moments ago (`LaunchRetries.backend_away`)."""
        if isinstance(effect, StopNode):
            self._launch_retries.forget(effect.node_id)
            self._scheduler.stop(effect.node_id)
            return
        if self._lifecycle.job_state.finished:
            return  # a launch deferred or queued before the job ended (a node the platform refused stopped it)
        away = None if retry else self._launch_retries.backend_away(self._clock.now())
        if away is not None:
            if self._lifecycle.node(effect.node_id).state in ALIVE_STATES:
                wait = self._launch_retries.hold_back(effect.node_id, self._clock.now(), away)
                self._announce_launch_retry(effect, away, 0, wait)
            return
        env = self._agent_env() if callable(self._agent_env) else dict(self._agent_env or {})
        spec = NodeSpec(
            job_name=self._config.job_name,
            node_id=effect.node_id,
            rank=effect.rank,
            relaunch_count=effect.relaunch_count,
            avoid_hosts=effect.avoid_hosts,
            role=effect.role,
            resources=effect.resources,
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
        except NodeRejectedError as exc:
            # The platform refuses the node's specification itself: every relaunch would be refused alike.
            reason = f"node {effect.node_id} cannot be started: {exc}"
            try:
                self._transact(
                    lambda: self._just(self._lifecycle.stop(reason, self._clock.now(), state=JobState.FAILED))
                )
            except JournalError:
                _log.exception("%s; the job's end could not be journaled", reason)
            return
        except SchedulerError as exc:
            self._launch_failed(effect, str(exc))
            return
        self._launch_retries.launched(effect.node_id)
        if isinstance(self._scheduler, StatefulCollaborator):
            # Which process serves the node must survive a restart of the master (re-adoption).
            try:
                self._journal_collaborator_locked(self._scheduler)
            except JournalError:
                _log.exception("node %d launched, but its process could not be journaled yet", effect.node_id)

    def _launch_failed(self, launch: LaunchNode, error: str) -> None:
        """A launch the backend failed for a passing reason: tried again with backoff; only a launch that
        keeps failing is a failure of that node (relaunch or give up within budgets)."""
        node = self._lifecycle.node(launch.node_id)
        if node.state not in ALIVE_STATES or self._lifecycle.job_state.finished:
            self._launch_retries.forget(launch.node_id)
            return
        launches = self._launch_retries.failures(launch.node_id) + 1
        delay = self._launch_retries.failed(launch.node_id, self._clock.now(), error)
        if delay is not None:
            self._announce_launch_retry(launch, error, launches, delay)
            return
        evidence = f"launch failed: {error}" if launches == 1 else f"launch failed {launches} times, last: {error}"
        try:
            self._transact(lambda: self._lifecycle.node_lost(launch.node_id, evidence, self._clock.now()))
        except JournalError:
            # The change that launched it is journaled; this failure is not. The node
            # stays pending, and its start timeout (or the next master) handles it.
            _log.exception("node %d: %s; the failure could not be journaled", launch.node_id, evidence)

    def _announce_launch_retry(self, launch: LaunchNode, error: str, launches: int, delay: float) -> None:
        """Say (log and journal) that a launch waits: `launches` failed so far (0: held back unsent)."""
        retries = self._config.launch_retry.retries
        who = f"node {launch.node_id} (rank {launch.rank})"
        if launches:
            message = (
                f"{who} could not be launched ({error}); launching it again in {delay:.1f} s (retry {launches} of "
                f"{retries}); it stays pending and counts against no budget until the retries are spent"
            )
            _log.warning("%s", message)
        else:
            message = f"{who} is not launched yet ({error}); it is sent in {delay:.1f} s, no retry spent"
            _log.info("%s", message)
        data = {"launches": launches, "retries": retries, "delay_s": delay, "error": str(error)}
        try:
            event = Event(LAUNCH_RETRY_EVENT, message, node_id=launch.node_id, rank=launch.rank, data=data)
            self._record(Outcome(events=(event,)))
        except JournalError:
            _log.warning("could not journal the launch retry of node %d", launch.node_id, exc_info=True)

    def _retry_launches(self, now: float) -> None:
        """Launch again the nodes whose backoff after a failed launch is over (still pending, job running),
        as they would be launched now (the hosts avoided since). After a launch that fails again, the others
        wait for the next tick: each may spend the backend's own retries under the master's lock."""
        for node_id in self._launch_retries.due(now):
            node = self._lifecycle.node(node_id)
            if node.state is not NodeState.PENDING or self._lifecycle.job_state.finished or node_id in self._observed:
                # Decided meanwhile (timed out, stopped, job over), or the backend has it after all (a create
                # that went through although its answer was an error): nothing to send again.
                self._launch_retries.forget(node_id)
                continue
            self._apply(self._lifecycle.launch_of(node_id), retry=True)
            if node_id in self._launch_retries or self._lifecycle.node(node_id).state is not NodeState.PENDING:
                break  # failed again: the backend is still away

    # ---------------------------------------------------------------- commands

    def prepare(self) -> None:
        """Create the job's nodes without launching them, so agents may register at once.

        Idempotent. The launches wait for `start()`: a launched agent needs the server's address,
        which exists only once the server runs, and the server must not run before there are
        nodes to register.
        """
        with self._lock:
            self._announce_initial_plan()
            outcome = self._transact(lambda: self._deferred_start(self._clock.now()))
            self._deferred.extend(outcome.effects)

    def _announce_memory_limits(self) -> None:
        scheduler = self._scheduler
        if self._memory_announced or not isinstance(scheduler, NodeMemoryRecords):
            return
        resources = self._lifecycle.config.node_resources
        asked = resources.memory_mb if resources is not None else 0
        sentence = scheduler.memory_enforcement
        if not scheduler.enforces_memory:
            _log.warning("%s", sentence)
            if asked:
                sentence += f"; the {asked} MiB asked per node is recorded but not enforced"
        data = {"enforced": scheduler.enforces_memory, "node_memory_mb": asked or None}
        self._record(Outcome(events=(Event("memory_limits", sentence, data=data),)))
        self._memory_announced = True  # once journaled: a start that failed to journal it says it again

    def _announce_initial_plan(self) -> None:
        """Say once where the job's node counts and resources came from (an `initial_plan` event)."""
        choice = self._config.initial_plan
        if choice is None or self._restored or self._plan_announced:
            return
        if choice.store_notice:
            _log.warning("job profile store: %s", choice.store_notice)
            notice = Event(
                "profile_store", f"job profile store: {choice.store_notice}", data={"path": self._config.profile_store}
            )
            self._record(Outcome(events=(notice,)))
        self._record(Outcome(events=(Event("initial_plan", f"initial plan: {choice.reason}", data=choice.to_data()),)))
        self._plan_announced = True

    def _record_profile(self) -> None:
        """Record the ended job's profile once (under the lock); a failure is logged and an event, never raised."""
        recorder = self._profile_recorder
        if recorder is None or self._profile_recorded:
            return
        self._profile_recorded = True
        wall = self._clock.wall_time()
        latest = self._checkpoints.latest_commit
        try:
            profile = build_run_profile(
                self._config,
                outcome=self._lifecycle.job_state.value,
                exit_reason=self._lifecycle.exit_reason,
                launched=[n.resources for n in self._lifecycle.nodes().values()],
                final_nodes=self._lifecycle.target_nodes,
                throughput=self._throughput.rates(),
                peak_memory_bytes=self._peak_memory,
                peak_gpu_memory_bytes=self._peak_gpu_memory,
                checkpoint_path=latest.path if latest is not None and latest.path else None,
                wall_time=wall,
            )
            pid, message = recorder.record(profile, wall)
        except Exception as exc:  # a profile is a courtesy to later jobs: it never fails this one
            _log.exception("the job's profile could not be recorded")
            pid, message, profile = None, f"the job's profile was not recorded: {exc!r}", None
        if pid is None:
            _log.warning("%s", message)
        data: dict[str, Any] = {"path": recorder.path, "profile_id": pid}
        if profile is not None:
            data.update(json.loads(profile.to_json()))
        try:
            self._record(Outcome(events=(Event("profile", message, data=data),)))
        except JournalError:
            _log.warning("could not journal the profile event: %s", message, exc_info=True)

    def _memory_evidence(self, node_id: int) -> tuple[str, int]:
        """A `MEMORY_RECORD` line when the node's memory cgroup counted OOM kills not yet turned into evidence
        (the kernel's own record, which the diagnosis rule `host-memory-record` reads), else empty; and the
        count to mark as used (`_used_memory_evidence`) once the failure carrying it is journaled."""
        scheduler = self._scheduler
        if not isinstance(scheduler, NodeMemoryRecords):
            return "", 0
        record = scheduler.memory_record(node_id)
        if record is None or not record.oom_kills:
            return "", 0
        with self._lock:
            before = self._oom_evidence.seen(node_id)
        if record.oom_kills <= before:
            return "", 0
        line = (
            f"{MEMORY_RECORD}: the node's memory cgroup counted oom_kill {before} -> {record.oom_kills} "
            f"(limit {record.limit_mb} MiB, {record.source}): the kernel's OOM killer ended a process of this node"
        )
        return line, record.oom_kills

    @staticmethod
    def _platform_oom_evidence(observed: ObservedNode) -> tuple[str, int]:
        """A `MEMORY_RECORD` line when the platform says the node's container was OOM-killed (Kubernetes'
        `OOMKilled`: the kernel's OOM killer ended it at its memory limit), so the node is decided as host
        OOM and relaunched with more memory, as for the local backend's cgroup record; else empty."""
        if observed.reason != REASON_OOM_KILLED:
            return "", 0
        line = (
            f"{MEMORY_RECORD}: the platform reports the node's container {REASON_OOM_KILLED} (exit code "
            f"{observed.exit_code}): the kernel's OOM killer ended it at its memory limit"
        )
        return line, 0

    def _memory_evidence_used(self, node_id: int, kills: int) -> tuple[OomEvidenceLedger, dict[str, Blob]]:
        """The ledger once the failure holding the node's OOM count up to `kills` is journaled, and
        the blob to journal with that failure (none when nothing new is used): later failures need
        newer kills, also after a master restart. Called under the lock."""
        ledger = self._oom_evidence.using(node_id, kills)
        return ledger, {} if ledger is self._oom_evidence else {OOM_EVIDENCE_BLOB: ledger.to_blob()}

    def _adopt_memory_evidence(self, ledger: OomEvidenceLedger, blobs: Mapping[str, Blob]) -> None:
        """The failure and its ledger are journaled: the ledger is the master's. Called under the lock."""
        self._oom_evidence = ledger
        for name, blob in blobs.items():
            self._blob_versions[name] = blob.version

    def _deferred_start(self, now: float) -> tuple[Outcome, Outcome]:
        initial = None
        if self._autoscaler is not None and self._autoscaler.config.mode is AutoscaleMode.ON:
            # The autoscaler grows the job from its minimum while the measured speed-up pays.
            nodes = self._config.lifecycle.nodes
            initial = -(-nodes.min_nodes // nodes.node_unit) * nodes.node_unit
        outcome = self._lifecycle.start(now, placeable=self._placeable(), initial_nodes=initial)
        return outcome, attrs.evolve(outcome, effects=())

    def _placeable(self) -> int | None:
        """How many nodes the backend could hold now, those of the job it holds included (None:
        no known limit). Called under the lock."""
        free = self._scheduler.capacity()
        if free is None:
            return None
        # The spares' slots count: the ranked nodes come first and take them when they need them.
        held = len(self._lifecycle.live_nodes()) + len(self._lifecycle.spare_nodes())
        return max(held + free, 0)

    def resize(self, target: int, reason: str, source: ResizeSource | str = ResizeSource.SCALE) -> ResizeResult:
        """Grow or shrink the running job to `target` nodes (see `JobLifecycle.resize`).

        The one path every resize takes: a person's `dlrover-master scale`, the JobService RPC and
        the autoscaler call this; the backend's capacity changes come through it from `tick`.
        (The runtime heuristics replace or grow one node through the failure path instead: a
        straggler's relaunch, a host OOM's relaunch with more memory.) The decision is journaled
        (a restarted master keeps the target) and is an event with its inputs and reason.

        Args:
            target: the node count wanted, within the worker group's range.
            reason: why, in a sentence.
            source: who asks (`ResizeSource`).

        Returns:
            What was decided.

        Raises:
            ResizeError: the target is outside the range (the message names the value and the
                range), or the request is malformed; nothing changed.
            LifecycleError: the job has ended or is finishing; nothing changed.
            JournalError: the decision could not be journaled; nothing changed.
        """
        request = ResizeRequest(target, reason, source)
        with self._lock:
            return self._resize_locked(request)

    def _resize_locked(self, request: ResizeRequest) -> ResizeResult:
        now = self._clock.now()
        placeable = self._placeable()
        paces = self._stragglers.node_paces(now)
        outcome = self._transact(
            lambda: self._just(self._lifecycle.resize(request, now, placeable=placeable, pace_s=paces))
        )
        for event in outcome.events:
            if event.kind in (RESIZE_EVENT, RESIZE_TARGET_EVENT):
                data = event.data
                return ResizeResult(
                    wanted_nodes=int(data["wanted"]),
                    target_nodes=int(data["target"]),
                    placeable=data["placeable"],
                    launched_ranks=tuple(data["launched_ranks"]),
                    leaving_nodes=tuple(data["leaving_nodes"]),
                    message=event.message,
                )
        wanted, target = self._lifecycle.wanted_nodes, self._lifecycle.target_nodes
        message = f"nothing changed: the job is already sized to {target} node(s), {wanted} wanted"
        return ResizeResult(wanted, target, placeable, message=message)

    def set_capacity(self, slots: int | None) -> int | None:
        """Set the backend's capacity in slots (None: unbounded) and follow it at once: the job
        grows toward its wanted size into new room, or gives back nodes that no longer fit.
        Returns the backend's free capacity afterwards.

        Raises:
            SchedulerError: this job's backend has no capacity a person sets; nothing changed.
            ConfigError: `slots` is not None or a non-negative integer; nothing changed.
        """
        if not isinstance(self._scheduler, AdjustableCapacity):
            raise SchedulerError(f"the {self._scheduler.name} backend has no capacity to set")
        with self._lock:
            self._scheduler.set_slots(slots)
            self._follow_capacity()
            self._keep_spares(self._clock.now())
            return self._scheduler.capacity()

    def _follow_capacity(self) -> None:
        """Turn a change of the backend's capacity into a resize request (under the lock)."""
        lifecycle = self._lifecycle
        if lifecycle.job_state.finished or not lifecycle.started:
            return
        placeable = self._placeable()
        if placeable is None:
            return
        live = len(lifecycle.live_nodes())
        fits = min(lifecycle.wanted_nodes, placeable)
        if fits == lifecycle.target_nodes and live <= placeable:
            return
        if any(n.state is NodeState.SUCCEEDED for n in lifecycle.current_nodes().values()):
            return  # the job is finishing: nodes leave as they succeed
        reason = (
            f"the backend's capacity changed: room for {placeable} node(s), {live} live, "
            f"{lifecycle.wanted_nodes} wanted"
        )
        try:
            self._resize_locked(ResizeRequest(lifecycle.wanted_nodes, reason, ResizeSource.CAPACITY))
        except (LifecycleError, ResizeError, JournalError) as exc:
            _log.warning("could not follow the backend's capacity: %s", exc)

    def _keep_spares(self, now: float) -> None:
        """Launch missing warm spares into the room the ranked nodes leave, or release those that
        no longer fit (under the lock; see `JobLifecycle.keep_spares`)."""
        if not self._config.lifecycle.spare_nodes and not self._lifecycle.spare_nodes():
            return
        try:
            self._transact(lambda: self._just(self._lifecycle.keep_spares(now, placeable=self._placeable())))
        except (LifecycleError, ResizeError, JournalError) as exc:
            _log.warning("could not keep the spare nodes: %s", exc)

    def _autoscale(self, now: float) -> None:
        """Run the autoscaler's loop (under the lock): record its plan as an event when it changed,
        and with `--autoscale on` apply it through the one resize path."""
        scaler = self._autoscaler
        if scaler is None:
            return
        lifecycle = self._lifecycle
        current = lifecycle.current_nodes().values()
        nodes = lifecycle.config.nodes
        view = JobView(
            wanted=lifecycle.wanted_nodes,
            running=frozenset(n.node_id for n in current if n.state is NodeState.RUNNING),
            placeable=self._placeable(),
            min_nodes=nodes.min_nodes,
            max_nodes=nodes.max_nodes,
            node_unit=nodes.node_unit,
            resources=lifecycle.config.node_resources,
            resizable=lifecycle.started
            and not lifecycle.job_state.finished
            and not any(n.state is NodeState.SUCCEEDED for n in current),
        )
        decision = scaler.tick(now, view)
        if decision is None:
            return
        mode = scaler.config.mode
        apply = decision.changes and mode is AutoscaleMode.ON
        if apply or scaler.should_publish(decision):
            self._record_plan(decision, mode, apply)
        if not apply:
            return
        try:
            self._resize_locked(
                ResizeRequest(decision.target, f"autoscaler: {decision.reason}", ResizeSource.AUTOSCALER)
            )
        except (LifecycleError, ResizeError, JournalError) as exc:
            _log.warning("the autoscaler's plan could not be applied: %s", exc)
            return
        scaler.applied(decision, now)

    def _record_plan(self, decision: AutoscaleDecision, mode: AutoscaleMode, apply: bool) -> None:
        verb = decision.action
        if decision.changes and not apply:
            verb = f"would {decision.action} (advise: nothing changes)"
        message = f"autoscaler ({mode.value}): {verb}: {decision.reason}"
        data = {"action": decision.action, "target": decision.target, "applied": apply, **decision.data}
        try:
            self._record(Outcome(events=(Event(AUTOSCALE_EVENT, message, data=data),)))
        except JournalError:
            _log.warning("could not journal the autoscaler's plan: %s", message, exc_info=True)

    def start(self) -> None:
        """Create (if `prepare` did not) and launch the job's nodes; nothing to do for a resumed job.

        A backend that limits node memory says once, in the log and as a `memory_limits` event, how it
        enforces the limits or why it cannot.
        """
        with self._lock:
            self._announce_memory_limits()
            self.prepare()
            deferred, self._deferred = self._deferred, []
            for effect in deferred:
                self._apply(effect)

    def register(
        self,
        node_id: int | None,
        name: str,
        host: str,
        *,
        proven_node_id: int | None = None,
        max_process_restarts: int | None = None,
        registration_key: str = "",
    ) -> NodeRecord:
        """An agent registers; see `JobLifecycle.register` (`max_process_restarts`: the restarts
        the agent allows, its ``--max-restarts``, when it said; `registration_key`: the key that
        makes a repeat of this registration the same one, see `registration_digest`). Where the
        backend knows the host it placed the node on (`NodePlacement`), that host is recorded in
        place of the agent's `host`.

        Raises:
            LifecycleError: refused; nothing changed.
            ConfigError: a malformed `registration_key`; nothing changed.
        """
        digest = registration_digest(registration_key)
        if node_id is not None and isinstance(self._scheduler, NodePlacement):
            host = self._scheduler.placed_host(node_id) or host
        with self._lock:
            return self._transact(
                lambda: self._lifecycle.register(
                    node_id,
                    name,
                    host,
                    self._clock.now(),
                    proven_node_id=proven_node_id,
                    max_process_restarts=max_process_restarts,
                    registration_digest=digest,
                )
            )

    def heartbeat(
        self,
        node_id: int,
        *,
        step: int | None = None,
        samples: int | None = None,
        resources: ResourceSample | None = None,
        rank_steps: Sequence[RankStepStats] = (),
        attempts: Sequence[AttemptReport] = (),
        excuses: Sequence[PeerExcuse] = (),
    ) -> tuple[tuple[Action, ...], JobState]:
        """A node's heartbeat; returns the actions waiting for it and the job's state.

        `excuses` (its ranks in a named phase, or found busy) are relayed to the other nodes' agents
        (`peer_excuses`): their ranks that wait on these are not hung while one lasts.

        `rank_steps` (the node's training processes' step stats) feed the straggler detector: a
        rank newly slower than `straggler_factor` x the others is an event (``straggler``) and,
        with `straggler_action` ``replace`` and a backend that relaunches nodes, its node is
        relaunched. `attempts` (step marks of the node's local rank 0) feed the goodput
        accounting and are journaled as `steps` events; `samples` the samples-per-second rate.

        Heartbeats are not journaled: liveness is re-established after a restart anyway. Handing
        out actions is: they are journaled as delivered before the answer leaves, so an action
        is delivered once, and one decided before a master restart is still delivered after it.
        (An answer lost on the wire loses its actions: the agent has no acknowledgement to send.)

        Raises:
            LifecycleError: refused; nothing changed.
            JournalError: actions were due but their delivery could not be journaled; they stay
                queued for the next heartbeat.
        """
        with self._lock:
            now = self._clock.now()
            if self._lifecycle.pending_actions(node_id):
                actions, outcome = self._transact(
                    lambda: self._with_outcome(self._lifecycle.heartbeat(node_id, now, step=step, samples=samples))
                )
            else:
                actions, outcome = self._lifecycle.heartbeat(node_id, now, step=step, samples=samples)
            self._metrics.heartbeat()
            if outcome.changed_nodes:
                if resources is not None:
                    self._resources[node_id] = resources
                    self._peak_memory[node_id] = max(self._peak_memory.get(node_id, 0), resources.memory_bytes)
                    self._peak_gpu_memory[node_id] = max(
                        self._peak_gpu_memory.get(node_id, 0), resources.gpu_memory_bytes
                    )
                if samples is not None:
                    self._samples.observe(node_id, samples, self._clock.wall_time())
                    if self._autoscaler is not None:
                        self._autoscaler.observe_samples(node_id, samples, now)
                    self._metrics.set_samples_per_second(self._samples.rate(self._clock.wall_time()))
                if attempts:
                    stamped = [attrs.evolve(a, node_id=node_id) for a in attempts]
                    self._goodput.add_attempts(stamped)
                    self._unjournaled_steps.extend(r for r in stamped if r.rank == 0)
                    self._journal_steps()
                self._maybe_progress(step)
                if self._autoscaler is not None and not self._autoscaler.training_steady(now):
                    # A round just changed (a resize, a restart): a joining node's first steps and
                    # the wait for its peers are not straggling. Judged again once training is steady.
                    self._stragglers.forget_node(node_id)
                    rank_steps = ()
                self._excuses.observe(node_id, excuses, now)
                self._stragglers.observe(node_id, rank_steps, now)
                if rank_steps:
                    finding = self._stragglers.check(now)
                    if finding is not None:
                        self._on_stragglers(finding, now)
            return actions, self._lifecycle.job_state

    def _on_stragglers(self, finding: StragglerFinding, now: float) -> None:
        """Report newly found stragglers; with ``replace``, relaunch their nodes where the backend can."""
        times = dict(finding.report.step_time_s)
        reason = f"straggler(s) rank {', '.join(map(str, finding.ranks))}: {finding.report.reason}"
        _log.warning("%s", reason)
        action = self._straggler_action
        if action == "replace" and isinstance(self._scheduler, SingleHost):
            action = "report"  # a replacement must avoid the only host there is (see below)
        data = {
            "ranks": list(finding.ranks),
            "nodes": list(finding.nodes),
            "step_time_s": {str(r): round(t, 4) for r, t in times.items()},
            "sync_lead_s": {str(r): round(t, 4) for r, t in finding.report.sync_lead_s},
            "factor": self._config.straggler_factor,
            "action": action,
        }
        try:
            self._record(Outcome(events=(Event("straggler", reason, data=data),)))
        except JournalError:
            _log.warning("could not journal the straggler event: %s", reason, exc_info=True)
        if self._straggler_action != "replace":
            return
        if not self._scheduler.relaunches_nodes:
            _log.warning("straggler action 'replace': the scheduler backend does not relaunch nodes; reported only")
            return
        if isinstance(self._scheduler, SingleHost):
            # A replacement avoids the slow node's host, the only one there is: it could not be placed.
            _log.warning(
                "straggler action 'replace': every node runs on host %s, so a replacement could not avoid it; "
                "reported only",
                self._scheduler.host,
            )
            return
        for node_id in sorted(set(finding.nodes)):
            if self._replace_straggler(node_id, f"straggler: {reason} ({self._straggler_why})", now):
                self._stragglers.forget_node(node_id)

    @property
    def _straggler_action(self) -> str:
        """`replace` with `straggler_action` replace or with the autoscaler on (a runtime heuristic acts
        through the relaunch path), else `report`."""
        if self._autoscaler is not None and self._autoscaler.config.mode is AutoscaleMode.ON:
            return "replace"
        return self._config.straggler_action

    @property
    def _straggler_why(self) -> str:
        if self._config.straggler_action == "replace":
            return "straggler_action replace"
        return "the autoscaler is on: a straggler's node is replaced"

    def _replace_straggler(self, node_id: int, evidence: str, now: float) -> bool:
        """Relaunch a straggler's node through the failure path (a slow host is avoided, as a
        hardware fault's); False when the lifecycle or the journal refused."""

        def change() -> tuple[Decision, Outcome]:
            return self._lifecycle.report_failure(node_id, SLOW_NODE_KIND, evidence, now, agent_exits=True)

        try:
            self._transact(change)
        except (LifecycleError, JournalError) as exc:
            _log.warning("could not replace straggling node %d: %s", node_id, exc)
            return False
        return True

    @staticmethod
    def _with_outcome(result: tuple[_T, Outcome]) -> tuple[tuple[_T, Outcome], Outcome]:
        return result, result[1]

    @staticmethod
    def _just(outcome: Outcome) -> tuple[Outcome, Outcome]:
        return outcome, outcome

    def _maybe_progress(self, step_reported: int | None) -> None:
        # Cheap checks first: this runs on every heartbeat, the scan of every node below only once a heartbeat
        # brought a new step, at most once per interval. (It used to scan on every heartbeat while no step was
        # new: before the first step and through every recovery. At 2,048 nodes that is 4 million node visits
        # per heartbeat round; the goodput simulator's profile found it.)
        last = self._progress
        if step_reported is not None and step_reported > (last[1] if last is not None else -1):
            self._new_step = True
        if not self._new_step:
            return
        wall = self._clock.wall_time()
        if last is not None and wall - last[0] < self._config.progress_event_interval_s:
            return
        self._new_step = False
        current = [n for n in self._lifecycle.current_nodes().values() if n.state is NodeState.RUNNING]
        step = max((n.step for n in current), default=-1)
        if step < 0 or (last is not None and step <= last[1]):
            return
        samples = sum(n.samples for n in current)
        try:
            self._record(Outcome(events=(Event("progress", f"step {step}", data={"step": step, "samples": samples}),)))
        except JournalError:
            # Progress is an observation, not a decision: the heartbeat stands, the next one retries.
            _log.warning("could not journal progress (step %d); retried on a later heartbeat", step, exc_info=True)
            self._new_step = True
            return
        if last is not None and wall > last[0]:
            dt = wall - last[0]
            self._metrics.observe_progress(step, (step - last[1]) / dt)
        self._progress = (wall, step, samples)

    def report_failure(
        self,
        node_id: int,
        kind: FailureKind,
        evidence: str,
        *,
        exit_code: int | None = None,
        agent_exits: bool = False,
    ) -> Decision:
        """A node's agent reported a failure; returns the decision as applied, which the reply
        delivers (a process restart is not queued again for the node's heartbeats).

        Args:
            node_id: the node.
            kind: the kind its agent reported.
            evidence: what the agent saw (a log tail, a traceback).
            exit_code: the failed process's exit status, when known.
            agent_exits: the agent exits after this report whatever the answer (see
                `JobLifecycle.report_failure`).

        The evidence is classified before the master's lock is taken (see `ClassifyingPolicy`):
        reading a 64 KiB log tail takes tens of milliseconds, which heartbeats must not wait for.

        Raises:
            LifecycleError: refused; nothing changed.
            JournalError: the decision could not be journaled; nothing changed.
        """
        policy = self._policy
        record, kills = self._memory_evidence(node_id)
        if record:
            evidence = f"{evidence}\n{record}"
        classification = (
            policy.classify(node_id, kind, evidence, exit_code) if isinstance(policy, ClassifyingPolicy) else None
        )
        with self._lock:
            ledger, blobs = self._memory_evidence_used(node_id, kills)
            left_behind = self._left_behind(node_id)
            decision = self._transact(
                lambda: self._lifecycle.report_failure(
                    node_id,
                    kind,
                    evidence,
                    self._clock.now(),
                    exit_code=exit_code,
                    answered=True,
                    classification=classification,
                    agent_exits=agent_exits,
                    left_behind=left_behind,
                ),
                blobs=blobs,
            )
            self._adopt_memory_evidence(ledger, blobs)
            # Its processes restart or the node goes: its ranks' steps start afresh.
            self._stragglers.forget_node(node_id)
            self._excuses.forget(node_id)
            return decision

    def _left_behind(self, node_id: int) -> str | None:
        """Why the node's workers run in a round that is over, as the first `RoundWitness` says (lock held)."""
        for member in self._membership:
            if isinstance(member, RoundWitness):
                try:
                    return member.left_behind(node_id)
                except Exception:
                    # Without the answer the failure is charged as any other: the old behaviour.
                    _log.exception("%s could not say whether node %d's round is over", type(member).__name__, node_id)
        return None

    def peer_excuses(self, node_id: int) -> tuple[PeerExcuse, ...]:
        """The excuses other nodes sent with their heartbeats that still last (a rank in a named phase, ranks
        found busy), the earliest begun first, for `node_id`'s agent."""
        with self._lock:
            return self._excuses.for_node(node_id, self._clock.now())

    def report_success(self, node_id: int) -> JobState:
        """A node's training finished successfully; returns the job's state.

        Raises:
            LifecycleError: refused; nothing changed.
        """
        with self._lock:
            self._transact(lambda: self._just(self._lifecycle.report_success(node_id, self._clock.now())))
            self._excuses.forget(node_id)  # its processes ended: they excuse nobody
            return self._lifecycle.job_state

    def mark_host_unhealthy(self, host: str, reason: str) -> None:
        """Avoid `host` for future nodes (a failed health check)."""
        with self._lock:
            self._transact(lambda: self._just(self._lifecycle.mark_host_unhealthy(host, reason)))

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
            wall = self._clock.wall_time()
            ev = Event("checkpoint", f"checkpoint step {step} committed", data={"step": step, "path": path})
            # Journaled first: the tracker records the commit only once it is durable.
            pending = CheckpointCommit(step=step, wall_time=wall, world_size=self._checkpoints.world_size, path=path)
            outcome = Outcome(events=(ev,))
            journaled = self._journal_outcome(outcome, checkpoint=pending)
            commit = self._checkpoints.commit(step, path, wall)
            self._publish(outcome, journaled)
            return commit

    def record_checkpoint(self, step: int, path: str, world_size: int) -> CheckpointCommit:
        """Record a checkpoint that a node's checkpoint saver committed itself (it checked every
        rank's files, see `dlrover.flashckpt.commit`); journaled before it returns. Idempotent: a
        step not newer than the latest commit changes nothing and returns the latest.

        Raises:
            CheckpointError: a negative step or a world size out of range; nothing changed.
        """
        with self._lock:
            self._checkpoints.validate_commit(step, world_size)
            latest = self._checkpoints.latest_commit
            if latest is not None and step <= latest.step:
                return latest
            wall = self._clock.wall_time()
            data = {"step": step, "path": path, "world_size": world_size}
            ev = Event("checkpoint", f"checkpoint step {step} committed at {path or '(no path)'}", data=data)
            pending = CheckpointCommit(step=step, wall_time=wall, world_size=world_size, path=path)
            outcome = Outcome(events=(ev,))
            journaled = self._journal_outcome(outcome, checkpoint=pending)
            self._checkpoints.record(pending)
            self._publish(outcome, journaled)
            return pending

    def stop(self, reason: str) -> JobState:
        """Stop the job on request; returns the job's final state."""
        with self._lock:
            self._transact(lambda: self._just(self._lifecycle.stop(reason, self._clock.now())))
            return self._lifecycle.job_state

    def tick(self) -> None:
        """Observe the scheduler, handle timeouts, journal collaborators, refresh metrics."""
        with self._lock:
            observed_reasons = self._observe_scheduler()
            pending_reasons = {**self._launch_retries.reasons(), **observed_reasons}
            now = self._clock.now()
            self._transact(lambda: self._just(self._lifecycle.tick(now, pending_reasons=pending_reasons)))
            self._retry_launches(now)
            self._follow_capacity()
            self._keep_spares(now)
            self._autoscale(now)
            if self._last_export is None or now - self._last_export >= self._config.state_export_interval_s:
                self._journal_collaborators()
            self._journal_steps(force=self._lifecycle.job_state.finished)
            wall = self._clock.wall_time()
            self._metrics.set_samples_per_second(self._samples.rate(wall))
            running = sum(1 for n in self._lifecycle.current_nodes().values() if n.state is NodeState.RUNNING)
            self._throughput.observe(wall, self._samples.total, running)
            if self._lifecycle.job_state.finished:
                self._record_profile()

    def _observe_scheduler(self) -> dict[int, str]:
        """Handle what changed in the backend's view; returns why nodes are pending (an unschedulable
        pod's message, by node id), for the lifecycle's pending announcement."""
        pending: dict[int, str] = {}
        for node_id, seen in self._scheduler.observe().items():
            if seen.state is ObservedState.PENDING and seen.reason:
                pending[node_id] = seen.evidence or seen.reason
            if self._observed.get(node_id) is seen.state:
                continue
            self._observe_node(node_id, seen.state, seen.exit_code, observed=seen)
            # Marked seen only once handled: an observation whose journal write failed comes again.
            self._observed[node_id] = seen.state
        return pending

    def _observe_node(
        self, node_id: int, seen: ObservedState, exit_code: int | None, *, observed: ObservedNode | None = None
    ) -> None:
        try:
            node = self._lifecycle.node(node_id)
        except LifecycleError:
            return  # launched by a previous master incarnation and forgotten: not ours to judge
        if node.state not in ALIVE_STATES or self._lifecycle.job_state.finished:
            return
        now = self._clock.now()
        if seen is ObservedState.RUNNING:
            self._transact(lambda: self._just(self._lifecycle.node_started(node_id, now)))
        elif seen is ObservedState.SUCCEEDED and node.state is NodeState.RUNNING and not node.spare:
            self._transact(lambda: self._just(self._lifecycle.report_success(node_id, now)))
        elif seen is ObservedState.FAILED and observed is not None and observed.disruption:
            # Taken away by the platform (evicted, preempted, its host lost): relaunched, no budget charged;
            # a lost host is avoided, so the relaunch lands elsewhere.
            avoid = observed.reason == REASON_NODE_LOST
            self._transact(
                lambda: self._just(
                    self._lifecycle.node_disrupted(
                        node_id, observed.reason, observed.evidence, now, host=observed.host, avoid_host=avoid
                    )
                )
            )
        elif seen in (ObservedState.SUCCEEDED, ObservedState.FAILED, ObservedState.STOPPED):
            # (A spare trains nothing: whatever its agent's status, it is lost.)
            evidence = f"the agent exited with status {exit_code} ({seen.value})"
            if observed is not None and observed.evidence:
                evidence = f"{evidence}\n{observed.evidence}"
            record, kills = self._platform_oom_evidence(observed) if observed is not None else ("", 0)
            if not record:
                record, kills = self._memory_evidence(node_id)
            # The kernel's record says why the node went: it is decided as host OOM, not as a lost node.
            kind = OOM_RECORD_KIND if record else LOST_NODE_KIND
            evidence = f"{evidence}\n{record}" if record else evidence
            ledger, blobs = self._memory_evidence_used(node_id, kills)
            self._transact(
                lambda: self._lifecycle.node_lost(node_id, evidence, now, exit_code=exit_code, kind=kind), blobs=blobs
            )
            self._adopt_memory_evidence(ledger, blobs)
            self._excuses.forget(node_id)

    def journal_collaborator(self, collaborator: StatefulCollaborator | LoggedCollaborator) -> bool:
        """Export one collaborator now and journal what is new; True when something was written.

        For libraries whose change must be durable before they answer (an acknowledged shard).
        The export runs before the master's lock is taken, so a library may call this right after
        releasing its own lock; a version or line not newer than the one journaled is skipped, so
        concurrent callers never write an older state over a newer one.
        """
        if isinstance(collaborator, LoggedCollaborator):
            changes = collaborator.export_changes()
            with self._lock:
                return self._journal_changes(collaborator, changes)
        version, data = collaborator.export_state()
        with self._lock:
            return self._journal_blob(collaborator.state_name, version, data)

    def _journal_changes(self, collaborator: LoggedCollaborator, changes: StateChanges) -> bool:
        """Journal what of `changes` is newer than what is journaled (lock held), and tell the library."""
        name = collaborator.state_name
        blob = changes.blob
        if blob is not None and blob.version <= self._blob_versions.get(name, -1):
            blob = None  # an older export than the stored blob, raced by a newer one
        floor = max(self._lines_journaled.get(name, -1), blob.version if blob is not None else -1)
        lines = tuple(line for line in changes.lines if line.seq > floor)
        if blob is not None or lines:
            self._record(Outcome(), blobs={name: blob} if blob is not None else None, changes={name: lines})
            # (max: publishing the write may have journaled a newer export of this collaborator already)
            if blob is not None:
                self._blob_versions[name] = max(self._blob_versions.get(name, -1), blob.version)
            self._lines_journaled[name] = max([floor, self._lines_journaled.get(name, -1), *(x.seq for x in lines)])
        collaborator.changes_journaled(self._lines_journaled.get(name, -1), blob)
        return blob is not None or bool(lines)

    def _journal_collaborator_locked(self, collaborator: StatefulCollaborator) -> bool:
        version, data = collaborator.export_state()
        return self._journal_blob(collaborator.state_name, version, data)

    def _journal_blob(self, name: str, version: int, data: str) -> bool:
        if version <= self._blob_versions.get(name, -1):
            return False
        self._record(Outcome(), blobs={name: Blob(version, data)})
        self._blob_versions[name] = version
        return True

    def flush_state(self) -> None:
        """Journal every collaborator whose state changed, and step marks not journaled yet
        (called at shutdown)."""
        with self._lock:
            self._journal_collaborators()
            self._journal_steps(force=True)
            if self._lifecycle.job_state.finished:
                self._record_profile()

    def _journal_collaborators(self) -> None:
        self._last_export = self._clock.now()
        blobs: dict[str, Blob] = {}
        for collaborator in self._collaborators:
            if isinstance(collaborator, LoggedCollaborator):
                self._journal_changes(collaborator, collaborator.export_changes())
                continue
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

    def pending_actions(self, node_id: int) -> tuple[Action, ...]:
        """Actions decided for a node and waiting for its next heartbeat (journaled)."""
        with self._lock:
            return self._lifecycle.pending_actions(node_id)

    def resources(self, node_id: int) -> ResourceSample | None:
        """A node's latest resource sample."""
        with self._lock:
            return self._resources.get(node_id)

    def events(self, after_seq: int = 0, limit: int = 100) -> tuple[JournaledEvent, ...]:
        """The job's events after `after_seq`."""
        return self._journal.events(after_seq, limit)

    def _goodput_now(self) -> GoodputBreakdown:
        """The breakdown of the job's time so far (the metrics read it when scraped)."""
        with self._lock:
            return self._goodput.breakdown(self._clock.wall_time())

    def status(self) -> JobStatus:
        """A summary of the job."""
        with self._lock:
            current = tuple(self._lifecycle.current_nodes().values())
            latest = self._checkpoints.latest_commit
            wall = self._clock.wall_time()
            goodput = self._goodput.breakdown(wall)
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
                breakdown=goodput,
                samples_per_second=self._samples.rate(wall),
                committed_path=latest.path if latest else "",
                committed_wall_time=latest.wall_time if latest else 0.0,
                target_nodes=self._lifecycle.target_nodes,
                wanted_nodes=self._lifecycle.wanted_nodes,
                capacity=self._scheduler.capacity(),
                spares=tuple(self._lifecycle.spare_nodes()),
                spare_nodes=self._config.lifecycle.spare_nodes,
            )

    def state_digest(self) -> str:
        """A fingerprint of everything a request could change (for tests: refused input changes nothing)."""
        with self._lock:
            snap = self._lifecycle.snapshot()
            data = {
                "job": job_fields(snap),
                "planned_round": {str(k): v for k, v in sorted(snap.planned_round.items())},
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


def _kind_of(ev: Event) -> FailureKind | None:
    """The failure kind an event names, or None (none, or a value that is no kind)."""
    try:
        return FailureKind(ev.data.get("kind"))
    except ValueError:
        return None


def _departed(node_id: int, reason: str, member: NodeMembership, *, data_suspect: bool) -> None:
    _tell_suspect(member.node_departed, node_id, reason, data_suspect)


def _tell_suspect(notify: Callable[..., None], node_id: int, reason: str, data_suspect: bool) -> None:
    """Call a `NodeMembership` method with `data_suspect`, or without it for a library written before the
    keyword existed (it is told as before: it takes every departure and restart for the data's doing)."""
    if _takes_keyword(notify, "data_suspect"):
        notify(node_id, reason, data_suspect=data_suspect)
    else:
        notify(node_id, reason)


def _takes_keyword(function: Callable[..., None], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a C function): call it as documented
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _finished(node_id: int, reason: str, member: NodeMembership) -> None:
    # A library written before `node_finished` existed has nothing to do on a success.
    notify = getattr(member, "node_finished", None)
    if notify is not None:
        notify(node_id, reason)


def _restarted(node_id: int, reason: str, member: NodeMembership, *, breaks_round: bool, data_suspect: bool) -> None:
    _tell_suspect(member.processes_restarted, node_id, reason, data_suspect)
    if breaks_round and isinstance(member, RoundWitness):
        member.round_broken(node_id, reason)


def _breaks_round(ev: Event) -> bool:
    """Whether a restart event is of a cause of the node's own, which its peers' collective errors follow:
    a planned round's, or a failure's of another kind than a collective error or hang (that one may be a
    peer's doing, and a peer's report of the same is then not excused by it)."""
    if ev.kind == "planned_restart":
        return True
    if ev.kind != "process_restart":
        return False
    return _kind_of(ev) not in PEER_CONSEQUENCE_KINDS


def _round_planned(node_ids: frozenset[int], reason: str, member: NodeMembership) -> None:
    if isinstance(member, PlannedRoundAware):
        member.round_planned(node_ids, reason)


def _job_finished(reason: str, member: NodeMembership) -> None:
    member.job_finished(reason)


def _merge_reports(reports: Sequence[AttemptReport]) -> list[AttemptReport]:
    """One report per (node, attempt), marks in arrival order, the newest times kept; an attempt
    whose marks exceed `MAX_MARKS_PER_REPORT` continues in further reports (a replay reads each)."""
    merged: dict[tuple[int, int], AttemptReport] = {}
    full: list[AttemptReport] = []
    for r in reports:
        key = (r.node_id, r.attempt)
        known = merged.get(key)
        if known is not None and len(known.marks) + len(r.marks) > MAX_MARKS_PER_REPORT:
            full.append(known)
            known = None
        if known is None:
            merged[key] = r
            continue
        merged[key] = attrs.evolve(
            r,
            rendezvous_start=known.rendezvous_start or r.rendezvous_start,
            rendezvous_end=known.rendezvous_end or r.rendezvous_end,
            workers_start=known.workers_start or r.workers_start,
            ready_time=r.ready_time or known.ready_time,
            load_s=max(known.load_s, r.load_s),
            marks=known.marks + r.marks,
        )
    return full + list(merged.values())
