"""The agent's decisions, as pure functions of what it observed: no processes, no clock, no I/O.

Each returns a `Step` saying what to do and a sentence saying why; the agent loop only carries
steps out. That keeps the interesting logic (when to restart, when a restart counts against
`--max-restarts`, when to give up) testable exhaustively.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence

import attrs

from dlrover.diagnosis import ActionKind, Decision
from dlrover.launcher.workers import WorkerExit

__all__ = [
    "Step",
    "StepKind",
    "after_failure",
    "assess_workers",
    "first_failure",
    "on_master_actions",
    "refill_due",
]


class StepKind(enum.Enum):
    """What the agent does next."""

    CONTINUE = "continue"
    REPORT_FAILURE = "report_failure"
    RESTART = "restart"
    SUCCEED = "succeed"
    EXIT = "exit"


@attrs.frozen
class Step:
    """One decision.

    Attributes:
        kind: what to do.
        reason: why, in a sentence a person can act on.
        counts_as_restart: for RESTART, whether it uses up one of `--max-restarts` (a failure
            does; a membership change does not, as in torchrun).
        exit_code: for EXIT, the agent's exit status.
        planned_round: for RESTART, the master announced a planned round (a resize let nodes
            go); for EXIT, the master removed this node for a resize: the workers seal a flash
            checkpoint before they are restarted or stopped.
    """

    kind: StepKind
    reason: str
    counts_as_restart: bool = False
    exit_code: int = 0
    planned_round: bool = False


def first_failure(exits: Mapping[int, WorkerExit], failing: Sequence[int] = ()) -> WorkerExit | None:
    """The failed worker to report, once it has exited.

    Args:
        exits: workers that have exited, by local rank.
        failing: local ranks seen failing, in the order seen (`WorkerGroup.failing`): the first
            is the one to report, and None is returned until it has exited. Without it, the
            lowest local rank among those that failed.
    """
    if failing:
        return exits.get(failing[0])
    failed = [e for e in exits.values() if not e.succeeded]
    return min(failed, key=lambda e: e.local_rank) if failed else None


def assess_workers(
    exits: Mapping[int, WorkerExit], num_workers: int, nodes_waiting: int, failing: Sequence[int] = ()
) -> Step:
    """Decide from the workers' exits and the rendezvous.

    Args:
        exits: workers that have exited, by local rank.
        num_workers: workers started on this node.
        nodes_waiting: nodes waiting to join the next round.
        failing: local ranks seen failing, in the order seen, including any still exiting (see
            `first_failure`); a failure is reported once the first of them has exited, so the
            report holds all it wrote to stderr.
    """
    failed = first_failure(exits, failing)
    if failed is not None:
        how = f"signal {failed.signal_name}" if failed.signal_name else f"exit code {failed.exit_code}"
        return Step(StepKind.REPORT_FAILURE, f"local rank {failed.local_rank} failed with {how}")
    if failing:
        return Step(StepKind.CONTINUE, f"local rank {failing[0]} is exiting after a failure")
    if len(exits) == num_workers:
        return Step(StepKind.SUCCEED, f"all {num_workers} workers finished successfully")
    if nodes_waiting > 0:
        return Step(StepKind.RESTART, f"{nodes_waiting} node(s) waiting to join: starting a new round")
    return Step(StepKind.CONTINUE, "workers running")


def after_failure(decision: Decision) -> Step:
    """Decide what to do after the master answered a failure report.

    The master decides for the job and keeps this node's restart count: the agent declared its
    ``--max-restarts`` when it registered, and the master's reason (`Decision.outcome`) names the
    restart it grants ("restart 2 of 3") or the action it took once they are spent, including a
    relaunch that nothing can carry out, which it already turned into a restart in place. The
    agent carries the decision out and says what it was, with the master's reason as is: it
    keeps no count of its own that could contradict it.
    """
    if decision.action is ActionKind.NONE:
        # The master never answers a live node's failure so (it restarts its processes at the
        # least); workers that failed cannot be left as they are, so the node stops, visibly.
        return Step(
            StepKind.EXIT, f"the master answered no action to a failure of this node: {decision.outcome}", exit_code=1
        )
    return _carry_out(decision.action, decision.outcome, counts_as_restart=True)


def _carry_out(action: ActionKind, reason: str, *, counts_as_restart: bool) -> Step:
    """The step that carries out the master's `action` on this node."""
    if action is ActionKind.ABORT_JOB:
        return Step(StepKind.EXIT, f"the master stopped the job: {reason}", exit_code=1)
    if action.relaunches_node:
        return Step(StepKind.EXIT, f"the master relaunches this node: {reason}", exit_code=1)
    if action is ActionKind.REMOVE_NODE:
        return Step(StepKind.EXIT, f"the master removed this node from the job: {reason}", exit_code=1)
    if action is ActionKind.ROLLBACK_CHECKPOINT:
        return Step(
            StepKind.RESTART,
            f"the master restarts the workers from the newest checkpoint: {reason}",
            counts_as_restart=counts_as_restart,
        )
    if action is ActionKind.RESTART_PROCESSES:
        return Step(StepKind.RESTART, f"the master restarts the workers: {reason}", counts_as_restart=counts_as_restart)
    return Step(StepKind.CONTINUE, f"the master asks for nothing: {reason}")


def on_master_actions(actions: Sequence[tuple[ActionKind, str] | tuple[ActionKind, str, bool]]) -> Step:
    """Decide from actions the master sent with a heartbeat; ending the node wins over restarting.

    Each action is (kind, reason) or, as `dlrover.launcher.control.MasterAction`, (kind, reason,
    planned_round): a restart is a planned round's only when every restart asked for is one (a
    restart for a failure beside it does not wait for a save); a removal marked so is a shrink's
    (the node leaves; its workers save first).
    """
    for action in actions:
        if action[0].ends_node:
            step = _carry_out(action[0], action[1], counts_as_restart=False)
            # Only a removal can be a shrink's (a relaunch or an abort is for a failure).
            leaves = action[0] is ActionKind.REMOVE_NODE and action[2:] == (True,)
            return attrs.evolve(step, planned_round=leaves)
    restarts = [a for a in actions if a[0].restarts_processes]
    if not restarts:
        return Step(StepKind.CONTINUE, "no action")
    planned = all(a[2:] == (True,) for a in restarts)
    return Step(StepKind.RESTART, f"the master asked for a restart: {restarts[0][1]}", planned_round=planned)


def refill_due(
    now: float,
    started_at: float,
    refill_after_s: float,
    sealed: Collection[int],
    ranks: Collection[int],
    *,
    failure_persisting: bool = False,
) -> bool:
    """Whether to start the standbys for the next restart (``--prewarm``).

    Not while the workers just started restore: a standby's import takes a core for a second or
    more, which on a busy node lengthens the very recovery it is meant to shorten. A worker that
    has sealed a flash checkpoint since its start is training again; once every one of this
    node's workers has, and the failure's persist is over (the workers' save after next may be
    waiting for it, and it runs at a low priority), the standbys start; in any case
    `refill_after_s` after the start (workers that do not checkpoint).

    Args:
        now: the current time.
        started_at: when the workers started (same clock).
        refill_after_s: the longest wait.
        sealed: ranks that sealed a checkpoint since `started_at`.
        ranks: the global ranks of this node's workers.
        failure_persisting: whether a persist on failure is held, queued or running.

    Returns:
        Whether the standbys start now. (A group that ends before this is true gets its
        standbys started once its workers are stopped.)
    """
    training = bool(ranks) and set(ranks) <= set(sealed)
    return now - started_at >= refill_after_s or (training and not failure_persisting)
