"""The state journal: what a restarted master needs to resume the job.

`SqliteJournal` keeps it in one SQLite database (WAL mode) in the state directory; every
`commit` is one transaction, so a master killed at any instant leaves the last committed batch
and nothing half-written. `MemoryJournal` is the in-memory fake with the same contract.

What is journaled: node records, the job's own fields, the event history, checkpoint commits,
opaque versioned JSON blobs that collaborators (rendezvous, shards) hand over, and the change
lines a log-structured collaborator (shards) appends after its blob: a blob of version v holds
every line numbered up to v, so writing it drops those lines, and loading returns the lines
after it. Heartbeat timestamps and resource samples are not: they are stale by the time anyone
reads them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from dlrover.common import ConfigError, DLRoverError
from dlrover.diagnosis.window import UseTimes, use_times_from_json
from dlrover.master.records import (
    LifecycleSnapshot,
    NodeRecord,
    PendingWork,
    actions_from_json,
    node_from_dict,
    node_to_dict,
    pending_work_from_json,
    pending_work_to_json,
)
from dlrover.master.states import JobState

__all__ = [
    "SCHEMA_VERSION",
    "Blob",
    "ChangeLine",
    "CheckpointCommit",
    "JournalBatch",
    "JournalError",
    "JournalState",
    "JournaledEvent",
    "MemoryJournal",
    "SqliteJournal",
    "StateJournal",
    "job_fields",
]

SCHEMA_VERSION = 3
"""2: each node's pending work in a row of its own (`pending_work`), no longer in the job record.
3: collaborators' change lines (`changes`), which an older master would ignore and so lose.
A journal of an older version is read, and upgraded by the first write that needs a newer one (an
older master can read it until then); a newer one is refused."""
DB_FILE_NAME = "master.db"


class JournalError(DLRoverError):
    """The journal cannot be read or written; the message names the file or row."""


@attrs.frozen
class JournaledEvent:
    """An event as stored: with its sequence number and wall time."""

    seq: int
    wall_time: float
    kind: str
    message: str
    node_id: int | None
    rank: int | None
    data: Mapping[str, Any]


@attrs.frozen
class CheckpointCommit:
    """A checkpoint step that was complete on every rank and committed."""

    step: int
    wall_time: float
    world_size: int
    path: str = ""


@attrs.frozen
class Blob:
    """A collaborator's opaque state: JSON text and the version its owner gave it."""

    version: int
    data: str


@attrs.frozen
class ChangeLine:
    """One change a log-structured collaborator made after its blob: JSON text, numbered by its owner
    (the numbers grow; a blob of version v holds every line numbered up to v)."""

    seq: int
    data: str


@attrs.frozen
class JournalBatch:
    """Changes written together, atomically.

    Attributes:
        nodes: node records to insert or replace.
        job: the job's own fields (see `job_fields`), or None to leave them.
        events: events to append (their `seq` is ignored; the journal numbers them).
        checkpoint: a checkpoint commit to record.
        blobs: collaborator blobs to store, by name.
        work: nodes' pending work to store, by node id (an empty one removes the node's).
        changes: collaborators' change lines to append, by blob name (written after the batch's
            blob of that name; lines a stored or written blob holds are not stored).
    """

    nodes: tuple[NodeRecord, ...] = ()
    job: Mapping[str, Any] | None = None
    events: tuple[JournaledEvent, ...] = ()
    checkpoint: CheckpointCommit | None = None
    blobs: Mapping[str, Blob] = attrs.field(factory=dict)
    work: Mapping[int, PendingWork] = attrs.field(factory=dict)
    changes: Mapping[str, Sequence[ChangeLine]] = attrs.field(factory=dict)

    @property
    def empty(self) -> bool:
        """Whether the batch changes nothing."""
        return not (
            self.nodes
            or self.job is not None
            or self.events
            or self.checkpoint
            or self.blobs
            or self.work
            or any(self.changes.values())
        )


