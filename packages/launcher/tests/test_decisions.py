from __future__ import annotations

import pytest

from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.launcher.control import MasterAction
from dlrover.launcher.decisions import (
    StepKind,
    after_failure,
    assess_workers,
    first_failure,
    on_master_actions,
    refill_due,
)
from dlrover.launcher.workers import WorkerExit


def _exit(rank: int, code: int, sig: str | None = None) -> WorkerExit:
    return WorkerExit(rank, 1000 + rank, code, sig, "")


def test_running_workers_continue() -> None:
    assert assess_workers({}, 2, 0).kind is StepKind.CONTINUE
    assert assess_workers({0: _exit(0, 0)}, 2, 0).kind is StepKind.CONTINUE


def test_all_workers_done_is_success() -> None:
    step = assess_workers({0: _exit(0, 0), 1: _exit(1, 0)}, 2, 0)
    assert step.kind is StepKind.SUCCEED


def test_any_failure_is_reported_naming_the_lowest_failed_rank() -> None:
    exits = {0: _exit(0, 0), 2: _exit(2, 137, "SIGKILL"), 1: _exit(1, 1)}
    step = assess_workers(exits, 3, 5)
    assert step.kind is StepKind.REPORT_FAILURE
    assert "local rank 1" in step.reason
    failed = first_failure(exits)
    assert failed is not None
    assert failed.local_rank == 1


def test_the_first_failure_seen_is_reported_once_it_has_exited_not_the_lowest_rank() -> None:
    # Local rank 2 was seen exiting first; rank 1 failed after (stopped by the agent, or its
    # collective broke): rank 2 is the one to report, and only once it has exited.
    exits = {0: _exit(0, 0), 1: _exit(1, 143, "SIGTERM")}
    waiting = assess_workers(exits, 3, 0, failing=(2, 1))
    assert waiting.kind is StepKind.CONTINUE
    assert "local rank 2 is exiting" in waiting.reason
    assert first_failure(exits, (2, 1)) is None
    exits[2] = _exit(2, 137, "SIGKILL")
    step = assess_workers(exits, 3, 0, failing=(2, 1))
    assert step.kind is StepKind.REPORT_FAILURE
    assert "local rank 2 failed with signal SIGKILL" in step.reason
    failed = first_failure(exits, (2, 1))
    assert failed is not None
    assert failed.local_rank == 2


def test_a_failing_worker_still_exiting_holds_off_success_and_a_new_round() -> None:
    # The others finished (or were stopped cleanly) while the failed one's memory is released.
    exits = {0: _exit(0, 0), 1: _exit(1, 0)}
    assert assess_workers(exits, 3, 4, failing=(2,)).kind is StepKind.CONTINUE


def test_waiting_nodes_start_a_new_round_without_using_a_restart() -> None:
    step = assess_workers({}, 2, 1)
    assert step.kind is StepKind.RESTART
    assert not step.counts_as_restart


def _decided(action: ActionKind, reason: str) -> Decision:
    return Decision(action, FailureKind.UNKNOWN, "0", reason)


@pytest.mark.parametrize(
    ("decision", "kind", "counts"),
    [
        (ActionKind.RESTART_PROCESSES, StepKind.RESTART, True),
        (ActionKind.ABORT_JOB, StepKind.EXIT, False),
        (ActionKind.RELAUNCH_NODE, StepKind.EXIT, False),
        (ActionKind.REMOVE_NODE, StepKind.EXIT, False),
        (ActionKind.ROLLBACK_CHECKPOINT, StepKind.RESTART, True),
        (ActionKind.RELAUNCH_WITH_MORE_MEMORY, StepKind.EXIT, False),
        (ActionKind.NONE, StepKind.EXIT, False),
    ],
)
def test_after_failure_carries_out_the_masters_decision(decision: ActionKind, kind: StepKind, counts: bool) -> None:
    step = after_failure(_decided(decision, "because"))
    assert step.kind is kind
    assert step.counts_as_restart is counts
    assert step.reason.endswith(": because")
    if kind is StepKind.EXIT:
        assert step.exit_code != 0


