"""Immutable records the lifecycle core hands out: nodes, their history, actions, effects, events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from dlrover.autoscale import Resources, Role
from dlrover.common import DLRoverError
from dlrover.diagnosis import ActionKind, FailureKind
from dlrover.diagnosis.window import UseTimes, use_times_from_json
from dlrover.master.states import JobState, NodeState

__all__ = [
    "Action",
    "AwaitedCharge",
    "Event",
    "LaunchNode",
    "LifecycleSnapshot",
    "NodeRecord",
    "Outcome",
    "PendingWork",
    "ResourceSample",
    "StopNode",
    "TransitionRecord",
    "actions_from_json",
    "actions_to_json",
    "node_from_dict",
    "node_to_dict",
    "pending_work_from_json",
    "pending_work_to_json",
]


@attrs.frozen
class ResourceSample:
    """A node's latest resource use, as its agent reported it."""

    cpu_percent: float = 0.0
    memory_bytes: int = 0
    gpu_percent: float = 0.0
    gpu_memory_bytes: int = 0


@attrs.frozen
class TransitionRecord:
    """One edge a node took, and why.

    Attributes:
        from_state: the state left (None for the node's creation).
        to_state: the state entered.
        reason: why, in words.
        at: the core's `now` when it happened (monotonic within one master process).
    """

    from_state: NodeState | None
    to_state: NodeState
    reason: str
    at: float