@attrs.frozen
class JournalState:
    """Everything read back on start."""

    lifecycle: LifecycleSnapshot | None
    checkpoints: tuple[CheckpointCommit, ...]
    blobs: Mapping[str, Blob]
    last_event_seq: int
    job: Mapping[str, Any] | None = None
    """The job record as written (the lifecycle fields and whatever else the master keeps there)."""
    changes: Mapping[str, tuple[ChangeLine, ...]] = attrs.field(factory=dict)
    """Each blob's change lines after it (numbered above its version), in order."""


def job_fields(snapshot: LifecycleSnapshot) -> dict[str, Any]:
    """The job-level fields of a lifecycle snapshot, as stored in the journal (the nodes' pending
    work is stored per node: `JournalBatch.work`)."""
    return {
        "job_state": snapshot.job_state.value,
        "exit_reason": snapshot.exit_reason,
        "job_failures": snapshot.job_failures,
        "next_node_id": snapshot.next_node_id,
        "next_action_id": snapshot.next_action_id,
        "avoid_hosts": dict(snapshot.avoid_hosts),
        "started": snapshot.started,
        "policy_state": snapshot.policy_state,
        "target_nodes": snapshot.target_nodes,
        "wanted_nodes": snapshot.wanted_nodes,
        "spare_failures": snapshot.spare_failures,
        "job_failure_times": None if snapshot.job_failure_times is None else list(snapshot.job_failure_times),
        "spare_failure_times": None if snapshot.spare_failure_times is None else list(snapshot.spare_failure_times),
        "current_ranks": None if snapshot.current is None else {str(k): v for k, v in sorted(snapshot.current.items())},
    }


def _current_ranks(value: Any) -> dict[int, int] | None:
    """The journaled rank -> node map; None when the journal predates it."""
    if value is None:
        return None
    return {int(k): int(v) for k, v in dict(value).items()}


def _use_times(value: Any) -> UseTimes | None:
    return None if value is None else use_times_from_json(value)


def _optional_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer or null, got {value!r}")
    return value


def _snapshot(
    job: Mapping[str, Any] | None, nodes: Sequence[NodeRecord], work: Mapping[int, PendingWork] | None = None
) -> LifecycleSnapshot | None:
    if job is None:
        return None
    try:
        # A version-1 journal kept every node's pending work in the job record; a node's own row
        # (written since) takes its place.
        actions = dict(actions_from_json(job.get("pending_actions", {})))
        planned = {int(k): int(v) for k, v in dict(job.get("planned_round", {})).items()}
        for node_id, owed in (work or {}).items():
            actions[node_id] = owed.actions
            planned.pop(node_id, None)
            if owed.planned_round is not None:
                planned[node_id] = owed.planned_round
        return LifecycleSnapshot(
            nodes=tuple(sorted(nodes, key=lambda n: n.node_id)),
            job_state=JobState(job["job_state"]),
            exit_reason=str(job["exit_reason"]),
            job_failures=int(job["job_failures"]),
            next_node_id=int(job["next_node_id"]),
            next_action_id=int(job["next_action_id"]),
            avoid_hosts={str(k): str(v) for k, v in dict(job["avoid_hosts"]).items()},
            started=bool(job["started"]),
            # Absent in journals written before pending actions were journaled.
            actions={node_id: queued for node_id, queued in actions.items() if queued},
            # Absent in journals written before the policy's counters were journaled: it starts afresh.
            policy_state=str(job.get("policy_state", "")),
            # Absent in journals written before resizing: the job was sized to max_nodes.
            target_nodes=_optional_int(job.get("target_nodes")),
            wanted_nodes=_optional_int(job.get("wanted_nodes")),
            planned_round=planned,
            spare_failures=int(job.get("spare_failures", 0)),
            # Absent in journals written before failures kept their times.
            job_failure_times=_use_times(job.get("job_failure_times")),
            spare_failure_times=_use_times(job.get("spare_failure_times")),
            current=_current_ranks(job.get("current_ranks")),
        )
    except (KeyError, TypeError, ValueError, DLRoverError) as exc:
        raise JournalError(f"corrupt job record {dict(job)!r}: {exc}") from exc


