"""The vocabulary of the node lifecycle: states and the legal transitions between them.

Failure kinds and actions are `dlrover.diagnosis.FailureKind` and `dlrover.diagnosis.ActionKind`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from dlrover.common import DLRoverError

__all__ = [
    "ALIVE_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "IllegalTransitionError",
    "JobState",
    "NodeState",
    "check_transition",
]


class NodeState(enum.StrEnum):
    """Where one node incarnation is in its life.

    A logical rank is served by a chain of incarnations: when one fails and is relaunched, it ends
    in RELAUNCHING and a new incarnation with the same rank starts in PENDING.
    """

    PENDING = "pending"
    """Created; the scheduler has been asked to launch it."""
    STARTING = "starting"
    """The scheduler reports it started; its agent has not registered yet."""
    RUNNING = "running"
    """Its agent registered and heartbeats."""
    SUCCEEDED = "succeeded"
    """Its training processes finished successfully. Terminal."""
    FAILED = "failed"
    """It failed; a decision follows at once (relaunch or remove) unless the job stopped."""
    RELAUNCHING = "relaunching"
    """It failed and a replacement with the same rank was created. Terminal."""
    REMOVED = "removed"
    """Given up: budget exhausted, job stopped, or scaled away. Terminal."""


ALIVE_STATES = frozenset({NodeState.PENDING, NodeState.STARTING, NodeState.RUNNING})
TERMINAL_STATES = frozenset({NodeState.SUCCEEDED, NodeState.RELAUNCHING, NodeState.REMOVED})

# The only edges a node may take. Anything else is a bug or a confused peer, and is refused.
TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    # An agent may register before the scheduler reports its start (external agents always do).
    NodeState.PENDING: frozenset({NodeState.STARTING, NodeState.RUNNING, NodeState.FAILED, NodeState.REMOVED}),
    NodeState.STARTING: frozenset({NodeState.RUNNING, NodeState.FAILED, NodeState.REMOVED}),
    NodeState.RUNNING: frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.REMOVED}),
    NodeState.FAILED: frozenset({NodeState.RELAUNCHING, NodeState.REMOVED}),
    NodeState.SUCCEEDED: frozenset(),
    NodeState.RELAUNCHING: frozenset(),
    NodeState.REMOVED: frozenset(),
}


class IllegalTransitionError(DLRoverError):
    """A node was asked to take an edge the transition table does not have."""


def check_transition(current: NodeState, target: NodeState) -> str | None:
    """None if `current -> target` is legal, else the reason it is not."""
    if target in TRANSITIONS[current]:
        return None
    if current in TERMINAL_STATES:
        return f"{current.value} is terminal; a node never leaves it (asked for {target.value})"
    allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current]))
    return f"{current.value} -> {target.value} is not a legal transition (allowed: {allowed})"


class JobState(enum.StrEnum):
    """The job as a whole."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Stopped by an early-stop rule; `exit_reason` says which."""
    STOPPED = "stopped"
    """Stopped on request (JobService.StopJob or the CLI)."""

    @property
    def finished(self) -> bool:
        """Whether the job has ended."""
        return self is not JobState.RUNNING