@attrs.frozen
class AwaitedCharge:
    """A collective error or hang of a node's workers, for which no cause was known when it was
    reported: the workers restarted at once, and the failure is charged to the node's budgets only
    if no peer's own failure explains it within `LifecycleConfig.peer_cause_wait`
    (`JobLifecycle.report_failure`).

    Attributes:
        kind: the kind the agent reported.
        decided: the kind the evidence shows (the policy's classification, else `kind`).
        reason: the classification's words (None: the policy classified nothing).
        evidence: what the agent saw (clipped).
        exit_code: the failed process's status, when known.
        since: the core's `now` when it was reported (a resumed master counts from its start).
    """

    kind: FailureKind
    decided: FailureKind
    reason: str | None
    evidence: str
    exit_code: int | None
    since: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (for the journal)."""
        return {
            "kind": self.kind.value,
            "decided": self.decided.value,
            "reason": self.reason,
            "evidence": self.evidence,
            "exit_code": self.exit_code,
            "since": self.since,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AwaitedCharge:
        """The inverse of `to_json`.

        Raises:
            KeyError, TypeError, ValueError: not what `to_json` writes.
        """
        exit_code = data["exit_code"]
        if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
            raise TypeError(f"exit_code must be an integer or null, got {exit_code!r}")
        return cls(
            FailureKind(data["kind"]),
            FailureKind(data["decided"]),
            None if data["reason"] is None else str(data["reason"]),
            str(data["evidence"]),
            exit_code,
            float(data["since"]),
        )


@attrs.frozen
class NodeRecord:
    """One incarnation of a logical rank.

    Attributes:
        node_id: unique in the job, never reused.
        rank: the logical rank; a replacement keeps the rank of the node it replaces.
        state: where it is in its life.
        relaunch_count: how many incarnations of this rank came before this one.
        process_restarts: training-process restarts on this incarnation.
        max_process_restarts: the restarts its agent allows (``dlrover-run --max-restarts``), as
            the agent declared when it registered; None (an agent that declared none): the
            lifecycle's `max_process_restarts` applies.
        name: the agent's self-given name (host name and slot), once registered.
        host: the host it runs on, once known.
        registered: whether its agent has registered.
        last_heartbeat: `now` of the last sign of life.
        state_since: `now` when it entered its state.
        step: the newest training step it reported (-1 before any).
        samples: samples it reported consumed so far.
        replaces: the node it replaced.
        replaced_by: the node that replaced it.
        last_failure: the kind and evidence of its last failure.
        history: every transition with its reason.
        role: the node group it belongs to.
        resources: what it was launched with (None: nothing asked, no limit). A node relaunched after a host
            OOM has more memory than the one it replaced.
        spare: a warm spare (`LifecycleConfig.spare_nodes`): it holds no rank (`rank` is -1) until it
            takes over the rank of a node the master relaunches; then it is an ordinary node.
        disruptions: how many of the incarnations before this one the platform took away (evicted,
            preempted, their host lost): counted in `relaunch_count` but not charged to `max_relaunches`.
        relaunched_at: when the rank's relaunches charged to `max_relaunches` were decided (wall
            seconds; None: unknown, journaled before the times were), the newest `max_relaunches`:
            those within the budget window count against it.
        registration_digest: SHA-256 (hex) of the registration key its agent registered with ("":
            none): a registration repeated with that key is the same one (`JobLifecycle.register`).
        awaiting_cause: its workers' collective error or hang that waits for a peer's failure to
            explain it before it is charged (`AwaitedCharge`), or None.
        failure_data_suspect: whether the samples its processes trained may have caused its last
            failure (False when the platform took it away or the failure's kind is one of
            `dlrover.diagnosis.KINDS_NOT_FROM_DATA`): what a restarted master tells the data
            libraries again about its departure (True when journaled before it was kept).
    """

    node_id: int
    rank: int
    state: NodeState
    relaunch_count: int = 0
    process_restarts: int = 0
    max_process_restarts: int | None = None
    name: str = ""
    host: str = ""
    registered: bool = False
    last_heartbeat: float = 0.0
    state_since: float = 0.0
    step: int = -1
    samples: int = 0
    replaces: int | None = None
    replaced_by: int | None = None
    last_failure: str = ""
    history: tuple[TransitionRecord, ...] = ()
    role: Role = Role.WORKER
    resources: Resources | None = None
    spare: bool = False
    disruptions: int = 0
    relaunched_at: UseTimes = ()
    registration_digest: str = ""
    awaiting_cause: AwaitedCharge | None = None
    failure_data_suspect: bool = True


@attrs.frozen
class Action:
    """Something an agent is asked to do; delivered on its next heartbeat answer.

    Journaled by `kind`'s value, so pending actions of older journals (``"restart_processes"``)
    restore as they were.

    Attributes:
        action_id: unique within the job, increasing.
        kind: what to do.
        reason: why, in a sentence.
        planned_round: a restart for a planned round (a resize let nodes go), not for a failure,
            or a removal of a node a shrink let go: the agent has its workers seal a flash
            checkpoint before it restarts or stops them, so the new round redoes no step.
    """

    action_id: int
    kind: ActionKind
    reason: str
    planned_round: bool = False


@attrs.frozen
class LaunchNode:
    """Effect: the scheduler must start this node.

    Attributes:
        node_id: the new node.
        rank: its logical rank (-1 for a spare, which holds none).
        relaunch_count: how many incarnations of the rank came before.
        avoid_hosts: hosts it must not be placed on.
        role: its node group.
        resources: what to launch it with; None: nothing asked (the backend's default, no memory limit).
    """

    node_id: int
    rank: int
    relaunch_count: int
    avoid_hosts: frozenset[str] = frozenset()
    role: Role = Role.WORKER
    resources: Resources | None = None


@attrs.frozen
class StopNode:
    """Effect: the scheduler must stop this node."""

    node_id: int
    reason: str


@attrs.frozen
class Event:
    """Something that happened to the job, for the event log, the journal and metrics.

    Attributes:
        kind: a short name: node_created, node_state, failure, process_restart, relaunch, job_end, ...
        message: a sentence for people.
        node_id: the node concerned, if any.
        rank: its logical rank, if any.
        data: extra JSON-serialisable facts (failure kind, states, counts).
    """

    kind: str
    message: str
    node_id: int | None = None
    rank: int | None = None
    data: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Outcome:
    """What one core call changed: effects to apply, events to record, nodes to journal."""

    effects: tuple[LaunchNode | StopNode, ...] = ()
    events: tuple[Event, ...] = ()
    changed_nodes: frozenset[int] = frozenset()
    job_changed: bool = False

    def merge(self, other: Outcome) -> Outcome:
        """Both outcomes, this one first."""
        return Outcome(
            effects=self.effects + other.effects,
            events=self.events + other.events,
            changed_nodes=self.changed_nodes | other.changed_nodes,
            job_changed=self.job_changed or other.job_changed,
        )


@attrs.frozen
class PendingWork:
    """What a node is owed, journaled per node so handing it over rewrites one row, not the job's
    record (with every node's queue in the job record, a restart queued for every node and handed to
    each in turn cost O(nodes²) journal writes: 18 s of master CPU at 2,048 nodes)."""

    actions: tuple[Action, ...] = ()
    """Actions decided and not yet handed to the node, oldest first."""
    planned_round: int | None = None
    """The id of the queued action that restarts the node for a planned round, if one is queued."""

    @property
    def empty(self) -> bool:
        """Whether the node is owed nothing."""
        return not self.actions and self.planned_round is None


def pending_work_to_json(work: PendingWork) -> dict[str, Any]:
    """A JSON-serialisable form of one node's `PendingWork` (for the journal)."""
    return {"actions": [_action_to_dict(a) for a in work.actions], "planned_round": work.planned_round}


def pending_work_from_json(data: Any) -> PendingWork:
    """The inverse of `pending_work_to_json`.

    Raises:
        DLRoverError: the data is not what `pending_work_to_json` writes.
    """
    try:
        planned = data["planned_round"]
        if planned is not None and (isinstance(planned, bool) or not isinstance(planned, int)):
            raise TypeError(f"planned_round must be an action id or null, got {planned!r}")
        actions = tuple(_action_from_dict(a) for a in data["actions"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DLRoverError(f"corrupt pending work {data!r}: {exc}") from exc
    return PendingWork(actions, planned)


@attrs.frozen
class LifecycleSnapshot:
    """Everything the lifecycle core needs to resume after a master restart."""

    nodes: tuple[NodeRecord, ...]
    job_state: JobState
    exit_reason: str
    job_failures: int
    next_node_id: int
    next_action_id: int
    avoid_hosts: Mapping[str, str]
    started: bool
    actions: Mapping[int, tuple[Action, ...]] = attrs.field(factory=dict)
    """Actions decided for a node and not yet handed to it, by node id."""
    policy_state: str = ""
    """The failure policy's budget counters (`JournaledPolicy.export_state`); empty when it keeps none."""
    target_nodes: int | None = None
    """How many nodes the job is sized to now (None: a journal from before resizing: `max_nodes`)."""
    wanted_nodes: int | None = None
    """How many nodes the last resize request asked for (None: `max_nodes`); the job grows back
    toward it when the backend's capacity allows."""
    planned_round: Mapping[int, int] = attrs.field(factory=dict)
    """Nodes told to restart for a planned round (a peer left by a resize), with the action's id."""
    spare_failures: int = 0
    """Spare nodes lost so far (they bound how often a lost spare is replaced)."""
    job_failure_times: UseTimes | None = None
    """When the newest failures counted against `max_job_failures` happened (wall seconds); None:
    a journal from before they were kept (its `job_failures` count for ever)."""
    spare_failure_times: UseTimes | None = None
    """When the newest spares were lost (wall seconds); None: a journal from before they were kept."""
    current: Mapping[int, int] | None = None
    """The node serving each rank (None: a journal from before spares; the newest node of each rank).
    A promoted spare may have an older id than a node created for its rank before it."""


def actions_to_json(actions: Mapping[int, Sequence[Action]]) -> dict[str, list[dict[str, Any]]]:
    """A JSON-serialisable form of pending actions (for the journal's job record)."""
    return {str(node_id): [_action_to_dict(a) for a in queued] for node_id, queued in sorted(actions.items()) if queued}


def _action_to_dict(action: Action) -> dict[str, Any]:
    return {
        "action_id": action.action_id,
        "kind": action.kind.value,
        "reason": action.reason,
        "planned_round": action.planned_round,
    }


def _action_from_dict(data: Any) -> Action:
    """The inverse of `_action_to_dict` (raises KeyError, TypeError or ValueError on other data)."""
    # "planned_round" is absent in journals written before planned rounds saved first.
    return Action(
        int(data["action_id"]), ActionKind(data["kind"]), str(data["reason"]), _flag(data.get("planned_round", False))
    )


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"planned_round must be true or false, got {value!r}")
    return value


def actions_from_json(data: Mapping[str, Any]) -> dict[int, tuple[Action, ...]]:
    """The inverse of `actions_to_json`.

    Raises:
        DLRoverError: the data is not what `actions_to_json` writes.
    """
    try:
        return {int(node_id): tuple(_action_from_dict(a) for a in queued) for node_id, queued in dict(data).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise DLRoverError(f"corrupt pending actions {dict(data)!r}: {exc}") from exc


def node_to_dict(node: NodeRecord) -> dict[str, Any]:
    """A JSON-serialisable form of `node` (for the journal)."""
    data = attrs.asdict(node, recurse=False)
    data["state"] = node.state.value
    data["history"] = [
        {"from": t.from_state.value if t.from_state else None, "to": t.to_state.value, "reason": t.reason, "at": t.at}
        for t in node.history
    ]
    data["role"] = node.role.value
    data["resources"] = None if node.resources is None else node.resources.to_json()
    data["relaunched_at"] = list(node.relaunched_at)
    data["awaiting_cause"] = None if node.awaiting_cause is None else node.awaiting_cause.to_json()
    return data


def node_from_dict(data: Mapping[str, Any]) -> NodeRecord:
    """The inverse of `node_to_dict`; a node journaled before roles and resources existed reads as a worker
    launched with nothing asked.

    Raises:
        DLRoverError: the data is not a node written by `node_to_dict`.
    """
    try:
        fields = dict(data)
        fields["state"] = NodeState(fields["state"])
        fields["history"] = tuple(
            TransitionRecord(
                from_state=NodeState(t["from"]) if t["from"] else None,
                to_state=NodeState(t["to"]),
                reason=str(t["reason"]),
                at=float(t["at"]),
            )
            for t in fields["history"]
        )
        fields["role"] = Role(fields.get("role", Role.WORKER.value))
        resources = fields.get("resources")
        fields["resources"] = None if resources is None else Resources.from_json(resources)
        if "relaunched_at" in fields:
            fields["relaunched_at"] = use_times_from_json(fields["relaunched_at"])
        else:  # journaled before the times were: its charged relaunches count for ever
            charged = int(fields.get("relaunch_count", 0)) - int(fields.get("disruptions", 0))
            fields["relaunched_at"] = (None,) * max(charged, 0)
        awaited = fields.get("awaiting_cause")
        fields["awaiting_cause"] = None if awaited is None else AwaitedCharge.from_json(awaited)
        if not isinstance(fields.get("failure_data_suspect", True), bool):
            raise TypeError(f"failure_data_suspect must be true or false, got {fields['failure_data_suspect']!r}")
        return NodeRecord(**fields)
    except (KeyError, TypeError, ValueError, DLRoverError) as exc:
        raise DLRoverError(f"corrupt node record {dict(data)!r}: {exc}") from exc
