"""The node lifecycle core: who is in the job, what failed, and what to do about it.

Pure: no I/O, no threads, no clock. Every call takes `now` (monotonic seconds) and returns an
`Outcome` listing the effects for the scheduler, the events for the log, and the nodes whose
records changed, so the caller can journal exactly those. A call that refuses its input raises a
`LifecycleError` subclass and changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from dlrover.autoscale import NodeState as PlannedNode
from dlrover.autoscale import OomConfig, OomEvent, Resources, plan_oom_relaunch
from dlrover.common import DLRoverError
from dlrover.diagnosis import (
    KINDS_NOT_FROM_DATA,
    LOST_NODE_KIND,
    PEER_CONSEQUENCE_KINDS,
    ActionKind,
    Decision,
    FailureKind,
    RelaunchBudget,
    RestartBudget,
    one_line_summary,
)
from dlrover.diagnosis.window import BudgetWindow, UseTimes
from dlrover.master.config import LifecycleConfig
from dlrover.master.node_table import NodeTable
from dlrover.master.policy import Classification, Failure, FailurePolicy, JournaledPolicy, StatefulPolicy
from dlrover.master.records import (
    Action,
    AwaitedCharge,
    Event,
    LaunchNode,
    LifecycleSnapshot,
    NodeRecord,
    Outcome,
    PendingWork,
    StopNode,
    TransitionRecord,
)
from dlrover.master.resize import RESIZE_EVENT, RESIZE_TARGET_EVENT, ResizeError, ResizeRequest, choose_leaving
from dlrover.master.states import (
    ALIVE_STATES,
    IllegalTransitionError,
    JobState,
    NodeState,
    check_transition,
)

__all__ = [
    "HostAvoidedError",
    "JobFinishedError",
    "JobFullError",
    "JobLifecycle",
    "LifecycleError",
    "NodeConflictError",
    "NodeStateError",
    "Savepoint",
    "UnknownNodeError",
]

_MAX_REASON_CHARS = 2000


class LifecycleError(DLRoverError):
    """The core refused a request; nothing changed. The message says why."""


class UnknownNodeError(LifecycleError):
    """No node has this id."""


class NodeStateError(LifecycleError):
    """The node is not in a state where the request makes sense."""


class NodeConflictError(LifecycleError):
    """The request would take over a node another agent holds."""


class JobFinishedError(LifecycleError):
    """The job has ended; it accepts no more changes."""


class JobFullError(LifecycleError):
    """No free slot for another node."""


class HostAvoidedError(LifecycleError):
    """The host failed a health check or a hardware failure happened there."""


@attrs.frozen
class Savepoint:
    """The lifecycle's state at one instant, to roll back to when a change cannot be journaled.

    Node records are immutable, so copying the containers is enough.
    """

    nodes: NodeTable
    current: dict[int, int]
    actions: dict[int, tuple[Action, ...]]
    job_state: JobState
    exit_reason: str
    job_failures: int
    next_node_id: int
    next_action_id: int
    avoid_hosts: dict[str, str]
    started: bool
    insufficient_since: float | None
    policy: object | None
    target_nodes: int
    wanted_nodes: int
    pending_announced: frozenset[int]
    planned_round: dict[int, int]
    spare_failures: int = 0
    restarted_at: dict[int, float] = attrs.field(factory=dict)
    unexplained_at: dict[int, float] = attrs.field(factory=dict)
    promoted_at: dict[int, tuple[float, int | None]] = attrs.field(factory=dict)
    work_changed: frozenset[int] = frozenset()
    job_failure_times: UseTimes = ()
    spare_failure_times: UseTimes = ()


def _decided_kind(kind: FailureKind, classification: Classification | None) -> FailureKind:
    """The kind a failure is decided on: what its evidence was read to show, else what was reported."""
    return classification.kind if classification is not None else kind


def _excused(node: NodeRecord, awaited: AwaitedCharge, because: str, cause: str, cause_node: int | None) -> Event:
    """The ``failure_excused`` event of `node`'s awaited failure: `because` says why in a clause."""
    message = (
        f"the {awaited.decided.value} of node {node.node_id}'s workers ({one_line_summary(awaited.evidence)}) "
        f"{because}: it counts against no budget"
    )
    data: dict[str, object] = {"kind": awaited.decided.value, "cause": cause}
    if cause_node is not None:
        data["cause_node"] = cause_node
    return Event("failure_excused", message, node.node_id, node.rank, data)


def _failure_event(
    node: NodeRecord, decision: Decision, kind: FailureKind, evidence: str, *, observed: bool, restarted: bool
) -> Event:
    """The event of a failure charged now: ``failure``, or ``failure_charged`` for one that waited for a
    cause in vain (its ``failure`` event was recorded when it was reported)."""
    headline = one_line_summary(evidence)
    if restarted:
        return Event(
            "failure_charged",
            f"node {node.node_id} (rank {node.rank}): no peer's failure explains its {decision.kind.value} "
            f"({headline}): charged; {decision.outcome}",
            node.node_id,
            node.rank,
            {"kind": decision.kind.value, "reported_kind": kind.value, "action": decision.action.value},
        )
    return Event(
        "failure",
        f"node {node.node_id} (rank {node.rank}) failed: {decision.kind.value}: {headline}",
        node.node_id,
        node.rank,
        {
            "kind": decision.kind.value,
            "reported_kind": kind.value,
            "evidence": evidence,
            "observed_by_master": observed,
        },
    )


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "...(truncated)"


def _last_failure(kind: FailureKind, evidence: str) -> dict[str, Any]:
    """A node record's fields for a failure of `kind`: what it was, and whether the data may be its cause."""
    return {"last_failure": f"{kind.value}: {evidence}", "failure_data_suspect": kind not in KINDS_NOT_FROM_DATA}


