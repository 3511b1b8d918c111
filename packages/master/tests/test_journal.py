"""The state journal: a contract every journal passes, and SQLite surviving SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.journal import (
    Blob,
    ChangeLine,
    CheckpointCommit,
    JournalBatch,
    JournaledEvent,
    JournalError,
    MemoryJournal,
    SqliteJournal,
    StateJournal,
    job_fields,
)
from dlrover.master.lifecycle import JobLifecycle
from dlrover.master.policy import DefaultFailurePolicy


@pytest.fixture(params=["memory", "sqlite"])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateJournal]:
    j: StateJournal = MemoryJournal() if request.param == "memory" else SqliteJournal(tmp_path / "state")
    yield j
    j.close()


def _event(kind: str, i: int) -> JournaledEvent:
    return JournaledEvent(0, 1000.0 + i, kind, f"{kind} {i}", i, 0, {"i": i})


def test_a_new_journal_is_empty(journal: StateJournal) -> None:
    state = journal.load()
    assert state.lifecycle is None
    assert state.checkpoints == ()
    assert state.blobs == {}
    assert state.last_event_seq == 0
    assert journal.commit(JournalBatch()) == ()


def test_lifecycle_round_trips(journal: StateJournal) -> None:
    life = JobLifecycle(LifecycleConfig(nodes=NodeRange(1, 2)), DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    life.register(0, "a", "h", 1.0)
    life.node_lost(0, "exit 1", 2.0)
    snap = life.snapshot()
    journal.commit(JournalBatch(nodes=snap.nodes, job=job_fields(snap)))
    assert journal.load().lifecycle == snap


def test_events_are_numbered_in_order_and_paged(journal: StateJournal) -> None:
    seqs = journal.commit(JournalBatch(events=tuple(_event("e", i) for i in range(5))))
    assert seqs == (1, 2, 3, 4, 5)
    assert journal.commit(JournalBatch(events=(_event("f", 9),))) == (6,)
    page = journal.events(after_seq=2, limit=3)
    assert [e.seq for e in page] == [3, 4, 5]
    assert page[0].data == {"i": 2}
    assert page[0].kind == "e"
    assert page[0].message == "e 2"
    assert journal.events(after_seq=6) == ()
    assert journal.load().last_event_seq == 6


def test_checkpoints_and_blobs(journal: StateJournal) -> None:
    journal.commit(JournalBatch(checkpoint=CheckpointCommit(10, 5.0, 4, "/ckpt/10")))
    journal.commit(JournalBatch(checkpoint=CheckpointCommit(20, 6.0, 4)))
    journal.commit(JournalBatch(blobs={"rendezvous": Blob(3, json.dumps({"round": 3}))}))
    state = journal.load()
    assert [c.step for c in state.checkpoints] == [10, 20]
    assert state.checkpoints[0].path == "/ckpt/10"
    assert state.blobs["rendezvous"] == Blob(3, '{"round": 3}')
    assert journal.blob("rendezvous") == Blob(3, '{"round": 3}')
    assert journal.blob("shards") is None


def test_stale_or_non_json_blob_is_refused_and_changes_nothing(journal: StateJournal) -> None:
    journal.commit(JournalBatch(blobs={"shards": Blob(5, "[1]")}))
    with pytest.raises(JournalError, match="version 4 is older than the stored version 5"):
        journal.commit(JournalBatch(events=(_event("x", 1),), blobs={"shards": Blob(4, "[2]")}))
    with pytest.raises(JournalError, match="not JSON"):
        journal.commit(JournalBatch(blobs={"shards": Blob(6, "{nope")}))
    assert journal.blob("shards") == Blob(5, "[1]")
    assert journal.events() == ()


def _line(seq: int) -> ChangeLine:
    return ChangeLine(seq, json.dumps({"seq": seq}))


def test_change_lines_follow_their_blob_and_a_newer_blob_drops_the_lines_it_holds(journal: StateJournal) -> None:
    journal.commit(JournalBatch(blobs={"shards": Blob(3, "[]")}, changes={"shards": (_line(2), _line(4))}))
    journal.commit(JournalBatch(changes={"shards": (_line(5), _line(4))}))  # 4 again: stored once
    journal.commit(JournalBatch(changes={"other": (_line(1),)}))
    state = journal.load()
    assert state.changes["shards"] == (_line(4), _line(5))  # 2 is in the blob it came with
    assert state.changes["other"] == (_line(1),)
    # A newer blob written with later lines: it holds 4 and 5, the line after it stays.
    journal.commit(JournalBatch(blobs={"shards": Blob(5, "[5]")}, changes={"shards": (_line(6),)}))
    journal.commit(JournalBatch(changes={"shards": (_line(3), _line(7))}))  # 3: older than the blob
    assert journal.load().changes["shards"] == (_line(6), _line(7))
    with pytest.raises(JournalError, match="change 9 of 'shards' is not JSON"):
        journal.commit(JournalBatch(events=(_event("x", 1),), changes={"shards": (ChangeLine(9, "{nope"),)}))
    assert journal.load().changes["shards"] == (_line(6), _line(7))
    assert journal.events() == ()
    assert JournalBatch(changes={"shards": ()}).empty


def test_sqlite_survives_reopen_and_refuses_a_corrupt_row(tmp_path: Path) -> None:
    j = SqliteJournal(tmp_path)
    j.commit(JournalBatch(events=(_event("a", 1),), job={"x": 1}))
    j.close()
    j.close()
    with pytest.raises(JournalError, match="closed"):
        j.commit(JournalBatch(events=(_event("a", 2),)))
    db = sqlite3.connect(tmp_path / "master.db")
    db.execute("INSERT INTO nodes VALUES (7, 0, 'running', '{not json')")
    db.commit()
    db.close()
    j2 = SqliteJournal(tmp_path)
    try:
        with pytest.raises(JournalError, match="corrupt node 7"):
            j2.load()
        assert [e.kind for e in j2.events()] == ["a"]
    finally:
        j2.close()
    assert (os.stat(tmp_path).st_mode & 0o777) in (0o700, 0o755)  # tmp_path existed already


def test_sqlite_refuses_an_unknown_schema(tmp_path: Path) -> None:
    SqliteJournal(tmp_path).close()
    db = sqlite3.connect(tmp_path / "master.db")
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="schema version 99"):
        SqliteJournal(tmp_path)


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_sqlite_keeps_every_acknowledged_commit_after_sigkill(tmp_path: Path) -> None:
    writer = Path(__file__).with_name("journal_writer.py")
    for _round in range(2):  # kill, restart from what is there, kill again
        proc = subprocess.Popen(
            [sys.executable, str(writer), str(tmp_path)], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            assert proc.stdout is not None
            acknowledged = 0
            first = None
            for line in proc.stdout:  # blocks until the child commits; bounded by the test timeout
                acknowledged = int(line)
                first = first or acknowledged
                if acknowledged - first >= 200:
                    break
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        journal = SqliteJournal(tmp_path)  # reopening recovers the WAL
        try:
            events = journal.events(limit=1_000_000)
        finally:
            journal.close()
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        db = sqlite3.connect(tmp_path / "master.db")
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            node_ids = [r[0] for r in db.execute("SELECT node_id FROM nodes ORDER BY node_id")]
            job = json.loads(db.execute("SELECT value FROM meta WHERE key='job'").fetchone()[0])
        finally:
            db.close()
        assert node_ids == [e.node_id for e in events]
        assert job == {"i": len(events)}
        # Nothing acknowledged is lost, and each batch is whole: nodes, events and job match.
        assert len(events) >= acknowledged


def test_pending_actions_of_an_older_journal_restore_as_the_diagnosis_actions() -> None:
    # Journals written before the master's own ActionKind was replaced by dlrover.diagnosis'
    # hold the action as its string value; only restarts were ever queued.
    from dlrover.diagnosis import ActionKind
    from dlrover.master.records import actions_from_json, actions_to_json

    older = {"3": [{"action_id": 7, "kind": "restart_processes", "reason": "restart 1 of 3"}]}
    restored = actions_from_json(older)
    assert [(a.action_id, a.kind, a.reason) for a in restored[3]] == [
        (7, ActionKind.RESTART_PROCESSES, "restart 1 of 3")
    ]
    assert actions_from_json(actions_to_json(restored)) == restored
    assert not restored[3][0].planned_round  # written before planned rounds saved first


def test_a_planned_round_restart_keeps_its_mark_through_the_journal_and_a_bad_mark_is_refused() -> None:
    from dlrover.common import DLRoverError
    from dlrover.diagnosis import ActionKind
    from dlrover.master.records import Action, actions_from_json, actions_to_json

    queued = {0: (Action(4, ActionKind.RESTART_PROCESSES, "planned round", planned_round=True),)}
    assert actions_from_json(actions_to_json(queued)) == queued
    bad = {"0": [{"action_id": 4, "kind": "restart_processes", "reason": "r", "planned_round": "yes"}]}
    with pytest.raises(DLRoverError, match="planned_round must be true or false, got 'yes'"):
        actions_from_json(bad)


def _edit_database(state_dir: Path, *statements: str) -> None:
    """Change a closed journal's database behind its back (to make it look as an older master left it)."""
    db = sqlite3.connect(state_dir / "master.db")
    try:
        for statement in statements:
            db.execute(statement)
        db.commit()
    finally:
        db.close()


