"""A journal that cannot take a change leaves the master as it was; once it recovers, the same request works once.

Two kinds of failing journal: `FailingJournal`, a `StateJournal` that refuses commits while told
to (as a full disk would), and a real `SqliteJournal` whose database another connection holds
locked (`BEGIN EXCLUSIVE`), so its commits fail inside sqlite3.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from dlrover.common import ManualClock, RetryPolicy, RpcError
from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.master.client import MasterClient
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.journal import (
    DB_FILE_NAME,
    Blob,
    JournalBatch,
    JournaledEvent,
    JournalError,
    JournalState,
    MemoryJournal,
    SqliteJournal,
    StateJournal,
)
from dlrover.master.master import Master
from dlrover.master.policy import Failure
from dlrover.master.runtime import MasterRuntime
from dlrover.master.scheduler.base import ObservedState
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.servicers import JOURNAL_FAILED
from dlrover.master.states import JobState, NodeState


class FailingJournal:
    """A `StateJournal` over a `MemoryJournal` whose commits fail while `failing` is set."""

    def __init__(self, inner: StateJournal | None = None) -> None:
        self.inner = inner or MemoryJournal()
        self.failing = False
        self.refused = 0

    def load(self) -> JournalState:
        return self.inner.load()

    def commit(self, batch: JournalBatch) -> tuple[int, ...]:
        if self.failing and not batch.empty:
            self.refused += 1
            raise JournalError("cannot write the journal 'test': database or disk is full")
        return self.inner.commit(batch)

    def events(self, after_seq: int = 0, limit: int = 1000) -> tuple[JournaledEvent, ...]:
        return self.inner.events(after_seq, limit)

    def blob(self, name: str) -> Blob | None:
        return self.inner.blob(name)

    def close(self) -> None:
        self.inner.close()


class RestartEverything:
    """A policy that restarts processes on every failure (so restarts are queued as actions)."""

    def decide(self, failure: Failure) -> Decision:
        node_id = str(failure.node.node_id)
        return Decision(ActionKind.RESTART_PROCESSES, failure.kind, node_id, f"restart after {failure.kind.value}")


def config(nodes: int = 2, **kw: object) -> MasterConfig:
    lifecycle = LifecycleConfig(
        nodes=NodeRange(1, nodes), heartbeat_timeout_s=10.0, insufficient_nodes_window_s=60.0, max_process_restarts=5
    )
    return MasterConfig(
        job_name="jf", lifecycle=lifecycle, heartbeat_interval_s=1.0, progress_event_interval_s=0.0, **kw
    )  # type: ignore[arg-type]


def make(journal: StateJournal, **kw: object) -> tuple[Master, FakeScheduler, ManualClock]:
    sched, clock = FakeScheduler(), ManualClock()
    master = Master(config(), sched, journal, clock, **kw)  # type: ignore[arg-type]
    master.start()
    return master, sched, clock


def test_a_refused_registration_changes_nothing_and_succeeds_once_the_journal_recovers() -> None:
    journal = FailingJournal()
    master, _, _ = make(journal)
    before, events = master.state_digest(), len(journal.events(limit=10_000))
    journal.failing = True
    with pytest.raises(JournalError, match="disk is full"):
        master.register(0, "a", "h")
    assert master.state_digest() == before
    assert master.node(0).state is NodeState.PENDING
    assert len(journal.events(limit=10_000)) == events
    journal.failing = False
    assert master.register(0, "a", "h").state is NodeState.RUNNING
    registered = [e for e in journal.events(limit=10_000) if e.kind == "node_state" and e.data["to"] == "running"]
    assert len(registered) == 1
    # What the journal holds is what the master holds.
    assert Master(config(), FakeScheduler(), journal.inner, ManualClock()).node(0).state is NodeState.RUNNING


def test_a_relaunch_whose_journal_write_failed_is_neither_applied_nor_lost() -> None:
    journal = FailingJournal()
    policy = DiagnosisFailurePolicy()
    master, sched, _ = make(journal, policy=policy)
    master.register(0, "a", "h")
    master.register(1, "b", "h2")
    before = master.state_digest()
    journal.failing = True
    with pytest.raises(JournalError):
        master.report_failure(0, FailureKind.HARDWARE, "ECC error: uncorrectable")
    # No effect left the master: nothing stopped, nothing launched; budgets and counters as before.
    assert master.state_digest() == before
    assert (sched.stopped, sorted(sched.specs)) == ([], [0, 1])
    assert policy.actions.relaunches == 0
    assert master.status().job_failures == 0
    journal.failing = False
    decision = master.report_failure(0, FailureKind.HARDWARE, "ECC error: uncorrectable")
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert sched.stopped == [0]
    assert sorted(sched.specs) == [0, 1, 2]  # the replacement, launched once
    assert master.node(2).rank == 0
    assert policy.actions.relaunches == 1
    assert master.status().job_failures == 1


def test_the_policy_rolls_back_to_exactly_its_earlier_decisions() -> None:
    """A decision that is rolled back leaves the diagnosis counters as if it never happened."""
    journal = FailingJournal()
    policy = DiagnosisFailurePolicy()
    master, _, _ = make(journal, policy=policy)
    master.register(0, "a", "h")
    master.register(1, "b", "h2")
    master.report_failure(1, FailureKind.UNKNOWN, "the worker exited with status 1")
    saved = policy.savepoint()
    journal.failing = True
    for _ in range(3):
        with pytest.raises(JournalError):
            master.report_failure(1, FailureKind.UNKNOWN, "the worker exited with status 1")
    assert policy.savepoint() == saved
    journal.failing = False
    # The unknown kind's ladder allows two restarts before a relaunch: had the failed attempts
    # stayed counted, this would be the relaunch.
    decision = master.report_failure(1, FailureKind.UNKNOWN, "the worker exited with status 1")
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert decision.outcome.endswith("restart 2 of 5 (max_process_restarts)")


def test_an_observed_exit_whose_journal_write_failed_is_handled_on_a_later_tick() -> None:
    journal = FailingJournal()
    master, sched, _ = make(journal)
    master.register(0, "a", "h")
    sched.set_state(0, ObservedState.FAILED, 9)
    journal.failing = True
    with pytest.raises(JournalError):
        master.tick()
    assert master.node(0).state is NodeState.RUNNING
    journal.failing = False
    master.tick()
    assert master.node(0).state is NodeState.RELAUNCHING
    assert sorted(sched.specs) == [0, 1, 2]


def test_a_checkpoint_commit_that_cannot_be_journaled_is_not_committed() -> None:
    journal = FailingJournal()
    master, _, _ = make(journal)
    master.report_checkpoint_steps(2, {0: [5], 1: [5]})
    journal.failing = True
    with pytest.raises(JournalError):
        master.commit_checkpoint(5, "/ck/5")
    assert master.status().committed_step is None
    journal.failing = False
    assert master.commit_checkpoint(5, "/ck/5").step == 5
    assert [c.step for c in journal.load().checkpoints] == [5]


def test_stop_that_cannot_be_journaled_stops_nothing() -> None:
    journal = FailingJournal()
    master, sched, _ = make(journal)
    journal.failing = True
    with pytest.raises(JournalError):
        master.stop("operator")
    assert (master.job_state, sched.stopped) == (JobState.RUNNING, [])
    journal.failing = False
    assert master.stop("operator") is JobState.STOPPED
    assert sorted(sched.stopped) == [0, 1]


def test_progress_that_cannot_be_journaled_does_not_fail_the_heartbeat() -> None:
    journal = FailingJournal()
    master, _, _ = make(journal)
    master.register(0, "a", "h")
    journal.failing = True
    actions, state = master.heartbeat(0, step=7)
    assert (actions, state) == ((), JobState.RUNNING)
    assert master.node(0).step == 7
    journal.failing = False
    master.heartbeat(0, step=8)
    assert [e.data["step"] for e in journal.events(limit=10_000) if e.kind == "progress"] == [8]


def queue_restart(master: Master, sched: FakeScheduler) -> None:
    """Node 0 exits as the scheduler sees it; the policy queues a process restart for its heartbeat."""
    master.register(0, "a", "h")
    sched.set_state(0, ObservedState.FAILED, 1)
    master.tick()
    assert [a.kind for a in master.pending_actions(0)] == [ActionKind.RESTART_PROCESSES]


def test_pending_actions_survive_a_failed_delivery_and_are_delivered_once() -> None:
    journal = FailingJournal()
    master, sched, _ = make(journal, policy=RestartEverything())
    queue_restart(master, sched)
    journal.failing = True
    with pytest.raises(JournalError):
        master.heartbeat(0, step=1)
    journal.failing = False
    (action,), _ = master.heartbeat(0, step=1)
    assert action.kind is ActionKind.RESTART_PROCESSES
    assert master.heartbeat(0, step=2)[0] == ()


def test_pending_actions_are_delivered_after_a_master_restart_exactly_once(tmp_path: Path) -> None:
    """The master that decided dies before the heartbeat; the next one delivers; the one after does not."""
    first = SqliteJournal(tmp_path)
    master, sched, _ = make(first, policy=RestartEverything())
    queue_restart(master, sched)
    action_id = master.pending_actions(0)[0].action_id
    del master  # killed: the journal is not closed, nothing is flushed
    second = SqliteJournal(tmp_path)
    resumed = Master(config(), FakeScheduler(), second, ManualClock(), policy=RestartEverything())
    (action,), _ = resumed.heartbeat(0, step=1)
    assert (action.action_id, action.kind) == (action_id, ActionKind.RESTART_PROCESSES)
    del resumed
    third = Master(config(), FakeScheduler(), SqliteJournal(tmp_path), ManualClock(), policy=RestartEverything())
    assert third.heartbeat(0, step=2)[0] == ()
    assert third.pending_actions(0) == ()
    assert third.status().nodes[0].process_restarts == 1
    for journal in (first, second):
        journal.close()


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Another connection holds the journal's database exclusively: its writers fail with 'locked'."""
    other = sqlite3.connect(state_dir / DB_FILE_NAME, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_a_locked_sqlite_journal_fails_as_journal_error_and_the_master_is_unchanged(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path, busy_timeout_s=0.05)
    master, sched, _ = make(journal)
    before = master.state_digest()
    with locked(tmp_path):
        with pytest.raises(JournalError, match=r"master\.db.*locked"):
            master.register(0, "a", "h")
        with pytest.raises(JournalError, match="locked"):
            master.stop("operator")
        assert master.state_digest() == before
        assert sched.stopped == []
    assert master.register(0, "a", "h").state is NodeState.RUNNING
    master.tick()
    journal.close()
    resumed = Master(config(), FakeScheduler(), SqliteJournal(tmp_path), ManualClock())
    assert resumed.node(0).state is NodeState.RUNNING
    assert resumed.job_state is JobState.RUNNING


def test_every_sqlite_error_is_a_journal_error(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path, busy_timeout_s=0.05)
    event = JournaledEvent(0, 1.0, "k", "m", None, None, {})
    with locked(tmp_path), pytest.raises(JournalError, match="cannot write"):
        journal.commit(JournalBatch(events=(event,)))
    assert journal.commit(JournalBatch(events=(event,))) == (1,)  # the failed transaction left nothing open
    # Someone breaks the database under the journal: reads fail as journal errors, not sqlite3 ones.
    other = sqlite3.connect(tmp_path / DB_FILE_NAME, isolation_level=None)
    other.executescript("DROP TABLE events; DROP TABLE blobs;")
    other.close()
    with pytest.raises(JournalError, match="cannot read"):
        journal.events()
    with pytest.raises(JournalError, match="cannot read"):
        journal.blob("x")
    with pytest.raises(JournalError, match="cannot read"):
        journal.load()
    with pytest.raises(JournalError, match="cannot write"):
        journal.commit(JournalBatch(blobs={"x": Blob(1, "{}")}))
    journal.close()


@pytest.mark.integration
def test_a_locked_journal_answers_unavailable_over_grpc_and_a_retry_succeeds(tmp_path: Path) -> None:
    from dlrover.common import generate_token
    from dlrover.master.factory import create_master
    from dlrover.master.scheduler.external import ExternalScheduler

    cfg = MasterConfig(
        job_name="jf",
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 2), node_start_timeout_s=None),
        token=generate_token(),
        backend="external",
        tick_interval_s=3600.0,
        state_dir=str(tmp_path),
        journal_busy_timeout_s=0.05,
    )
    runtime: MasterRuntime = create_master(cfg, scheduler=ExternalScheduler(), clock=ManualClock())
    runtime.start()
    try:
        before = runtime.master.state_digest()
        with MasterClient(runtime.address, runtime.token, policy=RetryPolicy(max_attempts=1)) as client:
            with locked(tmp_path), pytest.raises(RpcError) as info:
                client.register("agent-a", "host-a")
            assert info.value.code is grpc.StatusCode.UNAVAILABLE
            assert JOURNAL_FAILED in str(info.value)
            assert runtime.master.state_digest() == before
            reply = client.register("agent-a", "host-a")
            assert (reply.node_id, reply.rank) == (0, 0)
            assert runtime.master.node(0).state is NodeState.RUNNING
    finally:
        runtime.stop()
