"""The JSON-lines event log and goodput computed from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlrover.common import DLRoverError
from dlrover.master.eventlog import EventLog, compute_goodput, read_event_log
from dlrover.master.journal import JournaledEvent


def ev(t: float, kind: str, step: int | None = None) -> dict[str, Any]:
    return {"wall_time": t, "kind": kind, "data": {} if step is None else {"step": step}}


def test_goodput_counts_only_new_progress_between_interruptions() -> None:
    events = [
        ev(0, "job_start"),
        ev(10, "progress", 0),
        ev(20, "progress", 100),  # 10 s useful
        ev(25, "failure"),  # 20..25 lost (no progress event after 20 before the failure)
        ev(40, "progress", 50),  # restored from step 50: interval broken, nothing counted
        ev(50, "progress", 150),  # steps 50..150, of which 100..150 are new: 10 s * 50/100 = 5 s
        ev(60, "progress", 250),  # 10 s useful
    ]
    g = compute_goodput(events, now_wall=100)
    assert g.useful_s == pytest.approx(25.0)
    assert g.elapsed_s == 100
    assert g.ratio == pytest.approx(0.25)
    assert compute_goodput([]).ratio == 0.0


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
    assert compute_goodput(events).elapsed_s == 1.0
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