def test_the_agent_adds_no_count_or_claim_of_its_own_to_the_masters_reason() -> None:
    # The master keeps the node's restart count; the agent says which decision it carries out.
    reason = "node 0 (rank 0) failed: communication: ...; restart 2 of 3 (--max-restarts)"
    assert (
        after_failure(_decided(ActionKind.RESTART_PROCESSES, reason)).reason
        == f"the master restarts the workers: {reason}"
    )
    spent = "node 0 (rank 0) failed: ...; restarted 3 of 3 times (--max-restarts), no restarts left: the job stops"
    assert after_failure(_decided(ActionKind.ABORT_JOB, spent)).reason == f"the master stopped the job: {spent}"
    removed = after_failure(_decided(ActionKind.REMOVE_NODE, "the node leaves the job"))
    assert removed.reason == "the master removed this node from the job: the node leaves the job"
    assert "relaunch" not in removed.reason


def test_stop_job_reason_carries_the_masters_reason() -> None:
    step = after_failure(_decided(ActionKind.ABORT_JOB, "ImportError in user code"))
    assert "ImportError in user code" in step.reason


def test_stop_wins_over_restart() -> None:
    actions = [(ActionKind.RESTART_PROCESSES, "peer failed"), (ActionKind.REMOVE_NODE, "job stopped")]
    assert on_master_actions(actions).kind is StepKind.EXIT
    assert on_master_actions(actions[:1]).kind is StepKind.RESTART
    assert on_master_actions([]).kind is StepKind.CONTINUE


def test_a_restart_is_a_planned_rounds_only_when_every_restart_asked_for_is_one() -> None:
    planned = MasterAction(ActionKind.RESTART_PROCESSES, "planned round: node 2 left", planned_round=True)
    failure = MasterAction(ActionKind.RESTART_PROCESSES, "peer failed")
    step = on_master_actions([planned])
    assert (step.kind, step.planned_round, step.counts_as_restart) == (StepKind.RESTART, True, False)
    assert "node 2 left" in step.reason
    assert not on_master_actions([planned, failure]).planned_round  # a failure does not wait for a save
    assert not on_master_actions([(ActionKind.RESTART_PROCESSES, "old master")]).planned_round
    stop = on_master_actions([planned, MasterAction(ActionKind.REMOVE_NODE, "gone")])
    assert (stop.kind, stop.planned_round) == (StepKind.EXIT, False)
    # A removal marked so is a shrink's: the node leaves, its workers save first.
    leave = on_master_actions([MasterAction(ActionKind.REMOVE_NODE, "node 2 is removed", planned_round=True)])
    assert (leave.kind, leave.planned_round, leave.exit_code) == (StepKind.EXIT, True, 1)
    abort = on_master_actions([MasterAction(ActionKind.ABORT_JOB, "stop", planned_round=True)])
    assert (abort.kind, abort.planned_round) == (StepKind.EXIT, False)  # only a removal is a shrink's


@pytest.mark.parametrize(
    ("now", "sealed", "due"),
    [
        (10.0, set(), False),  # restoring: no standby imports take its CPU
        (10.0, {4}, False),  # one of the node's two workers is training again, not both
        (10.0, {4, 5}, True),  # both sealed a checkpoint since the start
        (10.0, {4, 5, 9}, True),  # other nodes' ranks do not matter
        (40.0, set(), True),  # workers that never checkpoint: after refill_after_s
    ],
)
def test_standbys_are_refilled_once_the_workers_train_again(now: float, sealed: set[int], due: bool) -> None:
    assert refill_due(now, started_at=10.0, refill_after_s=30.0, sealed=sealed, ranks={4, 5}) is due


def test_standbys_wait_for_the_failure_persist_the_workers_may_be_waiting_on() -> None:
    kwargs = {"started_at": 10.0, "refill_after_s": 30.0, "sealed": {4, 5}, "ranks": {4, 5}}
    assert not refill_due(11.0, failure_persisting=True, **kwargs)  # type: ignore[arg-type]
    assert refill_due(11.0, failure_persisting=False, **kwargs)  # type: ignore[arg-type]
    assert refill_due(40.0, failure_persisting=True, **kwargs)  # type: ignore[arg-type]  # the bound holds