def _schema_version(state_dir: Path) -> str:
    db = sqlite3.connect(state_dir / "master.db")
    try:
        return str(db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])
    finally:
        db.close()


def test_a_schema_1_journal_is_upgraded_and_its_pending_work_moves_to_rows(tmp_path: Path) -> None:
    from dlrover.common import ManualClock
    from dlrover.master.config import MasterConfig
    from dlrover.master.master import Master
    from dlrover.master.records import actions_to_json
    from dlrover.master.scheduler.fake import FakeScheduler

    # A lifecycle where a spare took rank 1: nodes 0 and 2 are owed the spare's round.
    lifecycle = LifecycleConfig(nodes=NodeRange(3, 3), spare_nodes=1, node_start_timeout_s=None)
    life = JobLifecycle(lifecycle, DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    for node_id in range(4):
        life.node_started(node_id, 0.0)
        life.register(node_id, f"a{node_id}", f"h{node_id}", 0.0)
    life.node_lost(1, "gone", 1.0)
    snap = life.snapshot()
    assert sorted(snap.actions) == [0, 2]
    assert sorted(snap.planned_round) == [0, 2]
    # Written as a version-1 master wrote it: the pending work inside the job record.
    record = {
        **job_fields(snap),
        "pending_actions": actions_to_json(snap.actions),
        "planned_round": {str(k): v for k, v in snap.planned_round.items()},
    }
    SqliteJournal(tmp_path).close()
    _edit_database(tmp_path, "DROP TABLE pending_work", "UPDATE meta SET value='1' WHERE key='schema_version'")
    old = SqliteJournal(tmp_path)
    old.commit(JournalBatch(nodes=snap.nodes, job=record))
    old.close()
    _edit_database(tmp_path, "UPDATE meta SET value='1' WHERE key='schema_version'")

    reader = SqliteJournal(tmp_path)
    assert reader.load().lifecycle == snap
    reader.close()
    assert _schema_version(tmp_path) == "1"  # only read: a version-1 master can still open it

    def master(journal: SqliteJournal) -> Master:
        config = MasterConfig(job_name="upgrade", lifecycle=lifecycle)
        return Master(config, FakeScheduler(), journal, ManualClock(), policy=DefaultFailurePolicy())

    journal = SqliteJournal(tmp_path)
    first = master(journal)  # its first write (the master_restart event) rewrites the record and every queue
    assert _schema_version(tmp_path) == "2"
    (actions, _) = first.heartbeat(0)  # node 0 takes its restart
    assert len(actions) == 1
    journal.close()
    db = sqlite3.connect(tmp_path / "master.db")
    (job,) = db.execute("SELECT value FROM meta WHERE key='job'").fetchone()
    rows = [r[0] for r in db.execute("SELECT node_id FROM pending_work ORDER BY node_id")]
    db.close()
    assert "pending_actions" not in json.loads(job)
    assert "planned_round" not in json.loads(job)
    assert rows == [2]
    journal = SqliteJournal(tmp_path)
    try:
        second = master(journal)
        assert second.pending_actions(0) == ()  # handed over: not owed again
        assert [a.action_id for a in second.pending_actions(2)] == [a.action_id for a in snap.actions[2]]
    finally:
        journal.close()


def test_a_schema_2_journal_stays_readable_by_its_master_until_a_logged_collaborator_writes(tmp_path: Path) -> None:
    SqliteJournal(tmp_path).close()
    _edit_database(tmp_path, "DROP TABLE changes", "UPDATE meta SET value='2' WHERE key='schema_version'")

    journal = SqliteJournal(tmp_path)
    journal.commit(JournalBatch(events=(_event("a", 1),), blobs={"rendezvous": Blob(1, "[]")}))
    assert _schema_version(tmp_path) == "2"  # nothing a version-2 master could not read
    # A log-structured collaborator's blob, even without lines yet: its format is one a version-2
    # master does not know (the shards' registry base).
    journal.commit(JournalBatch(blobs={"shards": Blob(1, "[]")}, changes={"shards": ()}))
    assert _schema_version(tmp_path) == "3"
    journal.commit(JournalBatch(changes={"shards": (_line(2),)}))
    assert _schema_version(tmp_path) == "3"
    journal.close()
    reopened = SqliteJournal(tmp_path)
    try:
        assert reopened.load().changes["shards"] == (_line(2),)
    finally:
        reopened.close()


def test_a_corrupt_pending_work_row_is_refused_with_its_node(tmp_path: Path) -> None:
    j = SqliteJournal(tmp_path)
    life = JobLifecycle(LifecycleConfig(nodes=NodeRange(1, 1)), DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    snap = life.snapshot()
    j.commit(JournalBatch(nodes=snap.nodes, job=job_fields(snap)))
    j.close()
    db = sqlite3.connect(tmp_path / "master.db")
    db.execute("""INSERT INTO pending_work VALUES (0, '{"actions": [], "planned_round": "x"}')""")
    db.commit()
    db.close()
    j2 = SqliteJournal(tmp_path)
    try:
        with pytest.raises(JournalError, match="corrupt pending work of node 0"):
            j2.load()
    finally:
        j2.close()


def test_pending_work_round_trips_and_an_empty_one_removes_the_row(journal: StateJournal) -> None:
    from dlrover.diagnosis import ActionKind
    from dlrover.master.records import Action, PendingWork

    life = JobLifecycle(LifecycleConfig(nodes=NodeRange(2, 2)), DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    snap = life.snapshot()
    owed = PendingWork((Action(9, ActionKind.RESTART_PROCESSES, "planned", planned_round=True),), 9)
    journal.commit(JournalBatch(nodes=snap.nodes, job=job_fields(snap), work={0: owed, 1: owed}))
    restored = journal.load().lifecycle
    assert restored is not None
    assert restored.actions == {0: owed.actions, 1: owed.actions}
    assert restored.planned_round == {0: 9, 1: 9}
    journal.commit(JournalBatch(work={0: PendingWork()}))
    restored = journal.load().lifecycle
    assert restored is not None
    assert restored.actions == {1: owed.actions}
    assert restored.planned_round == {1: 9}