@runtime_checkable
class StateJournal(Protocol):
    """Where the master's state survives it."""

    def load(self) -> JournalState:
        """Everything committed so far (an empty state for a new journal)."""
        ...

    def commit(self, batch: JournalBatch) -> tuple[int, ...]:
        """Write `batch` atomically; returns the sequence numbers given to its events.

        Raises:
            JournalError: the write failed; nothing of the batch is stored.
        """
        ...

    def events(self, after_seq: int = 0, limit: int = 1000) -> tuple[JournaledEvent, ...]:
        """Events with seq > `after_seq`, oldest first, at most `limit`."""
        ...

    def blob(self, name: str) -> Blob | None:
        """A collaborator's stored blob."""
        ...

    def close(self) -> None:
        """Release the journal; safe to call twice."""
        ...


def _check_blobs(stored: Mapping[str, int], blobs: Mapping[str, Blob]) -> None:
    """Refuse a blob older than the stored one (`stored`: blob name -> version) or not JSON."""
    for name, blob in blobs.items():
        old = stored.get(name)
        if old is not None and blob.version < old:
            raise JournalError(f"blob {name!r}: version {blob.version} is older than the stored version {old}")
        try:
            json.loads(blob.data)
        except ValueError as exc:
            raise JournalError(f"blob {name!r} is not JSON: {exc}") from exc


def _lines_to_store(stored: Mapping[str, int], batch: JournalBatch) -> dict[str, list[ChangeLine]]:
    """The batch's change lines that no stored (`stored`: blob name -> version) or written blob
    holds, by blob name.

    Raises:
        JournalError: a line is not JSON.
    """
    out: dict[str, list[ChangeLine]] = {}
    for name, lines in batch.changes.items():
        written = batch.blobs.get(name)
        floor = max(written.version if written else -1, stored.get(name, -1))
        kept = [line for line in lines if line.seq > floor]
        for line in kept:
            try:
                json.loads(line.data)
            except ValueError as exc:
                raise JournalError(f"change {line.seq} of {name!r} is not JSON: {exc}") from exc
        if kept:
            out[name] = kept
    return out


