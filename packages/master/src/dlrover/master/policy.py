"""What to do about a failure: the seam the diagnosis package's action policy plugs into.

The lifecycle core hands a `FailurePolicy` the failure with the node's restart budget, a
`dlrover.diagnosis.RestartBudget` built from the node's journaled count: the one count, shown in
every message as "restart k of n". A policy spends it through `dlrover.diagnosis.spend_restart`,
the one rule for "restart, relaunch, or let the node go". The lifecycle checks the answer against
the same rule, so no policy can make the job exceed a budget, turns a relaunch with no relaunches
left into a removal, and relaunches nothing once any node has succeeded.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

import attrs

from dlrover.diagnosis import ActionKind as DiagnosedAction
from dlrover.diagnosis import RestartBudget, spend_restart
from dlrover.master.records import NodeRecord
from dlrover.master.states import FailureKind

__all__ = [
    "Classification",
    "ClassifyingPolicy",
    "DefaultFailurePolicy",
    "FAILURE_ACTIONS",
    "Failure",
    "FailureAction",
    "FailureDecision",
    "FailurePolicy",
    "StatefulPolicy",
]


class FailureAction(enum.StrEnum):
    """The possible answers to a failure, mildest first."""

    RESTART_PROCESSES = "restart_processes"
    RELAUNCH_NODE = "relaunch_node"
    REMOVE_NODE = "remove_node"
    STOP_JOB = "stop_job"


FAILURE_ACTIONS: dict[DiagnosedAction, FailureAction] = {
    DiagnosedAction.NONE: FailureAction.RESTART_PROCESSES,
    DiagnosedAction.RESTART_PROCESSES: FailureAction.RESTART_PROCESSES,
    DiagnosedAction.ROLLBACK_CHECKPOINT: FailureAction.RESTART_PROCESSES,
    DiagnosedAction.RELAUNCH_NODE: FailureAction.RELAUNCH_NODE,
    DiagnosedAction.RELAUNCH_WITH_MORE_MEMORY: FailureAction.RELAUNCH_NODE,
    DiagnosedAction.REMOVE_NODE: FailureAction.REMOVE_NODE,
    DiagnosedAction.ABORT_JOB: FailureAction.STOP_JOB,
}
"""The master's action for each diagnosis action: a rollback restarts the processes (they resume
from the newest checkpoint); "no action" (a late report) is the mildest action, a restart."""


@attrs.frozen
class Classification:
    """What a policy made of a failure's evidence before deciding (see `ClassifyingPolicy`).

    Attributes:
        kind: the policy's own name for the kind of failure.
        reason: why, in words.
    """

    kind: str
    reason: str


@attrs.frozen
class Failure:
    """A failure as the policy sees it.

    Attributes:
        node: the node as it was when the failure arrived.
        kind: what kind of failure.
        evidence: what the reporter saw (a log tail, an exit code, a probe result).
        restarts: the node's process restarts, used and allowed (its journaled count against its
            agent's ``--max-restarts``, else the configured budget).
        relaunches_left: replacements still allowed for this rank.
        exit_code: the failed process's exit status, when the reporter knew it.
        classification: the policy's `classify` of the full evidence, when it has one and the
            failure was reported with evidence (the `evidence` here may be clipped).
        relaunch_possible: False when the scheduler cannot start a new node (the external
            backend: bare metal, Slurm, a standalone `dlrover-run`) while the node's agent is
            alive and reported the failure, so it can restart its processes: `spend_restart`
            then restarts in place while restarts are left and lets the node go after.
    """

    node: NodeRecord
    kind: FailureKind
    evidence: str
    restarts: RestartBudget
    relaunches_left: int
    exit_code: int | None = None
    classification: Classification | None = None
    relaunch_possible: bool = True


@attrs.frozen
class FailureDecision:
    """A policy's answer, with the reason it gives.

    Attributes:
        action: what to do.
        reason: why, in words; recorded in the node's history and the event log.
        avoid_host: whether the node's host must not be used again.
    """

    action: FailureAction
    reason: str
    avoid_host: bool = False


@runtime_checkable
class FailurePolicy(Protocol):
    """Decides what to do about one failure. Must be pure: no I/O, no clock."""

    def decide(self, failure: Failure) -> FailureDecision:
        """The action for `failure`, and why."""
        ...


@runtime_checkable
class ClassifyingPolicy(FailurePolicy, Protocol):
    """A policy whose costly part, reading the evidence, is pure and needs no job state.

    The master calls `classify` before it takes its lock, so a slow classification never holds
    up heartbeats; `decide` then gets the result in `Failure.classification`.
    """

    def classify(self, node_id: int, kind: FailureKind, evidence: str, exit_code: int | None) -> Classification:
        """What the evidence says; must be pure (no state read or changed, no I/O)."""
        ...


@runtime_checkable
class StatefulPolicy(FailurePolicy, Protocol):
    """A policy that keeps state across decisions (budget counters), which the master rolls back
    together with its own when a decision cannot be journaled."""

    def savepoint(self) -> object:
        """The policy's state now."""
        ...

    def rollback(self, savepoint: object) -> None:
        """Go back to a state `savepoint` returned."""
        ...


_NODE_LEVEL = frozenset(
    {FailureKind.HEARTBEAT_TIMEOUT, FailureKind.START_TIMEOUT, FailureKind.NODE_EXIT, FailureKind.HARDWARE}
)


class DefaultFailurePolicy:
    """The policy decided on the reported kind alone (``failure_policy="default"``).

    - a user code error stops the job: restarting the same code fails the same way;
    - a node-level failure (heartbeat or start timeout, the node exited, hardware) relaunches the
      node; hardware failures also avoid the host;
    - anything else restarts the training processes.

    Restarts, and relaunches nothing can carry out, are spent by `spend_restart`, as by every policy.
    """

    def decide(self, failure: Failure) -> FailureDecision:
        """See the class docstring."""
        kind = failure.kind
        where = f"node {failure.node.node_id} (rank {failure.node.rank})"
        if kind is FailureKind.USER_CODE_ERROR:
            return FailureDecision(FailureAction.STOP_JOB, f"user code error on {where}: the job stops")
        node_level = kind in _NODE_LEVEL
        spending = spend_restart(
            failure.restarts, relaunch_possible=failure.relaunch_possible, relaunch_wanted=node_level
        )
        action = FAILURE_ACTIONS[spending.action]
        why = f"{kind.value} on {where}" + (", a node-level failure" if node_level else "")
        avoid = action is FailureAction.RELAUNCH_NODE and kind is FailureKind.HARDWARE
        return FailureDecision(action, f"{why}: {spending.words}", avoid_host=avoid)
