"""The JSON-lines event log (goodput computed from it: test_goodput.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover.common import DLRoverError
from dlrover.master.eventlog import EventLog, read_event_log
from dlrover.master.goodput import compute_breakdown
from dlrover.master.journal import JournaledEvent


def test_event_log_round_trips_and_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.write(
        [
            JournaledEvent(1, 5.0, "job_start", "job started", None, None, {}),
            JournaledEvent(2, 6.0, "progress", "s", 0, 0, {"step": 3}),
        ]
    )
    log.close()
    log.close()
    log.write([JournaledEvent(3, 7.0, "x", "ignored after close", None, None, {})])
    assert path.stat().st_mode & 0o777 == 0o600
    with open(path, "a") as f:
        f.write('{"seq": 3, "wall')
    events = read_event_log(path)
    assert [e["kind"] for e in events] == ["job_start", "progress"]
    assert events[1]["data"] == {"step": 3}
    assert compute_breakdown(events).elapsed_s == 1.0
    with open(path, "a") as f:
        f.write('\n{"ok": 1}\n')
    with pytest.raises(DLRoverError, match=r"events\.jsonl:3 is not JSON"):
        read_event_log(path)


def test_reopening_after_a_torn_write_keeps_every_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.write([JournaledEvent(1, 5.0, "job_start", "job started", None, None, {})])
    log.close()
    with open(path, "a") as f:
        f.write('{"seq": 2, "wall')  # the master died mid-line
    log = EventLog(path)
    log.write([JournaledEvent(3, 6.0, "master_restart", "resumed", None, None, {})])
    log.close()
    assert [e["kind"] for e in read_event_log(path)] == ["job_start", "master_restart"]
