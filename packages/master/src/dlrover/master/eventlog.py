"""The job's timeline as JSON lines, and goodput computed from it.

Each line is one event: `{"seq", "wall_time", "kind", "message", "node_id", "rank", "data"}`.
The log is for people and tools (`jq`, dashboards); the journal is what the master restores from.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs

from dlrover.common import DLRoverError
from dlrover.master.journal import JournaledEvent

__all__ = [
    "INTERRUPTION_KINDS",
    "EventLog",
    "EventLogInUseError",
    "Goodput",
    "GoodputTracker",
    "compute_goodput",
    "event_to_dict",
    "read_event_log",
]

# Events that break a stretch of useful training: time across them is not counted as useful.
INTERRUPTION_KINDS = frozenset({"failure", "process_restart", "relaunch", "job_end", "master_restart"})


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


@attrs.frozen
class Goodput:
    """Useful training time over elapsed time.

    Attributes:
        useful_s: seconds spent making new progress (steps beyond the best step reached before).
        elapsed_s: seconds since the job started.
    """

    useful_s: float
    elapsed_s: float

    @property
    def ratio(self) -> float:
        """useful_s / elapsed_s, 0 before any time has passed."""
        return self.useful_s / self.elapsed_s if self.elapsed_s > 0 else 0.0


class GoodputTracker:
    """Goodput computed incrementally, one event at a time (see `compute_goodput` for the rule)."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._last_time: float | None = None
        self._previous: tuple[float, int] | None = None
        self._best = -1
        self._useful = 0.0

    def add(self, event: Mapping[str, Any]) -> None:
        """Account for one event (events must arrive in time order)."""
        t = float(event["wall_time"])
        kind = event["kind"]
        if self._start is None or (kind == "job_start" and self._start > t):
            self._start = t
        self._last_time = t
        if kind in INTERRUPTION_KINDS:
            self._previous = None
        elif kind == "progress":
            step = int(event["data"]["step"])
            prev = self._previous
            if prev is not None and step > prev[1] and t > prev[0]:
                new_steps = step - max(prev[1], self._best)
                if new_steps > 0:
                    self._useful += (t - prev[0]) * new_steps / (step - prev[1])
            self._best = max(self._best, step)
            self._previous = (t, step)

    def goodput(self, now_wall: float | None = None) -> Goodput:
        """Goodput so far; elapsed time runs to `now_wall` (or the last event)."""
        if self._start is None:
            return Goodput(0.0, 0.0)
        end = now_wall if now_wall is not None else (self._last_time or self._start)
        return Goodput(self._useful, max(end - self._start, 0.0))


def compute_goodput(events: Iterable[Mapping[str, Any]], now_wall: float | None = None) -> Goodput:
    """Goodput from the event timeline.

    `progress` events carry `data.step`, the job's newest step. Between two consecutive progress
    events with no interruption (a failure, restart or relaunch) in between, the time counts as
    useful in proportion to the steps that go beyond the best step reached before: steps redone
    after restoring an older checkpoint are not useful. Elapsed time runs from `job_start` (or the
    first event) to `now_wall` (or the last event).
    """
    tracker = GoodputTracker()
    for event in events:
        tracker.add(event)
    return tracker.goodput(now_wall)
