"""What to do about a failure: the seam the diagnosis package's action policy plugs into.

The lifecycle core asks a `FailurePolicy` for a decision, then enforces budgets itself, so no
policy can make the job exceed them: a restart with no restarts left becomes a relaunch, a
relaunch with no relaunches left becomes a removal, and nothing is relaunched once any node has
succeeded. Where the scheduler cannot relaunch nodes, a relaunch of a node whose agent can
restart its processes becomes a process restart while restarts are left.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

import attrs

from dlrover.master.records import NodeRecord
from dlrover.master.states import FailureKind

__all__ = [
    "Classification",
    "ClassifyingPolicy",
    "DefaultFailurePolicy",
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
        process_restarts_left: restarts of training processes still allowed on this node.
        relaunches_left: replacements still allowed for this rank.
        exit_code: the failed process's exit status, when the reporter knew it.
        classification: the policy's `classify` of the full evidence, when it has one and the
            failure was reported with evidence (the `evidence` here may be clipped).
        relaunch_possible: False when the scheduler cannot start a replacement node (the
            external backend: bare metal, Slurm, a standalone `dlrover-run`) while the node's
            agent is alive and reported the failure, so it can restart its processes. A policy
            should then restart the processes while restarts are left rather than relaunch:
            the lifecycle turns such a relaunch into a restart anyway.
    """

    node: NodeRecord
    kind: FailureKind
    evidence: str
    process_restarts_left: int
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
    """The policy used until the diagnosis package provides a smarter one.

    - a user code error stops the job: restarting the same code fails the same way;
    - a node-level failure (heartbeat or start timeout, the node exited, hardware) relaunches the
      node; hardware failures also avoid the host;
    - anything else restarts the training processes while the node's restart budget lasts, then
      relaunches the node.
    """

    def decide(self, failure: Failure) -> FailureDecision:
        """See the class docstring."""
        kind = failure.kind
        if kind is FailureKind.USER_CODE_ERROR:
            return FailureDecision(FailureAction.STOP_JOB, f"user code error on rank {failure.node.rank}")
        if kind in _NODE_LEVEL:
            return FailureDecision(
                FailureAction.RELAUNCH_NODE,
                f"{kind.value} is a node-level failure",
                avoid_host=kind is FailureKind.HARDWARE,
            )
        if failure.process_restarts_left > 0:
            return FailureDecision(
                FailureAction.RESTART_PROCESSES,
                f"{kind.value}: {failure.process_restarts_left} process restart(s) left",
            )
        return FailureDecision(FailureAction.RELAUNCH_NODE, f"{kind.value}: process restart budget exhausted")
