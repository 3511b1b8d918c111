"""What to do about a failure: the seam the diagnosis package's action policy plugs into.

The lifecycle core hands a `FailurePolicy` the failure with the node's restart budget, a
`dlrover.diagnosis.RestartBudget` built from the node's journaled count: the one count, shown in
every message as "restart k of n". A policy spends it through `dlrover.diagnosis.spend_restart`,
the one rule for "restart, relaunch, or let the node go". The lifecycle checks the answer against
the same rule, so no policy can make the job exceed a budget, turns a relaunch with no relaunches
left into a removal, and relaunches nothing once any node has succeeded.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

from dlrover.diagnosis import (
    ActionKind,
    Decision,
    FailureKind,
    RelaunchBudget,
    RestartBudget,
    kind_decided_alone,
    spend_restart,
)
from dlrover.master.records import NodeRecord

__all__ = [
    "Classification",
    "ClassifyingPolicy",
    "DefaultFailurePolicy",
    "Failure",
    "FailurePolicy",
    "JournaledPolicy",
    "StatefulPolicy",
]


@attrs.frozen
class Classification:
    """What a policy made of a failure's evidence before deciding (see `ClassifyingPolicy`).

    Attributes:
        kind: the kind the evidence shows.
        reason: why, in words.
    """

    kind: FailureKind
    reason: str


@attrs.frozen
class Failure:
    """A failure as the policy sees it.

    Attributes:
        node: the node as it was when the failure arrived.
        kind: the kind its reporter named (`dlrover.diagnosis.reported_kind`, or
            `dlrover.diagnosis.LOST_NODE_KIND` for a failure the master observed).
        evidence: what the reporter saw (a log tail, an exit code, a probe result).
        restarts: the node's process restarts, used and allowed (its journaled count against its
            agent's ``--max-restarts``, else the configured budget).
        relaunches: the rank's relaunches, used and allowed (the journaled count of the node's
            incarnations against ``max_relaunches``): spent by `spend_restart` like the restarts.
        exit_code: the failed process's exit status, when the reporter knew it.
        classification: the policy's `classify` of the full evidence, when it has one and the
            failure was reported with evidence (the `evidence` here may be clipped).
        relaunch_possible: False when the scheduler cannot start a new node (the external
            backend: bare metal, Slurm, a standalone `dlrover-run`) while the node's agent is
            alive and reported the failure, so it can restart its processes: `spend_restart`
            then restarts in place while restarts are left and lets the node go after.
        observed_by_master: the master saw the failure from outside the node (no heartbeat, never
            registered, the agent exited, the launch failed): there is no log to diagnose.
    """

    node: NodeRecord
    kind: FailureKind
    evidence: str
    restarts: RestartBudget
    relaunches: RelaunchBudget
    exit_code: int | None = None
    classification: Classification | None = None
    relaunch_possible: bool = True
    observed_by_master: bool = False


@runtime_checkable
class FailurePolicy(Protocol):
    """Decides what to do about one failure. Must be pure: no I/O, no clock."""

    def decide(self, failure: Failure) -> Decision:
        """The action for `failure`, and why (`Decision.outcome`: the sentence the master records)."""
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


@runtime_checkable
class JournaledPolicy(StatefulPolicy, Protocol):
    """A stateful policy whose state (its budget counters: relaunches of the job, ladder steps
    taken) the master journals with every decision, in the job record, so a restarted master
    decides as the old one would have."""

    def export_state(self) -> str:
        """The policy's state as JSON text."""
        ...

    def import_state(self, data: str) -> None:
        """Resume from `export_state`'s text.

        Raises:
            DLRoverError: the text is not what `export_state` writes; nothing changed.
        """
        ...


class DefaultFailurePolicy:
    """The policy decided on the reported kind alone (``failure_policy="default"``).

    The kind's own action (`dlrover.diagnosis.kind_decided_alone`): a user code error stops the
    job, restarting the same code fails the same way; a hardware fault relaunches the node on
    another host; a node the master lost (or saw exit) is relaunched; anything else restarts the
    training processes.

    Restarts, and relaunches nothing can carry out, are spent by `spend_restart`, as by every policy.
    """

    def decide(self, failure: Failure) -> Decision:
        """See the class docstring."""
        kind = failure.kind
        node_id = str(failure.node.node_id)
        where = f"node {failure.node.node_id} (rank {failure.node.rank})"
        wanted, avoid_host = kind_decided_alone(kind)
        if wanted is ActionKind.ABORT_JOB:
            return Decision(ActionKind.ABORT_JOB, kind, node_id, f"{kind.value} on {where}: the job stops")
        node_level = wanted.relaunches_node or failure.observed_by_master
        spending = spend_restart(
            failure.restarts,
            relaunch_possible=failure.relaunch_possible,
            relaunch_wanted=node_level,
            relaunches=failure.relaunches,
        )
        why = f"{kind.value} on {where}" + (", a node-level failure" if node_level else "")
        avoid = spending.action is ActionKind.RELAUNCH_NODE and avoid_host
        return Decision(spending.action, kind, node_id, f"{why}: {spending.words}", avoid_host=avoid)
