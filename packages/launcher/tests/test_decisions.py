from __future__ import annotations

import pytest

from dlrover.launcher.control import AgentAction, FailureDecision, FailureReport
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


@pytest.mark.parametrize(
    ("decision", "restart_count", "max_restarts", "kind", "counts"),
    [
        (FailureDecision.RESTART_WORKERS, 0, 3, StepKind.RESTART, True),
        (FailureDecision.RESTART_WORKERS, 2, 3, StepKind.RESTART, True),
        (FailureDecision.RESTART_WORKERS, 3, 3, StepKind.EXIT, False),
        (FailureDecision.RESTART_WORKERS, 0, 0, StepKind.EXIT, False),
        (FailureDecision.STOP_JOB, 0, 3, StepKind.EXIT, False),
        (FailureDecision.RELAUNCH_NODE, 0, 3, StepKind.EXIT, False),
        (FailureDecision.REMOVE_NODE, 0, 3, StepKind.EXIT, False),
    ],
)
def test_after_failure(
    decision: FailureDecision, restart_count: int, max_restarts: int, kind: StepKind, counts: bool
) -> None:
    report = FailureReport(0, 1, None, "boom", restart_count)
    step = after_failure(report, decision, "because", max_restarts)
    assert step.kind is kind
    assert step.counts_as_restart is counts
    if kind is StepKind.EXIT:
        assert step.exit_code != 0


def test_a_relaunch_after_the_last_restart_says_the_restarts_are_used_up_first() -> None:
    report = FailureReport(0, 1, None, "boom", 3)
    step = after_failure(report, FailureDecision.RELAUNCH_NODE, "rank 0 waits for a new agent", 3)
    assert step.kind is StepKind.EXIT
    assert step.reason.startswith("workers failed and all 3 restart(s) (--max-restarts) are used up")
    assert "(local rank 0, exit code 1)" in step.reason
    assert step.reason.endswith("the master relaunches this node: rank 0 waits for a new agent")
    # With restarts left, only the master's decision is the reason.
    early = after_failure(FailureReport(0, 1, None, "boom", 1), FailureDecision.RELAUNCH_NODE, "bad host", 3)
    assert early.reason == "the master relaunches this node: bad host"
    killed = after_failure(FailureReport(0, 137, "SIGKILL", "", 0), FailureDecision.RESTART_WORKERS, "x", 0)
    assert "(local rank 0, signal SIGKILL)" in killed.reason


def test_stop_job_reason_carries_the_masters_reason() -> None:
    step = after_failure(FailureReport(0, 1, None, "", 0), FailureDecision.STOP_JOB, "ImportError in user code", 5)
    assert "ImportError in user code" in step.reason


def test_stop_wins_over_restart() -> None:
    actions = [(AgentAction.RESTART_WORKERS, "peer failed"), (AgentAction.STOP_NODE, "job stopped")]
    assert on_master_actions(actions).kind is StepKind.EXIT
    assert on_master_actions(actions[:1]).kind is StepKind.RESTART
    assert on_master_actions([]).kind is StepKind.CONTINUE


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