class JobLifecycle:
    """The node lifecycle of one job.

    Ranks 0..max_nodes-1 are logical: each is served by one incarnation at a time, and a
    replacement inherits the rank of the node it replaces.

    Args:
        config: budgets, timeouts and early-stop rules.
        policy: decides what to do about failures, spending the restart and relaunch budgets it
            is handed with each `Failure`; its answer is applied as it is, save what cannot be
            carried out at all (no action for a failed node, a restart with no agent left to do
            it; a relaunch or restart once workers have succeeded): then the node leaves the job.
        now: the current time.
        snapshot: resume from this state (after a master restart) instead of starting empty.
        wall_offset: wall seconds minus `now`'s monotonic seconds. The failure budgets count
            failures within a window of wall time (`LifecycleConfig.budget_window_s`), which,
            journaled, means the same to the next master; `now` does not.
        scheduler_relaunches: whether the scheduler starts a new node itself. False (the
            external backend: bare metal, Slurm, a standalone `dlrover-run`): a node whose agent
            is alive to restart its processes restarts them in place while it has restarts left
            and then leaves the job (`spend_restart`); a node whose agent is gone or exits leaves
            its rank open for a new agent to register, and the events say so rather than that a
            node was created.
        single_host: the one host every node of the backend runs on (the local backend), or None.
            It is never avoided: a replacement that avoided it could not be placed, and a job
            whose every relaunch fails to launch loses the rank. A decision to relaunch avoiding
            it relaunches on it, and says so.
    """

    def __init__(
        self,
        config: LifecycleConfig,
        policy: FailurePolicy,
        now: float,
        snapshot: LifecycleSnapshot | None = None,
        *,
        scheduler_relaunches: bool = True,
        single_host: str | None = None,
        wall_offset: float = 0.0,
    ) -> None:
        if config.spare_nodes and not scheduler_relaunches:
            raise LifecycleError(
                f"spare_nodes {config.spare_nodes}: this job's backend starts no node, so it can keep no spare "
                "(warm spares need a backend that launches nodes, such as local)"
            )
        self._config = config
        self._policy = policy
        self._scheduler_relaunches = scheduler_relaunches
        self._single_host = single_host
        self._single_host_kept = False  # whether an event said so (once: a health check may keep asking)
        self._nodes = NodeTable()
        self._current: dict[int, int] = {}
        # Queues are tuples, replaced whole: a savepoint copies the dict, not every queue.
        self._actions: dict[int, tuple[Action, ...]] = {}
        self._job_state = JobState.RUNNING
        self._exit_reason = ""
        self._job_failures = 0
        self._wall_offset = wall_offset
        self._job_failure_times: UseTimes = ()  # the newest max_job_failures + 1
        self._next_node_id = 0
        self._next_action_id = 1
        self._avoid_hosts: dict[str, str] = {}
        self._started = False
        self._insufficient_since: float | None = now
        self._target = config.nodes.max_nodes
        self._wanted = config.nodes.max_nodes
        self._pending_announced: set[int] = set()
        # node id -> why the platform keeps it pending (an unschedulable pod's message), as last observed.
        # Not journaled: an observation, renewed at every tick.
        self._pending_reasons: dict[int, str] = {}
        self._planned_round: dict[int, int] = {}  # node id -> the action restarting it for a planned round
        self._spare_failures = 0  # spares lost: bounds how often a lost spare is replaced
        self._spare_failure_times: UseTimes = ()  # the newest max_relaunches x spare_nodes
        # node id -> when its processes were last told to restart for a failure. Not journaled: after a
        # master restart a node may be told once more to restart for a spare's round.
        self._restarted_at: dict[int, float] = {}
        # node id -> when a collective error of its, awaited in vain, was charged: its next ones for a
        # while are charged at once, so a node that breaks its own collectives meets its budgets on the
        # same failure whatever the spacing of its reports. Not journaled: a resumed master waits again.
        self._unexplained_at: dict[int, float] = {}
        # Nodes whose pending work changed since it was last journaled (see `changed_work`).
        self._work_changed: set[int] = set()
        # Spares promoted to a rank that have not trained yet -> (when, the first step they reported
        # since, None before one; see `spare_refill_after_s`). Not journaled: after a master restart
        # their replacements are launched at once.
        self._promoted_at: dict[int, tuple[float, int | None]] = {}
        # Registration digest -> the node registered with it: a hint, checked against that node at
        # every use (`_registered_with`), so a rollback need not undo it. Rebuilt from the nodes on
        # restore. Without it, every registration that claims no node would scan every rank.
        self._digest_hint: dict[str, int] = {}
        if snapshot is not None:
            self._restore(snapshot, now)

    def _restore(self, snap: LifecycleSnapshot, now: float) -> None:
        # Monotonic readings of the previous process mean nothing here: every live node gets a
        # full heartbeat timeout (and start timeout) from now to reconnect.
        for node in snap.nodes:
            fresh = attrs.evolve(node, last_heartbeat=now, state_since=now)
            if node.awaiting_cause is not None:  # the wait for a cause starts again, as the timeouts do
                waits = node.state is NodeState.RUNNING
                fresh = attrs.evolve(
                    fresh, awaiting_cause=attrs.evolve(node.awaiting_cause, since=now) if waits else None
                )
            self._nodes[node.node_id] = fresh
            if node.spare:
                continue  # a spare holds no rank
            current = self._current.get(node.rank)
            if current is None or current < node.node_id:
                self._current[node.rank] = node.node_id
        if snap.current is not None:
            self._current = {rank: node_id for rank, node_id in snap.current.items() if node_id in self._nodes}
        self._digest_hint = {n.registration_digest: n.node_id for n in self._nodes.values() if n.registration_digest}
        self._job_state = snap.job_state
        self._exit_reason = snap.exit_reason
        self._job_failures = snap.job_failures
        if snap.job_failure_times is None:  # an older journal: its failures count for ever
            self._job_failure_times = (None,) * min(snap.job_failures, self._config.job_failure_limit + 1)
        else:
            self._job_failure_times = tuple(snap.job_failure_times)
        self._next_node_id = snap.next_node_id
        # Action ids are never reused, even where a node's queue was journaled after the job record.
        owed = (action.action_id for queued in snap.actions.values() for action in queued)
        self._next_action_id = max(snap.next_action_id, max(owed, default=0) + 1)
        self._avoid_hosts = dict(snap.avoid_hosts)
        if self._single_host is not None:
            # A journal of an older master may avoid it: no node could register or launch again.
            self._avoid_hosts.pop(self._single_host, None)
        self._started = snap.started
        max_nodes = self._config.nodes.max_nodes
        self._target = min(max_nodes, snap.target_nodes if snap.target_nodes is not None else max_nodes)
        self._wanted = min(max_nodes, snap.wanted_nodes if snap.wanted_nodes is not None else max_nodes)
        self._planned_round = dict(snap.planned_round)
        self._spare_failures = snap.spare_failures
        if snap.spare_failure_times is None:  # an older journal: its losses count for ever
            self._spare_failure_times = (None,) * min(snap.spare_failures, max(self._spare_loss_limit(), 1))
        else:
            self._spare_failure_times = tuple(snap.spare_failure_times)
        self._actions = {node_id: tuple(queued) for node_id, queued in snap.actions.items() if queued}
        if snap.policy_state and isinstance(self._policy, JournaledPolicy):
            self._policy.import_state(snap.policy_state)

    # ----------------------------------------------------------------- queries

    @property
    def config(self) -> LifecycleConfig:
        """The configuration in force."""
        return self._config

    @property
    def job_state(self) -> JobState:
        """The job's state."""
        return self._job_state

    @property
    def exit_reason(self) -> str:
        """Why the job ended; empty while it runs."""
        return self._exit_reason

    @property
    def job_failures(self) -> int:
        """Failures in the job so far (`max_job_failures` counts those within the budget window)."""
        return self._job_failures

    def _wall(self, now: float) -> float:
        """`now` as wall seconds, the time the failure budgets keep."""
        return now + self._wall_offset

    @property
    def avoid_hosts(self) -> Mapping[str, str]:
        """Hosts no node is placed on, with the reason."""
        return dict(self._avoid_hosts)

    @property
    def started(self) -> bool:
        """Whether the job's nodes were created (`start`)."""
        return self._started

    @property
    def target_nodes(self) -> int:
        """How many nodes the job is sized to now: the wanted count, or fewer while the backend
        has no room for more (see `resize`)."""
        return self._target

    @property
    def wanted_nodes(self) -> int:
        """How many nodes the last resize request asked for (`max_nodes` until one does)."""
        return self._wanted

    def live_nodes(self) -> list[NodeRecord]:
        """The current incarnation of each rank that is pending, starting or running, by rank."""
        return [n for n in self.current_nodes().values() if n.state in ALIVE_STATES]

    def nodes(self) -> dict[int, NodeRecord]:
        """Every node incarnation by id (a copy)."""
        return self._nodes.as_dict()

    def spare_nodes(self) -> list[NodeRecord]:
        """The warm spares that are pending, starting or running, by node id: they hold no rank."""
        return [self._nodes[node_id] for node_id in self._nodes.alive_spare_ids()]

    @property
    def spare_failures(self) -> int:
        """Spares lost so far (see `keep_spares`)."""
        return self._spare_failures

    def node(self, node_id: int) -> NodeRecord:
        """One node.

        Raises:
            UnknownNodeError: no node has this id.
        """
        try:
            return self._nodes[node_id]
        except KeyError:
            raise UnknownNodeError(f"no node with id {node_id!r}") from None

    def current_nodes(self) -> dict[int, NodeRecord]:
        """The current incarnation of every rank, by rank."""
        return {rank: self._nodes[node_id] for rank, node_id in sorted(self._current.items())}

    def pending_actions(self, node_id: int) -> tuple[Action, ...]:
        """Actions waiting for a node's next heartbeat."""
        return self._actions.get(node_id, ())

    def pending_work(self, node_id: int) -> PendingWork:
        """What `node_id` is owed: its queued actions and its planned round's restart."""
        return PendingWork(self._actions.get(node_id, ()), self._planned_round.get(node_id))

    def changed_work(self, *, every: bool = False) -> dict[int, PendingWork]:
        """The pending work of the nodes whose work changed since `work_journaled` (with `every`,
        of every node owed something, and of those changed): what the next journal write stores."""
        ids = set(self._work_changed)
        if every:
            ids |= self._actions.keys() | self._planned_round.keys()
        return {node_id: self.pending_work(node_id) for node_id in sorted(ids)}

    def work_journaled(self) -> None:
        """What `changed_work` returned is journaled."""
        self._work_changed.clear()

    def _forget_work(self, node_id: int, *, planned: bool = True) -> None:
        """The node is owed nothing more (with `planned`, not its planned round's restart either)."""
        self._actions.pop(node_id, None)
        if planned:
            self._planned_round.pop(node_id, None)
        self._work_changed.add(node_id)

    def snapshot(self, *, with_nodes: bool = True) -> LifecycleSnapshot:
        """Everything needed to resume this state in a new process (without the node records
        when not `with_nodes`: what the job record is written from, on every job change)."""
        return LifecycleSnapshot(
            nodes=tuple(self._nodes[k] for k in sorted(self._nodes)) if with_nodes else (),
            job_state=self._job_state,
            exit_reason=self._exit_reason,
            job_failures=self._job_failures,
            next_node_id=self._next_node_id,
            next_action_id=self._next_action_id,
            avoid_hosts=dict(self._avoid_hosts),
            started=self._started,
            actions={node_id: queued for node_id, queued in self._actions.items() if queued},
            policy_state=self._policy.export_state() if isinstance(self._policy, JournaledPolicy) else "",
            target_nodes=self._target,
            wanted_nodes=self._wanted,
            planned_round=dict(self._planned_round),
            spare_failures=self._spare_failures,
            current=dict(self._current),
            job_failure_times=self._job_failure_times,
            spare_failure_times=self._spare_failure_times,
        )

    def savepoint(self) -> Savepoint:
        """The state now (and the policy's, when it keeps any), for `rollback`."""
        return Savepoint(
            nodes=self._nodes.copy(),
            current=dict(self._current),
            actions=dict(self._actions),
            job_state=self._job_state,
            exit_reason=self._exit_reason,
            job_failures=self._job_failures,
            next_node_id=self._next_node_id,
            next_action_id=self._next_action_id,
            avoid_hosts=dict(self._avoid_hosts),
            started=self._started,
            insufficient_since=self._insufficient_since,
            policy=self._policy.savepoint() if isinstance(self._policy, StatefulPolicy) else None,
            target_nodes=self._target,
            wanted_nodes=self._wanted,
            pending_announced=frozenset(self._pending_announced),
            planned_round=dict(self._planned_round),
            spare_failures=self._spare_failures,
            restarted_at=dict(self._restarted_at),
            unexplained_at=dict(self._unexplained_at),
            promoted_at=dict(self._promoted_at),
            work_changed=frozenset(self._work_changed),
            job_failure_times=self._job_failure_times,
            spare_failure_times=self._spare_failure_times,
        )

    def rollback(self, savepoint: Savepoint) -> None:
        """Go back to `savepoint`: the change made since could not be journaled, so it never happened."""
        self._nodes = savepoint.nodes.copy()
        self._current = dict(savepoint.current)
        self._actions = dict(savepoint.actions)
        self._job_state = savepoint.job_state
        self._exit_reason = savepoint.exit_reason
        self._job_failures = savepoint.job_failures
        self._next_node_id = savepoint.next_node_id
        self._next_action_id = savepoint.next_action_id
        self._avoid_hosts = dict(savepoint.avoid_hosts)
        self._started = savepoint.started
        self._insufficient_since = savepoint.insufficient_since
        self._target = savepoint.target_nodes
        self._wanted = savepoint.wanted_nodes
        self._pending_announced = set(savepoint.pending_announced)
        self._planned_round = dict(savepoint.planned_round)
        self._spare_failures = savepoint.spare_failures
        self._restarted_at = dict(savepoint.restarted_at)
        self._unexplained_at = dict(savepoint.unexplained_at)
        self._promoted_at = dict(savepoint.promoted_at)
        self._work_changed = set(savepoint.work_changed)
        self._job_failure_times = savepoint.job_failure_times
        self._spare_failure_times = savepoint.spare_failure_times
        if isinstance(self._policy, StatefulPolicy) and savepoint.policy is not None:
            self._policy.rollback(savepoint.policy)

    def count(self, state: NodeState) -> int:
        """How many incarnations are in `state`."""
        return self._nodes.count(state)

    def counts(self) -> dict[NodeState, int]:
        """How many incarnations are in each state (every state present), in one pass."""
        return self._nodes.counts()

    # ---------------------------------------------------------------- commands

    def start(self, now: float, *, placeable: int | None = None, initial_nodes: int | None = None) -> Outcome:
        """Create the job's nodes in PENDING (ranks 0..n-1); idempotent.

        Args:
            now: the current time.
            placeable: how many nodes the scheduler backend can place now (None: no limit it
                knows of). The job starts with min(wanted, placeable) nodes, fewer than
                `min_nodes` included (then it waits, up to `insufficient_nodes_window_s`), and
                grows toward the wanted count as capacity appears (`resize` with the `capacity` source).
            initial_nodes: the node count wanted at start (the autoscaler starts a job at its
                minimum and grows it while that pays); None wants `max_nodes`.

        The ranked nodes come first; the warm spares (`spare_nodes`) take what room is left.

        Raises:
            ResizeError: `placeable` is negative, or `initial_nodes` is outside the range or not a
                multiple of the node unit; nothing changed.
        """
        if self._started or self._job_state.finished:
            return Outcome()
        if placeable is not None and placeable < 0:
            raise ResizeError(f"placeable must be None or >= 0, got {placeable!r}")
        nodes = self._config.nodes
        max_nodes = nodes.max_nodes
        wanted = max_nodes if initial_nodes is None else initial_nodes
        if not nodes.min_nodes <= wanted <= max_nodes or wanted % nodes.node_unit:
            raise ResizeError(
                f"cannot start with {wanted} node(s): the worker group's range is {nodes.min_nodes}..{max_nodes} "
                f"in multiples of {nodes.node_unit}"
            )
        self._started = True
        self._insufficient_since = now
        self._target = wanted if placeable is None else min(wanted, placeable)
        self._wanted = wanted
        room = "" if placeable is None else f"; the backend has room for {placeable} node(s)"
        want = "" if wanted == max_nodes else f", {wanted} wanted"
        ev = Event(
            "job_start",
            f"job started with {self._target} of at most {max_nodes} node(s){want}{room}",
            data={"target_nodes": self._target, "max_nodes": max_nodes, "placeable": placeable, "wanted_nodes": wanted},
        )
        out = Outcome(job_changed=True, events=(ev,))
        for rank in range(self._target):
            out = out.merge(self._create_node(rank, 0, None, now, "job start"))
        return out.merge(self.keep_spares(now, placeable=placeable))

    def resize(
        self,
        request: ResizeRequest,
        now: float,
        *,
        placeable: int | None = None,
        pace_s: Mapping[int, float] | None = None,
    ) -> Outcome:
        """Grow or shrink the running job toward `request.target` nodes.

        Every source but `capacity` sets the wanted count, and must ask for one within the worker
        group's range (`min_nodes`..`max_nodes`, a multiple of `node_unit`). The job is sized to
        the wanted count or, while the backend has room for fewer (`placeable`), to what fits;
        the `capacity` source asks for what fits now (below `min_nodes` when the backend lost
        that room: the job then runs short and stops once that lasts `insufficient_nodes_window_s`).

        Growing creates nodes for the lowest free ranks (launched now, admitted by the rendezvous
        at its next round); a rank given up before keeps its relaunch count, so a resize spends no
        relaunch budget. Shrinking lets nodes go in the order of `choose_leaving` (not yet
        running, on avoided hosts, the slowest by `pace_s`, the highest rank): each is
        removed and stopped, which gives its agent the backend's stop grace to save.

        Args:
            request: the target count, the reason and who asks.
            now: the current time.
            placeable: how many nodes the backend can hold now, those it holds included (None:
                no limit it knows of).
            pace_s: recent seconds per step of each node's own work, by node id (the master's
                straggler statistics: step time, or lead time in a synchronous job).

        Shrinking restarts the workers of the running nodes that stay (a planned round) only when
        a running node leaves. Their restart action is marked `Action.planned_round`, so their
        agents have the workers seal a flash checkpoint first, as a stopped node's agent does
        within its stop grace (``dlrover-run`` on SIGTERM): the new round redoes no step. A
        request that changes neither the target, the wanted count nor the live nodes changes
        nothing, whoever asks (a `scale` to the current size, a retry).

        Returns:
            What changed: launches, stops, and one event with the inputs and the reason: ``resize``
            when nodes launch or leave, ``resize_target`` when only the target or the wanted
            count changed; nothing when nothing changed.

        Raises:
            ResizeError: the target is outside the range or not a multiple of the node unit, or
                `placeable` is negative; nothing changed.
            JobFinishedError, NodeStateError: the job has ended or is finishing; nothing changed.
        """
        self._check_resize(request, placeable)
        nodes = self._config.nodes
        wanted = request.target if request.source.sets_wanted else self._wanted
        target = request.target if placeable is None else min(request.target, placeable)
        target = min(target, wanted)
        live = self.live_nodes()
        previous_target, previous_wanted = self._target, self._wanted
        if (target, wanted) == (previous_target, previous_wanted) and len(live) == target:
            # Whoever asks (a `scale` to the current size, a retried RPC, an autoscaler plan equal
            # to the live count): the job is already there, so nothing restarts and nothing is told.
            return Outcome()
        self._target, self._wanted = target, wanted
        paces = dict(pace_s or {})
        cause = f"resize to {target} node(s) ({request.source.value}): {request.reason}"
        launched: list[int] = []
        leaving: list[int] = []
        out = Outcome()
        if len(live) < target:
            out, launched = self._grow(live, target, cause, now)
        elif len(live) > target:
            out, leaving = self._shrink(live, target, cause, paces, now)
        room = "no known limit" if placeable is None else f"room for {placeable}"
        message = (
            f"resize ({request.source.value}): {request.reason}; wanted {wanted} node(s) (was {previous_wanted}), "
            f"backend {room}: target {target} (was {previous_target}), {len(live)} live"
        )
        if launched:
            message += f"; launching rank(s) {', '.join(map(str, launched))}"
        if leaving:
            message += f"; node(s) {', '.join(map(str, leaving))} leave"
        if target < nodes.min_nodes:
            message += (
                f"; below min_nodes {nodes.min_nodes}: the job stops if that lasts "
                f"{self._config.insufficient_nodes_window_s:g}s"
            )
        data = {
            "source": request.source.value,
            "reason": request.reason,
            "requested": request.target,
            "wanted": wanted,
            "previous_wanted": previous_wanted,
            "target": target,
            "previous_target": previous_target,
            "placeable": placeable,
            "live": len(live),
            "launched_ranks": launched,
            "leaving_nodes": leaving,
            "pace_s": {str(k): round(v, 4) for k, v in sorted(paces.items())},
            "min_nodes": nodes.min_nodes,
            "max_nodes": nodes.max_nodes,
        }
        # Only a launch or a departure starts a new round; a new target or wanted count alone
        # is recorded under its own kind, so nothing reads it as the job's pace changing.
        kind = RESIZE_EVENT if launched or leaving else RESIZE_TARGET_EVENT
        out = Outcome(events=(Event(kind, message, data=data),), job_changed=True).merge(out)
        return out.merge(self._check_nodes(now, cause=cause))

    def _check_resize(self, request: ResizeRequest, placeable: int | None) -> None:
        """Refuse a resize the job cannot take (see `resize`); changes nothing."""
        self._refuse_if_finished()
        nodes = self._config.nodes
        if request.target > nodes.max_nodes or (
            request.source.sets_wanted and not nodes.min_nodes <= request.target <= nodes.max_nodes
        ):
            raise ResizeError(
                f"cannot resize to {request.target} node(s): the worker group's range is "
                f"{nodes.min_nodes}..{nodes.max_nodes}"
            )
        if request.source.sets_wanted and request.target % nodes.node_unit:
            raise ResizeError(
                f"cannot resize to {request.target} node(s): it must be a multiple of node_unit {nodes.node_unit}"
            )
        if placeable is not None and placeable < 0:
            raise ResizeError(f"placeable must be None or >= 0, got {placeable!r}")
        if not self._started:
            raise NodeStateError("the job has not started yet; it cannot be resized")
        if self.count(NodeState.SUCCEEDED):
            raise NodeStateError("the job is finishing (nodes have succeeded); it is no longer resized")

    def _grow(self, live: list[NodeRecord], target: int, cause: str, now: float) -> tuple[Outcome, list[int]]:
        """Create nodes for the lowest free ranks until `target` live; returns them too."""
        taken = {n.rank for n in live}
        free = [r for r in range(self._config.nodes.max_nodes) if r not in taken][: target - len(live)]
        out = Outcome()
        promoted = False
        for rank in free:
            # A rank given up before keeps its relaunches, those charged to its budget with them: a
            # resize spends no relaunch budget, and gives none back.
            before = self._nodes.get(self._current[rank]) if rank in self._current else None
            relaunches = before.relaunch_count if before else 0
            spare = self._ready_spare(None)
            if spare is not None:
                # A warm spare is there already: it takes the new rank at the next round, and the
                # backend starts another spare in its place (`keep_spares`).
                out = out.merge(self._promote(spare, rank, relaunches, cause, now, replaces=None))
                promoted = True
            else:
                out = out.merge(self._create_node(rank, relaunches, None, now, cause))
            if before is not None and (before.relaunched_at or before.disruptions):
                new_id = self._current[rank]
                self._nodes[new_id] = attrs.evolve(
                    self._nodes[new_id], relaunched_at=before.relaunched_at, disruptions=before.disruptions
                )
        if promoted:
            # The running nodes join the promoted spares' round as soon as they see them wait.
            out = out.merge(self._round_planned(f"planned round: a resize gives spare(s) a rank ({cause})"))
        return out, free

    def _shrink(
        self, live: list[NodeRecord], target: int, cause: str, paces: Mapping[int, float], now: float
    ) -> tuple[Outcome, list[int]]:
        """Remove and stop the nodes `choose_leaving` picks; returns their ids too."""
        out = Outcome()
        leaving = choose_leaving(live, len(live) - target, self._avoid_hosts, paces)
        for node in leaving:
            out = out.merge(self._move(node, NodeState.REMOVED, cause, now))
            out = out.merge(Outcome(effects=(StopNode(node.node_id, cause),)))
            self._forget_work(node.node_id)
        gone = ", ".join(str(n.node_id) for n in leaving)
        if not any(n.state is NodeState.RUNNING for n in leaving):
            # Only nodes that never registered leave: no round held them, so none is broken.
            return out, [n.node_id for n in leaving]
        # The nodes that stay train in a new round without the ones leaving: their workers
        # restart for it (as for a node that joins), which spends no restart budget. Their agents
        # have the workers seal a flash checkpoint first, as the leaving nodes' agents do when they
        # are stopped, so the new round redoes no step.
        staying = [node for node in live if node not in leaving]
        why = f"planned round: node(s) {gone} left the job ({cause})"
        self._plan_round(staying, why, save_first=True)
        return out.merge(self._round_planned(why)), [n.node_id for n in leaving]

    def node_started(self, node_id: int, now: float) -> Outcome:
        """The scheduler reports the node started. Repeated reports change nothing."""
        node = self.node(node_id)
        if node.state is not NodeState.PENDING or self._job_state.finished:
            return Outcome()
        return self._move(node, NodeState.STARTING, "the scheduler started it", now)

    def register(
        self,
        node_id: int | None,
        name: str,
        host: str,
        now: float,
        *,
        proven_node_id: int | None = None,
        max_process_restarts: int | None = None,
        registration_digest: str = "",
    ) -> tuple[NodeRecord, Outcome]:
        """An agent registers, claiming a launched node (`node_id`) or any free slot (None).

        A node that already registered can only be claimed again by an agent that proved it is
        that node (`proven_node_id`, from its node credential): a reconnect after a lost answer
        or a master restart. Anyone else is refused.

        `registration_digest` (the SHA-256 of a key the agent drew, `registration_digest`) makes
        the call repeatable: the same digest again from an agent that proves no identity, while
        the node it registered runs, is the same registration (its answer was lost, or came past
        the caller's deadline) and gets that node, changing nothing else. Without one, a repeat
        is refused as a conflict. An agent that proves its node reconnects as above.

        `max_process_restarts` is the restarts the agent allows (``dlrover-run --max-restarts``,
        as torchrun counts them: per agent): the node's process-restart budget, in place of the
        configured `max_process_restarts`; None keeps the configured one.

        Returns:
            The node as registered, and what changed.

        Raises:
            JobFinishedError, UnknownNodeError, NodeStateError, NodeConflictError, JobFullError,
            HostAvoidedError: the registration is refused; nothing changed.
        """
        self._refuse_if_finished()
        if max_process_restarts is not None and max_process_restarts < 0:
            raise LifecycleError(f"max_process_restarts must be None or >= 0, got {max_process_restarts}")
        if not self._started:
            raise NodeStateError("the job has not started yet; no node can register")
        repeated = self._registered_with(node_id, registration_digest)
        if repeated is not None and proven_node_id is None:
            node = attrs.evolve(repeated, last_heartbeat=now)
            self._nodes[node.node_id] = node
            return node, Outcome(changed_nodes=frozenset({node.node_id}))
        if host in self._avoid_hosts:
            raise HostAvoidedError(f"host {host!r} is avoided: {self._avoid_hosts[host]}")
        node = self.node(node_id) if node_id is not None else self._free_slot(name, proven_node_id)
        if node.state is NodeState.RUNNING:
            if proven_node_id != node.node_id:
                raise NodeConflictError(
                    f"node {node.node_id} is already registered; a reconnecting agent must present its node credential"
                )
            budget = node.max_process_restarts if max_process_restarts is None else max_process_restarts
            updated = attrs.evolve(node, last_heartbeat=now, max_process_restarts=budget)
            self._nodes[node.node_id] = updated
            ev = Event("node_reconnect", f"node {node.node_id} reconnected", node.node_id, node.rank)
            return updated, Outcome(events=(ev,), changed_nodes=frozenset({node.node_id}))
        if node.state not in (NodeState.PENDING, NodeState.STARTING):
            raise NodeStateError(f"node {node.node_id} is {node.state.value}; it cannot register")
        node = attrs.evolve(
            node,
            name=name,
            host=host,
            registered=True,
            last_heartbeat=now,
            max_process_restarts=max_process_restarts,
            registration_digest=registration_digest,
        )
        self._nodes[node.node_id] = node
        if registration_digest:
            self._digest_hint[registration_digest] = node.node_id
        out = self._move(node, NodeState.RUNNING, f"agent {name!r} on {host!r} registered", now)
        return self._nodes[node.node_id], out.merge(self._check_nodes(now))

    def _registered_with(self, node_id: int | None, digest: str) -> NodeRecord | None:
        """The running node whose agent registered with `digest`: `node_id` where the agent names
        its node, else one holding a rank (what a free slot is chosen from)."""
        hinted = self._digest_hint.get(digest) if digest else None
        if hinted is None or node_id not in (None, hinted):
            return None
        node = self._nodes.get(hinted)
        if node is None or node.registration_digest != digest or node.state is not NodeState.RUNNING:
            return None
        if node_id is None and self._current.get(node.rank) != node.node_id:
            return None
        return node

    def _free_slot(self, name: str, proven_node_id: int | None) -> NodeRecord:
        if proven_node_id is not None:
            return self.node(proven_node_id)
        free = [
            self._nodes[nid]
            for nid in self._current.values()
            if self._nodes[nid].state in (NodeState.PENDING, NodeState.STARTING) and not self._nodes[nid].registered
        ]
        if not free:
            raise JobFullError(f"no free node slot: all {self._config.nodes.max_nodes} ranks are taken")
        # A rejoining agent gets the rank it had before, when that rank is free.
        for node in free:
            previous = self._nodes.get(node.replaces) if node.replaces is not None else None
            if previous is not None and name and previous.name == name:
                return node
        return min(free, key=lambda n: n.rank)

    def heartbeat(
        self, node_id: int, now: float, *, step: int | None = None, samples: int | None = None
    ) -> tuple[tuple[Action, ...], Outcome]:
        """A sign of life with progress; returns the actions waiting for the node.

        Handing out actions changes the journaled state (`job_changed`): the caller journals that
        before it answers, so an action is delivered once, even across a master restart. Handing
        out a planned round's restart (see `resize`) is a ``planned_restart`` event: the workers
        it restarts let go of what they held, as for a process restart.
        A node the master has given up on (replaced, removed, or the job ended) is told to stop;
        that changes no state. A node removed without a replacement while the job runs (a
        shrink let it go) is told so with `Action.planned_round`: its workers save first.

        Raises:
            UnknownNodeError, NodeStateError: nothing changed.
        """
        node = self.node(node_id)
        if self._job_state.finished:
            reason = f"job {self._job_state.value}: {self._exit_reason}"
            return (Action(0, ActionKind.REMOVE_NODE, reason),), Outcome()
        if node.state is not NodeState.RUNNING:
            if node.state in (NodeState.PENDING, NodeState.STARTING):
                raise NodeStateError(f"node {node_id} has not registered; register before heartbeating")
            reason = f"node {node_id} is {node.state.value}"
            if node.replaced_by is not None:
                reason += f"; replaced by node {node.replaced_by}"
            # Removed with no replacement while the job runs: a shrink let it go (a node the
            # policy gives up on exits on the answer to its failure report and heartbeats no
            # more). Its agent has the workers save before it stops them, as on the backend's
            # SIGTERM, whichever of the two reaches it first.
            leaves = node.state is NodeState.REMOVED and node.replaced_by is None
            return (Action(0, ActionKind.REMOVE_NODE, reason, planned_round=leaves),), Outcome()
        self._nodes[node_id] = attrs.evolve(
            node,
            last_heartbeat=now,
            step=node.step if step is None else step,
            samples=node.samples if samples is None else samples,
        )
        actions = self._actions.pop(node_id, ())
        events: tuple[Event, ...] = ()
        if actions:
            self._work_changed.add(node_id)
            planned = self._planned_round.pop(node_id, None)  # the planned restart is delivered
            delivered = next((a for a in actions if a.action_id == planned), None)
            if delivered is not None:
                # Its agent now restarts the workers: what they held (shard leases) is let go of
                # now, as for any process restart, not when it expires.
                events = (
                    Event(
                        "planned_restart",
                        f"node {node_id}'s workers restart for a planned round: {delivered.reason}",
                        node_id,
                        node.rank,
                        {"action_id": delivered.action_id, "delivered": True},
                    ),
                )
        return actions, Outcome(changed_nodes=frozenset({node_id}), events=events)

    def report_failure(
        self,
        node_id: int,
        kind: FailureKind,
        evidence: str,
        now: float,
        *,
        exit_code: int | None = None,
        answered: bool = False,
        classification: Classification | None = None,
        agent_exits: bool = False,
        left_behind: str | None = None,
    ) -> tuple[Decision, Outcome]:
        """A node's agent reported a failure; decide and apply what to do (`kind`: the kind it
        reported, `exit_code`: the failed process's status, if known).

        `left_behind`: why the node's workers ran in a round that was already over when they
        failed (the rendezvous's word: a peer left, was lost or restarted), or None. A collective
        error or a hang of such workers (the kind decided on: `classification`'s, else `kind`) is
        that change's consequence: the node's processes restart for the next round and no budget
        is spent. Another kind (user code, a native crash, ...) is its own fault, decided as usual.

        `classification` is what the policy made of the full evidence beforehand (see
        `ClassifyingPolicy`); it is handed to the policy with the failure. With `answered`, the
        decision reaches the node in the reply to its report, so a process restart is not also
        queued as a heartbeat action (the node would restart twice). `agent_exits`: the node's
        agent exits after this report whatever the answer (a network check left its node out),
        so its processes cannot be restarted in place: the policy is told (`Failure.agent_exits`)
        and decides a relaunch or a removal.

        Returns:
            The decision as applied, and what changed.

        Raises:
            JobFinishedError, UnknownNodeError, NodeStateError: nothing changed.
        """
        self._refuse_if_finished()
        node = self.node(node_id)
        if node.state not in ALIVE_STATES:
            raise NodeStateError(f"node {node_id} is {node.state.value}; it cannot fail")
        if node.spare:
            return self._lose_spare(node, kind, _clip(evidence), now)
        if node_id in self._planned_round and node.state is NodeState.RUNNING and not agent_exits:
            return self._planned_restart(node, kind, _clip(evidence), answered=answered)
        decided = _decided_kind(kind, classification)
        if (
            left_behind
            and decided in PEER_CONSEQUENCE_KINDS
            and node.state is NodeState.RUNNING
            and not agent_exits
            and not self.count(NodeState.SUCCEEDED)  # a finishing job restarts nobody (see `_fail`)
        ):
            return self._consequence_restart(node, decided, _clip(evidence), left_behind, now, answered=answered)
        if (
            decided in PEER_CONSEQUENCE_KINDS
            and self._config.peer_cause_wait > 0
            and node.state is NodeState.RUNNING
            and node.awaiting_cause is None  # a second one in a row is the node's own (see `_fail`)
            and not self._recently_unexplained(node.node_id, now)
            and not agent_exits
            and not self.count(NodeState.SUCCEEDED)
            and self._has_running_peer(node)  # alone, its collectives broke of its own
            # A node with no restart left is decided now: restarted while it waited, it would break its
            # peers' round twice if no cause came and it were relaunched or removed then.
            and node.process_restarts < self.restart_budget(node)
        ):
            reason = None if classification is None else classification.reason
            awaited = AwaitedCharge(kind, decided, reason, _clip(evidence), exit_code, now)
            return self._await_cause(node, awaited, answered=answered)
        return self._fail(
            node,
            kind,
            _clip(evidence),
            now,
            exit_code,
            answered=answered,
            classification=classification,
            agent_exits=agent_exits,
        )

    def _recently_unexplained(self, node_id: int, now: float) -> bool:
        """Whether a collective error of the node waited for a cause in vain within the last three
        waits (a broken link of its own fails each restart again, a wait's time apart or less)."""
        at = self._unexplained_at.get(node_id)
        return at is not None and now - at < 3 * self._config.peer_cause_wait

    def _has_running_peer(self, node: NodeRecord) -> bool:
        return any(
            n.node_id != node.node_id and n.state is NodeState.RUNNING and not n.spare for n in self.live_nodes()
        )

    def _await_cause(self, node: NodeRecord, awaited: AwaitedCharge, *, answered: bool) -> tuple[Decision, Outcome]:
        """A collective error or hang with no cause known yet: the node's workers restart for the next
        round at once, and the charge waits (`AwaitedCharge`) for a peer's own failure to explain it.

        A peer killed outright (agent and workers) breaks every survivor's collective within a second,
        but nothing tells the master until the peer's heartbeat timeout: charged at once, one such loss
        cost each survivor a restart and the job as many failures as it had nodes."""
        wait = self._config.peer_cause_wait
        decided, evidence = awaited.decided, awaited.evidence
        node = attrs.evolve(node, awaiting_cause=awaited, **_last_failure(decided, evidence))
        self._nodes[node.node_id] = node
        self._restarted_at[node.node_id] = awaited.since
        headline = one_line_summary(evidence)
        reason = (
            f"the workers of node {node.node_id} failed ({decided.value}: {headline}) and no cause is known yet: "
            f"they restart for the next round; the failure is charged in {wait:g}s unless a peer's own failure "
            "explains it"
        )
        if not answered:
            self._queue_action(node.node_id, ActionKind.RESTART_PROCESSES, reason)
        failure_ev = Event(
            "failure",
            f"node {node.node_id} (rank {node.rank}) failed: {decided.value}: {headline}",
            node.node_id,
            node.rank,
            {
                "kind": decided.value,
                "reported_kind": awaited.kind.value,
                "evidence": evidence,
                "observed_by_master": False,
                "charge": "awaiting_cause",
            },
        )
        restart_ev = Event(
            "process_restart", reason, node.node_id, node.rank, {"kind": decided.value, "awaiting_cause": True}
        )
        decision = Decision(ActionKind.RESTART_PROCESSES, decided, str(node.node_id), reason)
        return decision, Outcome(events=(failure_ev, restart_ev), changed_nodes=frozenset({node.node_id}))

    def _own_explains_awaited(self, node: NodeRecord, why: str) -> Outcome:
        """The node's own failure (a crash, its loss, the platform's doing) explains its collective error
        that waited: that one is charged to nobody; the new failure is decided on its own."""
        awaited = node.awaiting_cause
        assert awaited is not None
        self._nodes[node.node_id] = attrs.evolve(node, awaiting_cause=None)
        ev = _excused(node, awaited, f"came with the node's own failure ({why})", why, node.node_id)
        return Outcome(events=(ev,), changed_nodes=frozenset({node.node_id}))

    def _charge_awaited(self, node: NodeRecord, now: float) -> tuple[Decision, Outcome]:
        """Charge the node's awaited failure: no peer's failure explained it in time. Its workers
        restarted when it was reported, so a restart decided now is only counted; any other decision (a
        relaunch, a removal, the job's stop: the budgets changed meanwhile) is carried out."""
        awaited = node.awaiting_cause
        assert awaited is not None
        node = attrs.evolve(node, awaiting_cause=None)
        self._nodes[node.node_id] = node
        self._unexplained_at[node.node_id] = now
        classification = None if awaited.reason is None else Classification(awaited.decided, awaited.reason)
        return self._fail(
            node,
            awaited.kind,
            awaited.evidence,
            now,
            awaited.exit_code,
            answered=True,
            classification=classification,
            restarted=True,
        )

    def _excuse_awaited(self, cause: NodeRecord, why: str) -> Outcome:
        """`cause`, a running node, failed of its own (or the platform took it): the awaited charges of
        the other nodes are its consequence, charged to nobody."""
        out = Outcome()
        for other in list(self._nodes.values()):
            awaited = other.awaiting_cause
            if awaited is None or other.node_id == cause.node_id:
                continue
            self._nodes[other.node_id] = attrs.evolve(other, awaiting_cause=None)
            because = f"is the consequence of node {cause.node_id} (rank {cause.rank}) failing ({why})"
            ev = _excused(other, awaited, because, why, cause.node_id)
            out = out.merge(Outcome(events=(ev,), changed_nodes=frozenset({other.node_id})))
        return out

    def _planned_restart(
        self, node: NodeRecord, kind: FailureKind, evidence: str, *, answered: bool
    ) -> tuple[Decision, Outcome]:
        """A node told to restart for a planned round (a peer left by a resize, or a spare takes a
        failed peer's rank) reports its workers failed before that restart reached it: their
        collective lost the departed peer.
        It is the planned restart, answered as such, and spends no budget."""
        action_id = self._planned_round.pop(node.node_id)
        self._work_changed.add(node.node_id)
        if answered:
            # The answer carries the restart: the queued one must not restart the node again.
            queued = self._actions.get(node.node_id, ())
            self._actions[node.node_id] = tuple(a for a in queued if a.action_id != action_id)
        reason = (
            f"a planned round is under way (a node left the job by a resize, or a spare takes a failed node's "
            f"rank): the workers of node "
            f"{node.node_id} restart for it; their failure ({kind.value}: {one_line_summary(evidence)}) "
            "is its consequence and counts against no budget"
        )
        decision = Decision(ActionKind.RESTART_PROCESSES, kind, str(node.node_id), reason)
        ev = Event("planned_restart", reason, node.node_id, node.rank, {"kind": kind.value, "evidence": evidence})
        return decision, Outcome(events=(ev,))

    def _consequence_restart(
        self, node: NodeRecord, kind: FailureKind, evidence: str, cause: str, now: float, *, answered: bool
    ) -> tuple[Decision, Outcome]:
        """A node's workers failed with a collective error or hang after their round was over
        (`report_failure`'s `left_behind`): they restart for the next round, and no budget is spent."""
        reason = (
            f"the workers of node {node.node_id} failed ({kind.value}: {one_line_summary(evidence)}) in a round "
            f"that was already over ({cause}): the failure is its consequence; they restart for the next round, "
            "and it counts against no budget"
        )
        self._restarted_at[node.node_id] = now
        if not answered:
            self._queue_action(node.node_id, ActionKind.RESTART_PROCESSES, reason)
        decision = Decision(ActionKind.RESTART_PROCESSES, kind, str(node.node_id), reason)
        data = {"kind": kind.value, "evidence": evidence, "cause": cause}
        ev = Event("consequence_restart", reason, node.node_id, node.rank, data)
        return decision, Outcome(events=(ev,), changed_nodes=frozenset({node.node_id}))

    def node_lost(
        self,
        node_id: int,
        evidence: str,
        now: float,
        *,
        exit_code: int | None = None,
        kind: FailureKind = LOST_NODE_KIND,
    ) -> tuple[Decision, Outcome]:
        """The master saw a node fail from outside (its agent exited, its launch failed): no agent
        reports it, so it is decided as `kind` on `evidence` alone and the node can only be
        relaunched. Heartbeat and start timeouts take this path too. `kind` is
        `dlrover.diagnosis.LOST_NODE_KIND` unless a record the master read itself says more (the
        kernel's OOM count of the node's memory cgroup: `HOST_OOM`).

        Raises:
            JobFinishedError, UnknownNodeError, NodeStateError: nothing changed.
        """
        self._refuse_if_finished()
        node = self.node(node_id)
        if node.state not in ALIVE_STATES:
            raise NodeStateError(f"node {node_id} is {node.state.value}; it cannot fail")
        if node.spare:
            return self._lose_spare(node, kind, _clip(evidence), now)
        return self._fail(node, kind, _clip(evidence), now, exit_code, observed=True)

    def node_disrupted(
        self, node_id: int, reason: str, evidence: str, now: float, *, host: str = "", avoid_host: bool = False
    ) -> Outcome:
        """The platform took the node away (evicted, preempted, its host lost): not the job's fault.

        No policy is asked and no budget is charged: the node fails and its rank is relaunched (a ready
        warm spare first) without counting against `max_job_failures` or the rank's `max_relaunches`
        (`NodeRecord.disruptions`). With `avoid_host`, `host` (where the backend saw it run) is avoided
        from now on, so the relaunch lands elsewhere (a lost host). A spare is let go without counting
        as a spare loss; `keep_spares` replaces it. A job that is finishing (a node succeeded) cannot
        take a replacement: the node leaves, as for a failure.

        Args:
            node_id: the node.
            reason: the platform's word (`Evicted`, `Preempted`, `NodeLost`, ...).
            evidence: what the platform said, for the event and the node's `last_failure`.
            now: monotonic seconds.
            host: the host it ran on, as the backend saw it.
            avoid_host: avoid `host` from now on.

        Raises:
            JobFinishedError, UnknownNodeError, NodeStateError: nothing changed.
        """
        self._refuse_if_finished()
        node = self.node(node_id)
        if node.state not in ALIVE_STATES:
            raise NodeStateError(f"node {node_id} is {node.state.value}; it cannot be disrupted")
        headline = one_line_summary(evidence) if evidence else reason
        message = (
            f"node {node_id} (rank {node.rank}) was taken away by the platform ({reason}: {headline}); "
            "it is not the job's fault and counts against no budget"
        )
        out = Outcome()
        if avoid_host and host and host == self._single_host:  # see `single_host`
            avoid_host = False
            message = f"{message}; its host {host!r} is not avoided: every node of this backend runs on it"
        if avoid_host and host:
            out = out.merge(self.mark_host_unhealthy(host, f"{reason} on node {node_id}"))
        if node.state is NodeState.RUNNING and not node.spare:
            out = out.merge(self._excuse_awaited(node, f"taken away by the platform: {reason}"))
        if node.awaiting_cause is not None:  # the platform's doing explains it too
            out = out.merge(self._own_explains_awaited(node, f"taken away by the platform: {reason}"))
            node = self._nodes[node_id]
        node = attrs.evolve(node, last_failure=_clip(f"{reason}: {evidence}"), failure_data_suspect=False)
        self._nodes[node_id] = node
        data = {
            "reason": reason,
            "evidence": _clip(evidence),
            "host": host,
            "host_avoided": bool(avoid_host and host),
            "state": node.state.value,  # running: it was training (goodput counts the detection)
        }
        ev = Event("disruption", message, node_id, None if node.spare else node.rank, data)
        out = out.merge(self._move(node, NodeState.FAILED, f"disruption: {reason}", now))
        self._forget_work(node_id, planned=False)
        out = out.merge(Outcome(effects=(StopNode(node_id, message),), events=(ev,), job_changed=True))
        if node.spare:
            return out
        failed = self._nodes[node_id]
        if self.count(NodeState.SUCCEEDED):
            gone = f"{message}; but workers have already succeeded: the node is not relaunched"
            out = out.merge(self._move(failed, NodeState.REMOVED, gone, now))
            return out.merge(self._check_nodes(now, cause=gone))
        out = out.merge(self._relaunch(failed, LOST_NODE_KIND, message, None, now, disrupted=True))
        return out.merge(self._check_nodes(now, cause=message))

    def report_success(self, node_id: int, now: float) -> Outcome:
        """The node's training processes finished successfully.

        Raises:
            JobFinishedError, UnknownNodeError, IllegalTransitionError: nothing changed.
        """
        self._refuse_if_finished()
        node = self.node(node_id)
        if node.spare:
            raise NodeStateError(f"node {node_id} is a spare: it holds no rank, so it trained nothing to succeed at")
        out = Outcome()
        if node.state is NodeState.RUNNING:
            # A peer that finishes closes its connections: a collective error at the end is its doing.
            out = self._excuse_awaited(node, "its workers succeeded and closed their connections")
        out = out.merge(self._move(node, NodeState.SUCCEEDED, "its training processes succeeded", now))
        return out.merge(self._check_nodes(now))

    def mark_host_unhealthy(self, host: str, reason: str) -> Outcome:
        """Avoid `host` from now on (a failed health check); its running nodes are not touched.
        The backend's one host (`single_host`) is not avoided: the event says so."""
        if not host or host in self._avoid_hosts:
            return Outcome()
        if host == self._single_host:
            if self._single_host_kept:
                return Outcome()
            self._single_host_kept = True
            message = (
                f"host {host!r} not avoided ({reason}): every node of this backend runs on it, so no node could "
                "be placed if it were"
            )
            return Outcome(events=(Event("host_not_avoided", message, data={"host": host, "reason": reason}),))
        self._avoid_hosts[host] = _clip(reason)
        ev = Event("host_avoided", f"host {host!r} avoided: {reason}", data={"host": host})
        return Outcome(events=(ev,), job_changed=True)

    def tick(self, now: float, *, pending_reasons: Mapping[int, str] | None = None) -> Outcome:
        """Handle heartbeat and start timeouts, and the insufficient-nodes window.

        `pending_reasons`: why the backend keeps nodes pending (by node id, e.g. an unschedulable pod's
        message), as observed now; the nodes-pending event and an insufficient-nodes stop name them.
        """
        if pending_reasons is not None:
            self._pending_reasons = {nid: _clip(why) for nid, why in pending_reasons.items() if why}
        if self._job_state.finished:
            return Outcome()
        out = Outcome()
        timeout = self._config.heartbeat_timeout_s
        start_timeout = self._config.node_start_timeout_s
        for node_id in sorted(self._nodes):
            node = self._nodes[node_id]
            if self._has_ended():  # a failure earlier in this loop may have stopped the job
                break
            if node.state is NodeState.RUNNING and now - node.last_heartbeat > timeout:
                silent = now - node.last_heartbeat
                evidence = f"no heartbeat for {silent:.1f}s (timeout {timeout:g}s)"
                out = out.merge(self._fail_observed(node, evidence, now))
            elif (
                node.state in (NodeState.PENDING, NodeState.STARTING)
                and start_timeout is not None
                and now - node.state_since > start_timeout
            ):
                evidence = f"not registered {now - node.state_since:.1f}s after launch (timeout {start_timeout:g}s)"
                if node.node_id in self._pending_reasons:  # why the backend has not started it
                    evidence = f"{evidence}: {self._pending_reasons[node.node_id]}"
                out = out.merge(self._fail_observed(node, evidence, now))
        # After the timeouts: a peer found lost in this very tick explains the charges it caused.
        out = out.merge(self._settle_awaited(now))
        out = out.merge(self._announce_pending(now))
        return out.merge(self._check_nodes(now))

    def _settle_awaited(self, now: float) -> Outcome:
        """Charge the awaited failures no peer's failure explained within `peer_cause_wait` (only running
        nodes wait: `_move` ends the wait of a node that leaves)."""
        out = Outcome()
        wait = self._config.peer_cause_wait
        for node_id in sorted(self._nodes):
            node = self._nodes[node_id]
            awaited = node.awaiting_cause
            running = node.state is NodeState.RUNNING  # `_move` ends the wait of a node that leaves
            if awaited is not None and running and not self._has_ended() and now - awaited.since >= wait:
                out = out.merge(self._charge_awaited(node, now)[1])
        return out

    def _announce_pending(self, now: float) -> Outcome:
        """Say once per node when launched nodes stay pending past `node_pending_timeout_s`: the
        job goes on with the nodes that run (the rendezvous admits the late ones at a later round)."""
        timeout = self._config.node_pending_timeout_s
        if timeout is None or self._job_state.finished:
            return Outcome()
        late = [
            n
            for n in self.live_nodes()
            if n.state in (NodeState.PENDING, NodeState.STARTING)
            and now - n.state_since > timeout
            and n.node_id not in self._pending_announced
        ]
        if not late:
            return Outcome()
        self._pending_announced.update(n.node_id for n in late)
        running = sum(1 for n in self.live_nodes() if n.state is NodeState.RUNNING)
        minimum = self._config.nodes.min_nodes
        if running >= minimum:
            goes_on = f"the job goes on with the {running} running node(s) (min_nodes {minimum})"
        else:
            goes_on = (
                f"only {running} node(s) run, below min_nodes {minimum}: the job stops if that lasts "
                f"{self._config.insufficient_nodes_window_s:g}s"
            )
        ids = ", ".join(f"{n.node_id} (rank {n.rank})" for n in late)
        reasons = {n.node_id: self._pending_reasons[n.node_id] for n in late if n.node_id in self._pending_reasons}
        why = "".join(f"; node {nid}: {one_line_summary(text)}" for nid, text in sorted(reasons.items()))
        ev = Event(
            "nodes_pending",
            f"node(s) {ids} still not running after {timeout:g}s (node_pending_timeout_s): {goes_on}; "
            f"they join at a later round if they start{why}",
            data={
                "nodes": [n.node_id for n in late],
                "running": running,
                "min_nodes": minimum,
                "timeout_s": timeout,
                "reasons": {str(nid): text for nid, text in sorted(reasons.items())},
            },
        )
        return Outcome(events=(ev,))

    def stop(self, reason: str, now: float, *, state: JobState = JobState.STOPPED) -> Outcome:
        """End the job: every live node is removed and stopped. Idempotent once ended."""
        if self._job_state.finished:
            return Outcome()
        if state is JobState.RUNNING:
            raise LifecycleError("stop() needs a final state, got running")
        self._job_state = state
        self._exit_reason = _clip(reason)
        out = Outcome(
            job_changed=True,
            events=(Event("job_end", f"job {state.value}: {self._exit_reason}", data={"state": state.value}),),
        )
        for node in list(self._nodes.values()):
            if node.state in ALIVE_STATES:
                out = out.merge(self._move(node, NodeState.REMOVED, f"job {state.value}: {self._exit_reason}", now))
                out = out.merge(Outcome(effects=(StopNode(node.node_id, "the job ended"),)))
        self._work_changed.update(self._actions)
        self._actions.clear()
        return out

    # ----------------------------------------------------------------- helpers

    def _has_ended(self) -> bool:
        return self._job_state.finished

    def _refuse_if_finished(self) -> None:
        if self._job_state.finished:
            raise JobFinishedError(f"the job has ended ({self._job_state.value}: {self._exit_reason})")

    def _move(self, node: NodeRecord, target: NodeState, reason: str, now: float) -> Outcome:
        problem = check_transition(node.state, target)
        if problem is not None:
            raise IllegalTransitionError(f"node {node.node_id}: {problem}")
        record = TransitionRecord(node.state, target, reason, now)
        moved = attrs.evolve(node, state=target, state_since=now, history=(*node.history, record), awaiting_cause=None)
        self._nodes[node.node_id] = moved
        ev = Event(
            "node_state",
            f"node {node.node_id} (rank {node.rank}) {node.state.value} -> {target.value}: {reason}",
            node.node_id,
            node.rank,
            {"from": node.state.value, "to": target.value},
        )
        events: tuple[Event, ...] = (ev,)
        awaited = node.awaiting_cause
        if awaited is not None:
            # Only a running node waits: one that leaves (a resize, its success, the job's end) is
            # charged nothing more for a failure nobody could yet explain.
            because = f"found no cause before the node became {target.value} ({reason})"
            events = (_excused(node, awaited, because, reason, None), ev)
        return Outcome(events=events, changed_nodes=frozenset({node.node_id}))

    def _create_node(
        self,
        rank: int,
        relaunch_count: int,
        replaces: int | None,
        now: float,
        reason: str,
        *,
        resources: Resources | None = None,
    ) -> Outcome:
        """A new PENDING node for `rank`, launched with `resources` (the worker group's when None)."""
        group = self._config.worker_group
        resources = group.resources if resources is None else resources
        node_id = self._next_node_id
        self._next_node_id += 1
        node = NodeRecord(
            node_id=node_id,
            rank=rank,
            state=NodeState.PENDING,
            relaunch_count=relaunch_count,
            replaces=replaces,
            last_heartbeat=now,
            state_since=now,
            history=(TransitionRecord(None, NodeState.PENDING, reason, now),),
            role=group.role,
            resources=resources,
        )
        self._nodes[node_id] = node
        self._current[rank] = node_id
        # A backend that starts no node only opens the rank for an agent to register: say that.
        made = (
            f"node {node_id} created for rank {rank}"
            if self._scheduler_relaunches
            else f"rank {rank} open for an agent to register as node {node_id} (this job's backend starts none)"
        )
        ev = Event("node_created", f"{made}: {reason}", node_id, rank)
        launch = self.launch_of(node_id)
        return Outcome(effects=(launch,), events=(ev,), changed_nodes=frozenset({node_id}), job_changed=True)

    def launch_of(self, node_id: int) -> LaunchNode:
        """The launch of a pending node as it would be made now (the hosts avoided now): when it is
        created, and when the master sends again a launch the backend failed.

        Raises:
            UnknownNodeError: no such node.
            NodeStateError: the node is not pending.
        """
        node = self.node(node_id)
        if node.state is not NodeState.PENDING:
            raise NodeStateError(f"node {node_id} is {node.state.value}; only a pending node is launched")
        return LaunchNode(
            node_id, node.rank, node.relaunch_count, frozenset(self._avoid_hosts), node.role, node.resources
        )

    # ------------------------------------------------------------------ spares

    def keep_spares(self, now: float, *, placeable: int | None = None) -> Outcome:
        """Keep `spare_nodes` warm spares within the backend's room; idempotent.

        The ranked nodes come first: spares take the room left beside the live ranked nodes
        (`placeable`: how many nodes the backend can hold now, those it holds included; None: no
        limit it knows of). Missing spares are created (launched in the background, holding no
        rank); spares beyond the room are released, those not yet running first, then the newest.
        No spare is created once the job is finishing (a node succeeded) or ended, on a backend
        that starts no node, while `max_relaunches` x `spare_nodes` spares were lost within
        the budget window (the `spare_lost` event of the last one says so); and a spare promoted to
        a rank holds back its own replacement until it trained (`LifecycleConfig.spare_refill_after_s`).

        Raises:
            ResizeError: `placeable` is negative; nothing changed.
        """
        if placeable is not None and placeable < 0:
            raise ResizeError(f"placeable must be None or >= 0, got {placeable!r}")
        wanted = self._config.spare_nodes
        spares = self.spare_nodes()
        if not self._started or self._job_state.finished or (not wanted and not spares):
            return Outcome()
        room = wanted if placeable is None else max(0, min(wanted, placeable - len(self.live_nodes())))
        out = Outcome()
        if len(spares) > room:
            # Not yet running first (they cost least to give up), then the newest.
            order = sorted(spares, key=lambda n: (n.state is NodeState.RUNNING, -n.node_id))
            why = (
                f"the backend has room for {placeable} node(s) and the {len(self.live_nodes())} ranked node(s) "
                f"come first: {room} spare(s) fit"
            )
            for spare in order[: len(spares) - room]:
                out = out.merge(self._move(spare, NodeState.REMOVED, f"spare released: {why}", now))
                out = out.merge(Outcome(effects=(StopNode(spare.node_id, f"spare released: {why}"),)))
                ev = Event(
                    "spare_released",
                    f"spare node {spare.node_id} released: {why}",
                    spare.node_id,
                    None,
                    {"placeable": placeable, "spare_nodes": wanted, "room": room},
                )
                out = out.merge(Outcome(events=(ev,), job_changed=True))
            return out
        if (
            len(spares) == room
            or not self._scheduler_relaunches
            or self.count(NodeState.SUCCEEDED)
            or self._spare_losses_spent(now)
        ):
            return out
        # A spare promoted to a rank that is still joining the job holds back its own replacement
        # (`spare_refill_after_s`); other missing spares (one lost, room that appeared) are not held.
        for _ in range(room - len(spares) - self._promoted_spares_restoring(now)):
            out = out.merge(self._create_spare(now, f"{room} of {wanted} spare(s) fit beside the ranked nodes"))
        return out

    def _promoted_spares_restoring(self, now: float) -> int:
        """How many spares promoted to a rank are still joining the job: running, promoted less than
        `spare_refill_after_s` ago, and neither a step newer than the first they reported since (that
        one may be the step their workers restored) nor samples reported. Their replacements wait."""
        limit = self._config.spare_refill_after_s
        restoring = 0
        for node_id, (since, first_step) in list(self._promoted_at.items()):
            node = self._nodes[node_id]
            if node.state is not NodeState.RUNNING or now - since >= limit or node.samples > 0:
                del self._promoted_at[node_id]  # failed, waited long enough, or trained: no longer held
                continue
            if node.step >= 0 and first_step is None:
                self._promoted_at[node_id] = (since, node.step)
            elif first_step is not None and node.step > first_step:
                del self._promoted_at[node_id]  # a step trained after the restore
                continue
            restoring += 1
        return restoring

    def _spare_loss_limit(self) -> int:
        return self._config.max_relaunches * self._config.spare_nodes

    def _spares_lost(self, now: float) -> int:
        """Spares lost within the budget window."""
        return self._config.budget_window.count(self._spare_failure_times, self._wall(now))

    def _spare_losses_spent(self, now: float) -> bool:
        """Whether the spares lost within the window leave none to replace (none lost: never)."""
        lost = self._spares_lost(now)
        return 0 < lost >= self._spare_loss_limit()

    def _create_spare(self, now: float, reason: str) -> Outcome:
        """A new PENDING spare: launched like a node, holding no rank (-1)."""
        group = self._config.worker_group
        node_id = self._next_node_id
        self._next_node_id += 1
        node = NodeRecord(
            node_id=node_id,
            rank=-1,
            state=NodeState.PENDING,
            last_heartbeat=now,
            state_since=now,
            history=(TransitionRecord(None, NodeState.PENDING, f"spare: {reason}", now),),
            role=group.role,
            resources=group.resources,
            spare=True,
        )
        self._nodes[node_id] = node
        ev = Event("node_created", f"spare node {node_id} created: {reason}", node_id, None, {"spare": True})
        launch = self.launch_of(node_id)
        return Outcome(effects=(launch,), events=(ev,), changed_nodes=frozenset({node_id}), job_changed=True)

    def _ready_spare(self, resources: Resources | None) -> NodeRecord | None:
        """The spare to promote: registered and running, on a host not avoided, launched with
        `resources` when a relaunch needs those (a host-OOM relaunch with more memory); the oldest."""
        for spare in self.spare_nodes():
            if spare.state is not NodeState.RUNNING or spare.host in self._avoid_hosts:
                continue
            if resources is not None and self._launched_with(spare) != resources:
                continue
            return spare
        return None

    def _promote(
        self, spare: NodeRecord, rank: int, relaunch_count: int, reason: str, now: float, *, replaces: NodeRecord | None
    ) -> Outcome:
        """`spare` takes `rank` (of `replaces`, when it replaces a node): an ordinary ranked node from now on.

        Its rank is `relaunch_count`'s incarnation, so a promotion spends the relaunch the
        decision spent; the rendezvous admits it at the next round (the master stops holding it
        in reserve there).
        """
        promoted = attrs.evolve(
            spare,
            rank=rank,
            spare=False,
            relaunch_count=relaunch_count,
            replaces=None if replaces is None else replaces.node_id,
        )
        self._nodes[spare.node_id] = promoted
        self._current[rank] = spare.node_id
        self._promoted_at[spare.node_id] = (now, None)
        whose = "" if replaces is None else f" of node {replaces.node_id}"
        limit = self._config.spare_refill_after_s
        # Said here, or a user who counts the spares in `status` sees one missing and nothing launched.
        refill = (
            f"; the next spare is launched once it trained a step, or after {limit:g} s (--spare-refill-after-s), "
            "so its start-up does not slow the restore"
            if limit > 0 and self._config.spare_nodes > 0
            else ""
        )
        ev = Event(
            "spare_promoted",
            f"spare node {spare.node_id} takes rank {rank}{whose} at the next round: {reason}{refill}",
            spare.node_id,
            rank,
            {
                "spare": spare.node_id,
                "rank": rank,
                "replaces": None if replaces is None else replaces.node_id,
                "reason": reason,
                "host": spare.host,
                "refill_after_s": limit,
            },
        )
        return Outcome(events=(ev,), changed_nodes=frozenset({spare.node_id}), job_changed=True)

    def _plan_round(self, nodes: Iterable[NodeRecord], why: str, *, save_first: bool = False) -> None:
        """Queue a planned round's restart for each running node not already told (see `_shrink`):
        delivered with its next heartbeat, or answering its workers' failure first, with no budget
        spent. `save_first` marks it `Action.planned_round` (the workers seal a flash checkpoint
        before the restart): right for a resize, wrong after a failure, whose collectives are broken."""
        for node in nodes:
            if node.state is not NodeState.RUNNING:
                continue
            if node.node_id in self._planned_round:
                if not save_first:  # a failure's round comes too: broken collectives cannot save
                    self._drop_save_first(node.node_id)
                continue
            action_id = self._queue_action(node.node_id, ActionKind.RESTART_PROCESSES, why, planned_round=save_first)
            self._planned_round[node.node_id] = action_id

    def _queue_action(self, node_id: int, kind: ActionKind, reason: str, *, planned_round: bool = False) -> int:
        """Queue an action for the node's next heartbeat; returns its id."""
        action = Action(self._next_action_id, kind, reason, planned_round=planned_round)
        self._actions[node_id] = (*self._actions.get(node_id, ()), action)
        self._work_changed.add(node_id)
        self._next_action_id += 1
        return action.action_id

    def _round_planned(self, why: str) -> Outcome:
        """A ``planned_round`` event naming the nodes the next round is for: every running ranked
        node (those staying restart for it, a promoted spare joins it). The rendezvous forms that
        round as soon as all of them joined, and waits for a slow one rather than form a round
        without it and another when it comes. A node not running yet is not waited for."""
        planned = sorted(n.node_id for n in self.live_nodes() if n.state is NodeState.RUNNING)
        if not planned:
            return Outcome()
        # The event's data names them all; its message, read by people, at most 16.
        names = ", ".join(map(str, planned[:16])) + (f" and {len(planned) - 16} more" if len(planned) > 16 else "")
        ev = Event("planned_round", f"next round planned for node(s) {names}: {why}", data={"nodes": planned})
        return Outcome(events=(ev,))

    def _drop_save_first(self, node_id: int) -> None:
        """The node's queued planned restart no longer asks its workers to save first."""
        queued = self._planned_round[node_id]
        self._work_changed.add(node_id)
        self._actions[node_id] = tuple(
            attrs.evolve(a, planned_round=False) if a.action_id == queued else a for a in self._actions.get(node_id, ())
        )

    def _fail_observed(self, node: NodeRecord, evidence: str, now: float) -> Outcome:
        """A node the master saw go silent or never register (`tick`)."""
        if node.spare:
            return self._lose_spare(node, LOST_NODE_KIND, evidence, now)[1]
        return self._fail(node, LOST_NODE_KIND, evidence, now, observed=True)[1]

    def _lose_spare(self, node: NodeRecord, kind: FailureKind, evidence: str, now: float) -> tuple[Decision, Outcome]:
        """A spare failed: it held no rank, so nothing restarts; it is stopped, and `keep_spares`
        launches another while fewer than `max_relaunches` x `spare_nodes` spares were lost
        within the budget window. Not counted against `max_job_failures`: no training was disturbed."""
        self._spare_failures += 1
        limit = self._spare_loss_limit()
        # One loss is kept whatever the limit: with none allowed, the first stops the replacements.
        self._spare_failure_times = BudgetWindow.add(self._spare_failure_times, self._wall(now), max(limit, 1))
        lost = self._spares_lost(now)
        headline = one_line_summary(evidence)
        node = attrs.evolve(node, **_last_failure(kind, evidence))
        self._nodes[node.node_id] = node
        window = self._config.budget_window
        if lost < limit:
            then = f"another spare is launched when there is room ({lost} of {limit} spare losses{window.per()})"
        else:
            until = "" if window.seconds is None else " until one of those losses is older than the window"
            then = (
                f"{lost} spares lost, max_relaunches x spare_nodes = {limit}{window.per()}: "
                f"no more spares are launched{until}"
            )
        reason = f"spare node {node.node_id} failed ({kind.value}: {headline}); it held no rank: {then}"
        out = self._move(node, NodeState.FAILED, f"{kind.value}: {headline}", now)
        self._forget_work(node.node_id, planned=False)
        ev = Event(
            "spare_lost",
            reason,
            node.node_id,
            None,
            {"kind": kind.value, "evidence": evidence, "spare_failures": self._spare_failures, "limit": limit},
        )
        out = out.merge(Outcome(effects=(StopNode(node.node_id, reason),), events=(ev,), job_changed=True))
        return Decision(ActionKind.REMOVE_NODE, kind, str(node.node_id), reason), out

    def restart_budget(self, node: NodeRecord) -> int:
        """The process restarts `node` may take: what its agent declared, else the configured."""
        return self._config.max_process_restarts if node.max_process_restarts is None else node.max_process_restarts

    def restarts_of(self, node: NodeRecord) -> RestartBudget:
        """`node`'s process restarts: the journaled count against its budget, the one count every
        decision and message uses."""
        source = "max_process_restarts" if node.max_process_restarts is None else "--max-restarts"
        return RestartBudget(node.process_restarts, self.restart_budget(node), source)

    def _failure(
        self,
        node: NodeRecord,
        kind: FailureKind,
        evidence: str,
        now: float,
        exit_code: int | None,
        *,
        observed: bool,
        classification: Classification | None,
        agent_exits: bool,
    ) -> Failure:
        """The failure with every fact the policy decides on (see `Failure`)."""
        # Incarnations the platform took away (`node_disrupted`) are not the rank's failures: they
        # are not in `relaunched_at`.
        window, limit = self._config.budget_window, self._config.max_relaunches
        charged = window.count(node.relaunched_at, self._wall(now))
        relaunches = RelaunchBudget(min(charged, limit), limit, f"max_relaunches{window.per()}")
        return Failure(
            node,
            kind,
            evidence,
            self.restarts_of(node),
            relaunches,
            exit_code,
            classification,
            backend_relaunches=self._scheduler_relaunches,
            observed_by_master=observed,
            agent_exits=agent_exits,
            wall_time=self._wall(now),
        )

    @staticmethod
    def _applicable(failure: Failure, decision: Decision) -> Decision:
        """The policy's decision, unless it cannot be carried out at all; then the node leaves the
        job, and the decision's words say why.

        No budget is checked here: the policy spent them (the built-in ones through
        `spend_restart`, with the same facts). What is refused is what no one could do: no
        action for a node whose processes failed, or a restart with no agent to carry it out.
        """
        if decision.action is ActionKind.NONE:
            why = "a node whose processes failed needs an action"
        elif decision.action.restarts_processes and failure.no_restart:
            why = failure.no_restart
        else:
            return decision
        return attrs.evolve(
            decision,
            action=ActionKind.REMOVE_NODE,
            outcome=f"{decision.outcome}; but the failure policy's {decision.action.value} cannot be carried out "
            f"({why}): the node leaves the job",
            avoid_host=False,
        )

    def _fail(
        self,
        node: NodeRecord,
        kind: FailureKind,
        evidence: str,
        now: float,
        exit_code: int | None = None,
        *,
        observed: bool = False,
        answered: bool = False,
        classification: Classification | None = None,
        agent_exits: bool = False,
        restarted: bool = False,
    ) -> tuple[Decision, Outcome]:
        """Charge a failure of `node` to the budgets, decide and apply. With `restarted`, it is an awaited
        failure charged late (`_charge_awaited`): its workers restarted already."""
        settled = Outcome()
        if node.awaiting_cause is not None and not restarted:
            decided = _decided_kind(kind, classification)
            if observed or agent_exits or decided not in PEER_CONSEQUENCE_KINDS:
                settled = self._own_explains_awaited(node, f"{decided.value}: {one_line_summary(evidence)}")
            else:
                # A second collective error in a row: both are the node's own. The first is charged and
                # carried out; where that ends the node (or the job), the second is the same trouble.
                charged, settled = self._charge_awaited(node, now)
                if self._nodes[node.node_id].state not in ALIVE_STATES or self._job_state.finished:
                    return charged, settled
            node = self._nodes[node.node_id]
        decision, out = self._fail_once(
            node,
            kind,
            evidence,
            now,
            exit_code,
            observed=observed,
            answered=answered,
            classification=classification,
            agent_exits=agent_exits,
            restarted=restarted,
        )
        return decision, settled.merge(out)

    def _charge(
        self,
        node: NodeRecord,
        kind: FailureKind,
        evidence: str,
        now: float,
        exit_code: int | None,
        *,
        observed: bool,
        classification: Classification | None,
        agent_exits: bool,
    ) -> Decision:
        """Count the failure against the job's budget and decide: the job stops past `max_job_failures`,
        else the policy decides (spending the node's budgets), as far as it can be carried out."""
        self._job_failures += 1
        window, limit = self._config.budget_window, self._config.job_failure_limit
        self._job_failure_times = window.add(self._job_failure_times, self._wall(now), limit + 1)
        counted = window.count(self._job_failure_times, self._wall(now))
        if counted > limit:
            within = f"in {window.per().removeprefix(' per ')}" if window.seconds is not None else "in the job"
            # No policy decides, but the evidence was read (`classify`): the stop names what it shows,
            # not the agent's report, which is often only "unknown" (an exit code).
            shown = _decided_kind(kind, classification)
            decision = Decision(
                ActionKind.ABORT_JOB,
                shown,
                str(node.node_id),
                f"node {node.node_id} (rank {node.rank}) failed ({shown.value}): {counted} failures {within}, "
                f"more than max_job_failures {limit}: the job stops",
            )
        else:
            failure = self._failure(
                node,
                kind,
                evidence,
                now,
                exit_code,
                observed=observed,
                classification=classification,
                agent_exits=agent_exits,
            )
            decision = self._applicable(failure, self._policy.decide(failure))
            if decision.action is not ActionKind.ABORT_JOB and self.count(NodeState.SUCCEEDED):
                # The job is finishing (torchrun's rule): the succeeded nodes left the rendezvous,
                # so the node can neither restart with them nor be replaced. Not a budget: no
                # decision of any policy could be carried out, save ending the job.
                decision = attrs.evolve(
                    decision,
                    action=ActionKind.REMOVE_NODE,
                    outcome=f"{decision.outcome}; but workers have already succeeded: the node is not relaunched",
                    avoid_host=False,
                )
        return decision

    def _fail_once(
        self,
        node: NodeRecord,
        kind: FailureKind,
        evidence: str,
        now: float,
        exit_code: int | None,
        *,
        observed: bool,
        answered: bool,
        classification: Classification | None,
        agent_exits: bool,
        restarted: bool,
    ) -> tuple[Decision, Outcome]:
        was_running = node.state is NodeState.RUNNING
        node = attrs.evolve(node, **_last_failure(kind, evidence))
        self._nodes[node.node_id] = node
        # The evidence (a worker's traceback, say) is printed whole once, by the worker itself;
        # the messages that are logged carry one line of it, the failure event all of it.
        headline = one_line_summary(evidence)
        decision = self._charge(
            node,
            kind,
            evidence,
            now,
            exit_code,
            observed=observed,
            classification=classification,
            agent_exits=agent_exits,
        )
        # The kind the decision was made on (the policy's reading of the evidence), which the
        # metrics count by; the agent's own report is often only "unknown" (an exit code).
        failure_ev = _failure_event(node, decision, kind, evidence, observed=observed, restarted=restarted)
        out = Outcome(events=(failure_ev,), changed_nodes=frozenset({node.node_id}), job_changed=True)
        decided = decision.kind
        if was_running and not restarted and (observed or agent_exits or decided not in PEER_CONSEQUENCE_KINDS):
            out = out.merge(self._excuse_awaited(node, f"{decided.value}: {headline}"))
        node = attrs.evolve(node, **_last_failure(decided, evidence))
        self._nodes[node.node_id] = node
        decision, relaunch_with, grown = self._grow_memory(node, decision)
        out = out.merge(grown)
        if decision.avoid_host and node.host and node.host == self._single_host:
            decision = attrs.evolve(
                decision,
                avoid_host=False,
                outcome=f"{decision.outcome}; but host {node.host!r} is not avoided: every node of this backend "
                "runs on it, so a replacement that avoided it could not be placed",
            )
        reason = decision.outcome
        if decision.avoid_host and node.host:
            out = out.merge(self.mark_host_unhealthy(node.host, f"{decided.value} on node {node.node_id}"))
        if decision.action.restarts_processes:
            node = attrs.evolve(node, process_restarts=node.process_restarts + 1)
            self._nodes[node.node_id] = node
            if restarted:
                return decision, out  # the restart happened when the failure was reported
            self._restarted_at[node.node_id] = now
            if not answered:
                self._queue_action(node.node_id, decision.action, reason)
            ev = Event(
                "process_restart",
                reason,
                node.node_id,
                node.rank,
                {"kind": decided.value},
            )
            return decision, out.merge(Outcome(events=(ev,)))
        out = out.merge(self._move(node, NodeState.FAILED, f"{decided.value}: {headline}", now))
        node = self._nodes[node.node_id]
        self._forget_work(node.node_id, planned=False)
        # Whatever follows, this incarnation is finished: its agent and processes are stopped.
        out = out.merge(Outcome(effects=(StopNode(node.node_id, reason),)))
        if decision.action is ActionKind.ABORT_JOB:
            return decision, out.merge(self.stop(reason, now, state=JobState.FAILED))
        if decision.action.relaunches_node:
            out = out.merge(self._relaunch(node, decided, reason, relaunch_with, now))
        else:
            out = out.merge(self._move(node, NodeState.REMOVED, reason, now))
        out = out.merge(self._check_nodes(now, cause=reason))
        if self._job_state is JobState.FAILED:
            # This failure ended the job: the action taken is the stop, and its reason is the
            # job's exit reason, the same string the agent, the event log and the status show.
            decision = attrs.evolve(decision, action=ActionKind.ABORT_JOB, outcome=self._exit_reason, avoid_host=False)
        return decision, out

    def _relaunch(
        self,
        node: NodeRecord,
        kind: FailureKind,
        reason: str,
        relaunch_with: Resources | None,
        now: float,
        *,
        disrupted: bool = False,
    ) -> Outcome:
        """Replace the failed `node` in its rank: by a ready warm spare, else by a new node launched with
        `relaunch_with` (as `node` was launched when None). `disrupted`: the platform took `node` away, so
        this relaunch is not charged to the rank (`NodeRecord.disruptions`)."""
        out = self._move(node, NodeState.RELAUNCHING, reason, now)
        # A spare stands in only with the resources the rank needs: a node grown after a host
        # OOM must not fall back to the group's base memory because it failed for another reason.
        spare = self._ready_spare(self._launched_with(node) if relaunch_with is None else relaunch_with)
        if spare is not None:
            # A warm spare takes the rank at the next round, without waiting for a launch: the
            # nodes that stay restart their workers for that round at once (a planned round, as
            # for a shrink), rather than wait out a save their broken collective cannot finish.
            out = out.merge(self._promote(spare, node.rank, node.relaunch_count + 1, reason, now, replaces=node))
            # A node whose workers already restarted after this one last showed life (their
            # collective broke when it died) joins the spare's round by itself: told again, it
            # would restart a second time, in the new round.
            why = f"planned round: spare node {spare.node_id} takes rank {node.rank} of node {node.node_id}"
            self._plan_round(
                (
                    n
                    for n in self.live_nodes()
                    if n.node_id not in (node.node_id, spare.node_id)
                    and self._restarted_at.get(n.node_id, -math.inf) < node.last_heartbeat
                ),
                why,
            )
            out = out.merge(self._round_planned(why))
        else:
            resources = self._launched_with(node) if relaunch_with is None else relaunch_with
            out = out.merge(
                self._create_node(node.rank, node.relaunch_count + 1, node.node_id, now, reason, resources=resources)
            )
        new_id = self._current[node.rank]
        self._nodes[node.node_id] = attrs.evolve(self._nodes[node.node_id], replaced_by=new_id)
        charged = node.relaunched_at
        if not disrupted:
            charged = BudgetWindow.add(charged, self._wall(now), self._config.max_relaunches)
        if node.disruptions or disrupted or charged:
            self._nodes[new_id] = attrs.evolve(
                self._nodes[new_id], disruptions=node.disruptions + int(disrupted), relaunched_at=charged
            )
        if spare is not None:
            replaced = f"replaced by spare node {new_id}"
        elif self._scheduler_relaunches:
            replaced = f"replaced by node {new_id}"
        else:
            replaced = f"let go; node {new_id} waits for an agent to register in its place"
        ev = Event(
            "relaunch",
            f"rank {node.rank}: node {node.node_id} {replaced}: {reason}",
            node.node_id,
            node.rank,
            {"replacement": new_id, "kind": kind.value, "spare": spare is not None},
        )
        return out.merge(Outcome(events=(ev,)))

    def _grow_memory(self, node: NodeRecord, decision: Decision) -> tuple[Decision, Resources | None, Outcome]:
        """For a relaunch with more memory: the decision as amended, the resources to relaunch with (None:
        as the node was) and the `oom_relaunch` event; any other decision passes unchanged."""
        if decision.action is not ActionKind.RELAUNCH_WITH_MORE_MEMORY:
            return decision, None, Outcome()
        relaunch_with, oom_event, refusal = self._more_memory(node)
        if relaunch_with is not None and decision.avoid_host:
            # The node reached its own memory limit, which the relaunch raises: the host is not to blame.
            decision = attrs.evolve(decision, avoid_host=False, outcome=f"{decision.outcome}; the host is not avoided")
        if refusal:
            decision = attrs.evolve(
                decision, action=ActionKind.ABORT_JOB, outcome=f"{decision.outcome}; but {refusal}: the job stops"
            )
        return decision, relaunch_with, Outcome(events=(oom_event,))

    def _launched_with(self, node: NodeRecord) -> Resources | None:
        """What `node` was launched with; the group's resources for a node journaled before records kept them."""
        return node.resources if node.resources is not None else self._config.worker_group.resources

    def _more_memory(self, node: NodeRecord) -> tuple[Resources | None, Event, str]:
        """The resources to relaunch a node killed for host OOM with (dlrover.autoscale's `plan_oom_relaunch`).

        Returns:
            The grown resources (None: relaunch as it was), the `oom_relaunch` event carrying the decision and
            its inputs, and a refusal (non-empty when the node was already at the memory cap: the job stops).
        """
        old = self._launched_with(node)
        cap = self._config.max_node_memory_mb
        factor = self._config.oom_memory_growth
        who = f"node {node.node_id} (rank {node.rank})"
        data: dict[str, object] = {
            "memory_mb": None if old is None else old.memory_mb,
            "growth_factor": factor,
            "max_node_memory_mb": cap,
        }

        def event(message: str, new: Resources | None) -> Event:
            facts = {**data, "new_memory_mb": None if new is None else new.memory_mb}
            return Event("oom_relaunch", message, node.node_id, node.rank, facts)

        if not self._scheduler_relaunches:
            why = "this job's backend starts no node itself, so no memory can be added: the next agent brings its own"
            return None, event(f"{who} ran out of host memory; {why}", None), ""
        if old is None or old.memory_mb == 0:
            why = "relaunched as it was (no growth possible without a limit; give --node-memory to have one)"
            return None, event(f"{who} ran out of host memory with no memory limit: {why}", None), ""
        if cap is not None and old.memory_mb >= cap:
            refusal = f"{who} ran out of memory at {old.memory_mb} MiB, already at max_node_memory_mb {cap}"
            return None, event(f"{refusal}: not relaunched; the job stops", None), refusal
        # Without a cap the heuristic still needs one: one above the grown size never binds.
        limit = cap if cap is not None else math.ceil(old.memory_mb * factor) + 1
        plan = plan_oom_relaunch(
            # The lifecycle's relaunch budget allowed this relaunch already: the heuristic's own is not used.
            OomEvent(PlannedNode(node.node_id, node.role, old)),
            OomConfig(growth_factor=factor, max_step_mb=limit, min_step_mb=0, cap_mb=limit, max_relaunches=1),
        )
        if not plan.resize:
            return None, event(f"{plan.reason}: relaunched as it was", None), ""
        grown = plan.resize[0].resources
        return grown, event(f"{plan.reason} (x{factor:g}, max_node_memory_mb {cap})", grown), ""

    def _alive(self) -> Iterable[NodeRecord]:
        """The ranked nodes that are pending, starting or running (spares train nothing)."""
        return (n for n in self._nodes.values() if n.state in ALIVE_STATES and not n.spare)

    def _check_nodes(self, now: float, *, cause: str = "") -> Outcome:
        """End the job when no node is left, or too few have run for too long.

        `cause`: what just let a node go, leading the exit reason when that left no node.
        """
        if self._job_state.finished or not self._started:
            return Outcome()
        # Counted, not scanned: this runs on nearly every call (see `NodeTable`).
        succeeded = self._nodes.count(NodeState.SUCCEEDED)
        if not self._nodes.alive_ranked():
            if succeeded:
                return self.stop(f"all nodes finished; {succeeded} succeeded", now, state=JobState.SUCCEEDED)
            if cause:
                return self.stop(f"{cause}; no node is left: the job stops", now, state=JobState.FAILED)
            return self.stop("no nodes left: every rank failed beyond its budget", now, state=JobState.FAILED)
        if succeeded:
            return self._finishing(list(self._alive()), succeeded, now)
        return self._check_insufficient(self._nodes.count(NodeState.RUNNING, spare=False), now)

    def _finishing(self, alive: list[NodeRecord], succeeded: int, now: float) -> Outcome:
        """The job is finishing: nodes leave one by one as they succeed. A node that never joined (pending,
        or started but not registered: a pod placed only once a finished node made room) has no part in the
        training that is ending: it is let go, not left waiting for a round that never comes."""
        out = Outcome()
        for node in [n for n in alive if n.state in (NodeState.PENDING, NodeState.STARTING)]:
            why = (
                f"the job is finishing ({succeeded} node(s) succeeded) and node {node.node_id} (rank "
                f"{node.rank}) never joined its training: it is stopped"
            )
            out = out.merge(self._move(node, NodeState.REMOVED, why, now))
            out = out.merge(Outcome(effects=(StopNode(node.node_id, why),), job_changed=True))
        self._insufficient_since = None
        if not self._nodes.alive_ranked():
            return out.merge(self.stop(f"all nodes finished; {succeeded} succeeded", now, state=JobState.SUCCEEDED))
        return out

    def _check_insufficient(self, running: int, now: float) -> Outcome:
        minimum = self._config.nodes.min_nodes
        if running >= minimum:
            self._insufficient_since = None
            return Outcome()
        if self._insufficient_since is None:
            self._insufficient_since = now
        waited = now - self._insufficient_since
        if waited < self._config.insufficient_nodes_window_s:
            return Outcome()
        pending = sorted(
            (n.node_id, self._pending_reasons[n.node_id])
            for n in self._alive()
            if n.state in (NodeState.PENDING, NodeState.STARTING) and n.node_id in self._pending_reasons
        )
        why = "".join(f"; node {nid} pending: {one_line_summary(text)}" for nid, text in pending)
        return self.stop(
            f"insufficient nodes: {running} running < min_nodes {minimum} for {waited:.1f}s "
            f"(window {self._config.insufficient_nodes_window_s:g}s){why}",
            now,
            state=JobState.FAILED,
        )
