"""What to do about a failure: the seam the diagnosis package's action policy plugs into.

The lifecycle core hands a `FailurePolicy` the failure with every fact the decision needs: the
node's restart budget and its rank's relaunch budget (`dlrover.diagnosis.RestartBudget` and
`RelaunchBudget`, built from the journaled counts: the one count, shown in every message as
"restart k of n"), whether the backend starts new nodes itself, whether the node's agent is there
to restart its processes (the node runs, its agent reported the failure and stays). A policy
decides once, spending the budgets through `dlrover.diagnosis.spend_restart`, the one rule for
"restart, relaunch, or let the node go" (and so for "relaunch impossible, restart in place").
The lifecycle applies the answer as it is; it only refuses what cannot be carried out at all
(see `JobLifecycle`).
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
from dlrover.master.states import NodeState

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
        backend_relaunches: whether the job's scheduler starts a new node itself. False (the
            external backend: bare metal, Slurm, a standalone `dlrover-run`): a relaunch only
            opens the rank for a new agent to register, so while the node's agent is there to
            restart its processes, `spend_restart` restarts them in place while restarts are
            left and lets the node go after.
        observed_by_master: the master saw the failure from outside the node (no heartbeat, never
            registered, the agent exited, the launch failed): there is no log to diagnose, and
            a new node can take the rank whatever the backend.
        agent_exits: the node's agent exits after reporting this failure whatever the answer (a
            network check left its node out), so it restarts nothing.
        wall_time: when the failure arrived (wall seconds): the policy's budgets count the
            failures within their window of it (`LifecycleConfig.budget_window_s`). None: unknown
            (a policy with a window refuses to decide without it).
    """

    node: NodeRecord
    kind: FailureKind
    evidence: str
    restarts: RestartBudget
    relaunches: RelaunchBudget
    exit_code: int | None = None
    classification: Classification | None = None
    backend_relaunches: bool = True
    observed_by_master: bool = False
    agent_exits: bool = False
    wall_time: float | None = None

    @property
    def no_restart(self) -> str:
        """Why nobody can restart the node's processes in place, in words; empty when its agent
        may (the node runs and its agent stays)."""
        if self.node.state is not NodeState.RUNNING:
            return "the node is not running"
        if self.agent_exits:
            return "its agent exits after this report"
        return ""

    @property
    def relaunch_possible(self) -> bool:
        """Whether a new node can take the rank: the backend starts one, or the node's agent is
        gone or leaving (the master saw the node fail, it does not run, its agent exits), so
        the rank opens for a new agent to register (`spend_restart`)."""
        return self.backend_relaunches or self.observed_by_master or bool(self.no_restart)

    def relaunch_note(self, action: ActionKind) -> str:
        """What a relaunch means where the backend starts no node, to end the decision's words
        with; empty for any other action or backend."""
        if not action.relaunches_node or self.backend_relaunches:
            return ""
        return f"; this job's backend starts no node itself: rank {self.node.rank} waits for a new agent to register"


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

    Restarts and relaunches are spent by `spend_restart` with the failure's facts, as by every policy.
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
            no_restart=failure.no_restart,
        )
        why = f"{kind.value} on {where}" + (", a node-level failure" if node_level else "")
        avoid = spending.action is ActionKind.RELAUNCH_NODE and avoid_host
        words = f"{why}: {spending.words}{failure.relaunch_note(spending.action)}"
        return Decision(spending.action, kind, node_id, words, avoid_host=avoid)
