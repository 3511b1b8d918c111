"""The job's timeline as JSON lines (goodput is computed from it by `dlrover.master.goodput`).

Each line is one event: `{"seq", "wall_time", "kind", "message", "node_id", "rank", "data"}`.
The log is for people and tools (`jq`, dashboards); the journal is what the master restores from.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from dlrover.common import DLRoverError
from dlrover.master.journal import JournaledEvent

__all__ = [
    "EventLog",
    "EventLogInUseError",
    "event_to_dict",
    "read_event_log",
]


class EventLogInUseError(DLRoverError):
    """Another writer holds the event log's lock."""


def event_to_dict(event: JournaledEvent) -> dict[str, Any]:
    """The JSON form of an event."""
    return {
        "seq": event.seq,
        "wall_time": event.wall_time,
        "kind": event.kind,
        "message": event.message,
        "node_id": event.node_id,
        "rank": event.rank,
        "data": dict(event.data),
    }


def _drop_torn_tail(fd: int) -> None:
    """Cut a partial last line left by a crash mid-write, so appended lines stay whole.

    The event it held is not lost: the journal, written before the log, still has it.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return
    tail = os.pread(fd, min(size, 1 << 20), max(size - (1 << 20), 0))
    if tail.endswith(b"\n"):
        return
    cut = tail.rfind(b"\n")
    os.ftruncate(fd, max(size - len(tail), 0) + cut + 1 if cut >= 0 else max(size - len(tail), 0))


class EventLog:
    """Appends events to a JSON-lines file (0600), flushing each line; one writer at a time.

    The file is locked (`flock`, exclusive) while it is open, before anything in it is changed:
    a second writer, another master given the same `--event-log`, is refused and touches nothing.
    An existing file is narrowed to mode 0600.

    Args:
        path: the file; its directory must exist.

    Raises:
        EventLogInUseError: another `EventLog` holds the file.
        DLRoverError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise DLRoverError(f"cannot open the event log {str(self._path)!r}: {exc.strerror}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise EventLogInUseError(
                    f"the event log {str(self._path)!r} is being written by another master; give each job its own"
                ) from None
            os.fchmod(fd, 0o600)
            _drop_torn_tail(fd)
        except OSError as exc:
            os.close(fd)
            raise DLRoverError(f"cannot open the event log {str(self._path)!r}: {exc.strerror}") from exc
        except BaseException:
            os.close(fd)
            raise
        self._file: TextIO | None = os.fdopen(fd, "a", encoding="utf-8")

    @property
    def path(self) -> Path:
        """The log file."""
        return self._path

    def write(self, events: Iterable[JournaledEvent]) -> None:
        """Append events, one line each."""
        with self._lock:
            if self._file is None:
                return
            for event in events:
                self._file.write(json.dumps(event_to_dict(event), sort_keys=True) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file; safe to call twice."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_event_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every event in a JSON-lines log; a torn last line (a crash mid-write) is skipped.

    Raises:
        DLRoverError: a line other than the last is not JSON.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError as exc:
            if number == len(lines):
                break
            raise DLRoverError(f"{path}:{number} is not JSON: {exc}") from exc
    return events