class MemoryJournal:
    """The in-memory fake: same contract, nothing survives the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[int, NodeRecord] = {}
        self._work: dict[int, PendingWork] = {}
        self._job: dict[str, Any] | None = None
        self._events: list[JournaledEvent] = []
        self._checkpoints: dict[int, CheckpointCommit] = {}
        self._blobs: dict[str, Blob] = {}
        self._changes: dict[str, dict[int, ChangeLine]] = {}

    def load(self) -> JournalState:
        """See `StateJournal.load`."""
        with self._lock:
            return JournalState(
                lifecycle=_snapshot(self._job, list(self._nodes.values()), dict(self._work)),
                job=dict(self._job) if self._job is not None else None,
                checkpoints=tuple(self._checkpoints[s] for s in sorted(self._checkpoints)),
                blobs=dict(self._blobs),
                last_event_seq=self._events[-1].seq if self._events else 0,
                changes={
                    name: tuple(lines[k] for k in sorted(lines)) for name, lines in self._changes.items() if lines
                },
            )

    def commit(self, batch: JournalBatch) -> tuple[int, ...]:
        """See `StateJournal.commit`."""
        with self._lock:
            versions = {name: blob.version for name, blob in self._blobs.items()}
            _check_blobs(versions, batch.blobs)
            lines = _lines_to_store(versions, batch)
            for node in batch.nodes:
                self._nodes[node.node_id] = node
            for node_id, owed in batch.work.items():
                if owed.empty:
                    self._work.pop(node_id, None)
                else:
                    self._work[node_id] = owed
            if batch.job is not None:
                self._job = dict(batch.job)
            seqs = []
            for event in batch.events:
                seq = (self._events[-1].seq if self._events else 0) + 1
                self._events.append(attrs.evolve(event, seq=seq, data=dict(event.data)))
                seqs.append(seq)
            if batch.checkpoint is not None:
                self._checkpoints[batch.checkpoint.step] = batch.checkpoint
            self._blobs.update(batch.blobs)
            for name, blob in batch.blobs.items():
                held = self._changes.get(name, {})
                self._changes[name] = {k: v for k, v in held.items() if k > blob.version}
            for name, kept in lines.items():
                stored = self._changes.setdefault(name, {})
                for line in kept:
                    stored.setdefault(line.seq, line)
            return tuple(seqs)

    def events(self, after_seq: int = 0, limit: int = 1000) -> tuple[JournaledEvent, ...]:
        """See `StateJournal.events`."""
        with self._lock:
            return tuple(e for e in self._events if e.seq > after_seq)[: max(limit, 0)]

    def blob(self, name: str) -> Blob | None:
        """See `StateJournal.blob`."""
        with self._lock:
            return self._blobs.get(name)

    def close(self) -> None:
        """Nothing to release."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (node_id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, state TEXT NOT NULL,
                                  data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, wall_time REAL NOT NULL,
                                   kind TEXT NOT NULL, node_id INTEGER, rank INTEGER, message TEXT NOT NULL,
                                   data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (step INTEGER PRIMARY KEY, wall_time REAL NOT NULL,
                                        world_size INTEGER NOT NULL, path TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (name TEXT PRIMARY KEY, version INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending_work (node_id INTEGER PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS changes (name TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL,
                                    PRIMARY KEY (name, seq));
"""


SIDE_FILE_SUFFIXES = ("-wal", "-shm", "-journal")
"""SQLite's files beside the database: the write-ahead log, its shared-memory index, the rollback journal."""


def _make_private(db_path: Path) -> None:
    """Create the database file 0600 (empty) if missing, and narrow existing files to 0600.

    SQLite creates a new database file with mode 0644 less the umask, but gives its `-wal`,
    `-shm` and `-journal` files the database file's own mode (it chmods them to it): so a
    database file that exists with mode 0600 before SQLite opens it keeps every file 0600,
    whatever the umask. An empty file is a valid new database to SQLite. Files of a journal
    written by an older master (0644) are narrowed too.
    """
    fd = os.open(db_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in SIDE_FILE_SUFFIXES:
        side = db_path.with_name(db_path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(side, 0o600, follow_symlinks=False)


class SqliteJournal:
    """The journal in `<state_dir>/master.db`: SQLite in WAL mode, one transaction per commit.

    The directory is created with mode 0700 if missing; the database and SQLite's side files
    are 0600 (see `_make_private`). `synchronous=FULL` makes each commit durable when it
    returns, so a commit that answered an agent is never lost. Two masters must not share a
    journal: `create_master` locks the state directory (`dlrover.master.statedir`) first.

    Every sqlite3 error surfaces as a `JournalError` naming the file; a commit that fails (a full
    disk, a database another process holds locked) stores nothing of its batch.

    Args:
        state_dir: the state directory.
        busy_timeout_s: how long a commit waits for a lock another connection holds before it fails.

    Raises:
        ConfigError: `busy_timeout_s` is not positive.
        JournalError: the database cannot be opened, or was written by an unknown schema version.
    """

    def __init__(self, state_dir: str | os.PathLike[str], *, busy_timeout_s: float = 5.0) -> None:
        if not busy_timeout_s > 0:
            raise ConfigError(f"busy_timeout_s must be positive, got {busy_timeout_s!r}")
        directory = Path(state_dir)
        self._path = directory / DB_FILE_NAME
        self._lock = threading.Lock()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            _make_private(self._path)
            # One connection, used under our lock from the server's threads.
            self._db = sqlite3.connect(
                self._path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif row[0] not in {str(v) for v in range(1, SCHEMA_VERSION + 1)}:
                raise JournalError(f"{self._path} has schema version {row[0]}; this master reads {SCHEMA_VERSION}")
            # Older versions differ only by the tables the schema script has just created, and a
            # version-1 job record's pending work is read until the master rewrites it (see
            # `_snapshot`). The version changes with the first write an older master could not
            # read (a job record or pending work for 1, a change line for 2): a journal only
            # opened stays readable by one.
            self._schema = SCHEMA_VERSION if row is None else int(row[0])
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the journal {str(self._path)!r}: {exc}") from exc
        except OSError as exc:
            raise JournalError(f"cannot open the journal {str(self._path)!r}: {exc.strerror}") from exc
        self._closed = False

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def load(self) -> JournalState:
        """See `StateJournal.load`."""
        with self._lock:
            try:
                job_row = self._db.execute("SELECT value FROM meta WHERE key='job'").fetchone()
                nodes = [self._node(row) for row in self._db.execute("SELECT node_id, data FROM nodes")]
                work_rows = self._db.execute("SELECT node_id, data FROM pending_work")
                work = dict(self._pending_work(row) for row in work_rows)
                commits = tuple(
                    CheckpointCommit(step=s, wall_time=w, world_size=n, path=p)
                    for s, w, n, p in self._db.execute(
                        "SELECT step, wall_time, world_size, path FROM checkpoints ORDER BY step"
                    )
                )
                blobs = {n: Blob(v, d) for n, v, d in self._db.execute("SELECT name, version, data FROM blobs")}
                last = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
                rows = self._db.execute(
                    "SELECT c.name, c.seq, c.data FROM changes c LEFT JOIN blobs b ON b.name = c.name "
                    "WHERE c.seq > COALESCE(b.version, -1) ORDER BY c.name, c.seq"
                ).fetchall()
            except sqlite3.Error as exc:
                raise JournalError(f"cannot read the journal {str(self._path)!r}: {exc}") from exc
        job = self._json(job_row[0], "job record") if job_row else None
        changes: dict[str, list[ChangeLine]] = {}
        for name, seq, data in rows:
            changes.setdefault(name, []).append(ChangeLine(seq, data))
        return JournalState(
            lifecycle=_snapshot(job, nodes, work),
            checkpoints=commits,
            blobs=blobs,
            last_event_seq=last,
            job=job,
            changes={name: tuple(lines) for name, lines in changes.items()},
        )

    def _json(self, text: str, what: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise JournalError(f"corrupt {what} in {str(self._path)!r}: {exc}") from exc

    def _node(self, row: tuple[int, str]) -> NodeRecord:
        data = self._json(row[1], f"node {row[0]}")
        try:
            return node_from_dict(data)
        except DLRoverError as exc:
            raise JournalError(f"corrupt node {row[0]} in {str(self._path)!r}: {exc}") from exc

    def _pending_work(self, row: tuple[int, str]) -> tuple[int, PendingWork]:
        data = self._json(row[1], f"pending work of node {row[0]}")
        try:
            return row[0], pending_work_from_json(data)
        except DLRoverError as exc:
            raise JournalError(f"corrupt pending work of node {row[0]} in {str(self._path)!r}: {exc}") from exc

    def commit(self, batch: JournalBatch) -> tuple[int, ...]:
        """See `StateJournal.commit`."""
        if batch.empty:
            return ()
        with self._lock, self._errors("write"):
            if self._closed:
                raise JournalError(f"the journal {str(self._path)!r} is closed")
            # Only the stored versions: a blob's text (26 MB of shard base at 80,000 workers) is not read back.
            stored = {}
            for name in {*batch.blobs, *batch.changes}:
                row = self._db.execute("SELECT version FROM blobs WHERE name=?", (name,)).fetchone()
                if row is not None:
                    stored[name] = int(row[0])
            _check_blobs(stored, batch.blobs)
            lines = _lines_to_store(stored, batch)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seqs = self._write(batch, lines)
                self._db.execute("COMMIT")
                self._schema = max(self._schema, self._schema_needed(batch, lines))
            except BaseException:
                # A failed COMMIT (disk full, read-only file) leaves the transaction open: end it,
                # so nothing of the batch stays and the next commit starts clean.
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
            return seqs

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Every sqlite3 error surfaces as a `JournalError` naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            raise JournalError(f"cannot {what} the journal {str(self._path)!r}: {exc}") from exc

    @staticmethod
    def _schema_needed(batch: JournalBatch, lines: Mapping[str, list[ChangeLine]]) -> int:
        """The oldest schema version that can read what `batch` writes: a log-structured
        collaborator's blob or lines (`changes` names it) need 3, whose master reads them."""
        if lines or batch.changes:
            return 3
        if batch.job is not None or batch.work:
            return 2
        return 1

    def _write(self, batch: JournalBatch, lines: Mapping[str, list[ChangeLine]]) -> tuple[int, ...]:
        db = self._db
        db.executemany(
            "INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?)",
            [(n.node_id, n.rank, n.state.value, json.dumps(node_to_dict(n))) for n in batch.nodes],
        )
        db.executemany(
            "INSERT OR REPLACE INTO pending_work VALUES (?, ?)",
            [(i, json.dumps(pending_work_to_json(w))) for i, w in batch.work.items() if not w.empty],
        )
        db.executemany("DELETE FROM pending_work WHERE node_id = ?", [(i,) for i, w in batch.work.items() if w.empty])
        if batch.job is not None:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('job', ?)", (json.dumps(dict(batch.job)),))
        needed = self._schema_needed(batch, lines)
        if needed > self._schema:
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(needed),))
        seqs = []
        for e in batch.events:
            cur = db.execute(
                "INSERT INTO events (wall_time, kind, node_id, rank, message, data) VALUES (?, ?, ?, ?, ?, ?)",
                (e.wall_time, e.kind, e.node_id, e.rank, e.message, json.dumps(dict(e.data))),
            )
            seqs.append(int(cur.lastrowid or 0))
        if batch.checkpoint is not None:
            c = batch.checkpoint
            db.execute(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)", (c.step, c.wall_time, c.world_size, c.path)
            )
        for name, blob in batch.blobs.items():
            db.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)", (name, blob.version, blob.data))
            db.execute("DELETE FROM changes WHERE name = ? AND seq <= ?", (name, blob.version))
        for name, kept in lines.items():
            db.executemany(
                "INSERT OR IGNORE INTO changes VALUES (?, ?, ?)", [(name, line.seq, line.data) for line in kept]
            )
        return tuple(seqs)

    def events(self, after_seq: int = 0, limit: int = 1000) -> tuple[JournaledEvent, ...]:
        """See `StateJournal.events`."""
        with self._lock, self._errors("read"):
            rows = self._db.execute(
                "SELECT seq, wall_time, kind, message, node_id, rank, data FROM events WHERE seq > ? "
                "ORDER BY seq LIMIT ?",
                (after_seq, max(limit, 0)),
            ).fetchall()
        return tuple(
            JournaledEvent(seq, wall, kind, msg, nid, rank, self._json(data, f"event {seq}"))
            for seq, wall, kind, msg, nid, rank, data in rows
        )

    def blob(self, name: str) -> Blob | None:
        """See `StateJournal.blob`."""
        with self._lock, self._errors("read"):
            row = self._db.execute("SELECT version, data FROM blobs WHERE name=?", (name,)).fetchone()
        return None if row is None else Blob(row[0], row[1])

    def close(self) -> None:
        """Close the database; safe to call twice."""
        with self._lock, self._errors("close"):
            if not self._closed:
                self._closed = True
                self._db.close()
