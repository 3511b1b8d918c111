"""The agent's step ledger: marks of local rank 0 per set of workers, sent until acknowledged."""

from __future__ import annotations

import logging

import pytest

from dlrover.common.step_slots import SlotReading
from dlrover.launcher.step_ledger import MAX_PENDING_MARKS, StepLedger
from dlrover.master.goodput import MAX_ATTEMPTS_PER_HEARTBEAT


def reading(
    seq: int, step: int, end: float, *, ready: float = 1.0, load: float = 0.0, save: float = 0.0
) -> SlotReading:
    return SlotReading(seq, step, step * 4, end, "train", ready, 1, ready, load, save)


def test_marks_are_in_wall_time_and_resent_until_acknowledged() -> None:
    ledger = StepLedger()
    ledger.start_attempt(0, rendezvous_start=100.0, rendezvous_end=101.0, workers_start=101.5, wall_offset=1000.0)
    ledger.observe(None)
    ledger.observe(reading(2, 1, 3.0, ready=2.0, load=0.5))
    ledger.observe(reading(2, 1, 3.0, ready=2.0, load=0.5))  # the same read: nothing new
    ledger.observe(reading(4, 2, 4.0, ready=2.0, load=0.5, save=0.25))
    (sent,) = ledger.reports()
    assert (sent.attempt, sent.rank, sent.rendezvous_start, sent.rendezvous_end) == (1, 0, 100.0, 101.0)
    assert sent.ready_time == 1002.0
    assert sent.load_s == 0.5
    marks = [(m.step, m.end_time, m.save_s, m.samples) for m in sent.marks]
    assert marks == [(1, 1003.0, 0.0, 4), (2, 1004.0, 0.25, 8)]
    # Not acknowledged (the heartbeat failed): sent again, with what came since.
    ledger.observe(reading(6, 3, 5.0))
    again = ledger.reports()[0]
    assert [m.step for m in again.marks] == [1, 2, 3]
    ledger.acknowledge(ledger.reports())
    assert ledger.reports()[0].marks == ()


def test_a_failed_attempts_last_marks_go_with_the_next_heartbeat() -> None:
    ledger = StepLedger()
    ledger.start_attempt(0, rendezvous_start=None, rendezvous_end=None, workers_start=0.0, wall_offset=0.0)
    ledger.observe(reading(2, 5, 5.0))
    ledger.start_attempt(0, rendezvous_start=6.0, rendezvous_end=7.0, workers_start=7.0, wall_offset=0.0)
    ledger.observe(reading(2, 3, 9.0, ready=8.0))
    old, new = ledger.reports()
    assert (old.attempt, [m.step for m in old.marks]) == (1, [5])
    assert (new.attempt, [m.step for m in new.marks]) == (2, [3])
    ledger.acknowledge((old, new))
    (current,) = ledger.reports()
    assert current.attempt == 2
    assert current.marks == ()


def test_pending_marks_are_bounded() -> None:
    ledger = StepLedger()
    ledger.start_attempt(0, rendezvous_start=None, rendezvous_end=None, workers_start=0.0, wall_offset=0.0)
    for step in range(1, MAX_PENDING_MARKS + 10):
        ledger.observe(reading(2 * step, step, float(step)))
    marks = ledger.reports()[0].marks
    assert len(marks) == MAX_PENDING_MARKS
    assert marks[-1].step == MAX_PENDING_MARKS + 9


def test_attempts_waiting_for_the_master_are_capped_at_what_a_heartbeat_carries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = StepLedger()
    # Heartbeats fail throughout: every worker start leaves one unsent mark behind.
    starts = MAX_ATTEMPTS_PER_HEARTBEAT + 3
    with caplog.at_level(logging.WARNING, logger="dlrover.launcher.step_ledger"):
        for n in range(1, starts + 1):
            ledger.start_attempt(0, rendezvous_start=None, rendezvous_end=None, workers_start=0.0, wall_offset=0.0)
            ledger.observe(reading(2, n, float(n)))
            assert len(ledger.reports()) <= MAX_ATTEMPTS_PER_HEARTBEAT
    sent = ledger.reports()
    assert len(sent) == MAX_ATTEMPTS_PER_HEARTBEAT  # the master takes it
    assert [r.attempt for r in sent] == list(range(starts - MAX_ATTEMPTS_PER_HEARTBEAT + 1, starts + 1))
    assert [m.step for r in sent for m in r.marks] == [r.attempt for r in sent]  # the newest marks are kept
    assert ledger.dropped_marks == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert "attempt 1 (1 mark(s))" in warnings[0]
    assert "attempt 3 (1 mark(s))" in warnings[2]
    ledger.acknowledge(sent)
    (current,) = ledger.reports()
    assert (current.attempt, current.marks) == (starts, ())


def test_attempts_without_unsent_marks_are_not_dropped_and_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    ledger = StepLedger()
    with caplog.at_level(logging.WARNING, logger="dlrover.launcher.step_ledger"):
        for _ in range(MAX_ATTEMPTS_PER_HEARTBEAT * 2):
            ledger.start_attempt(0, rendezvous_start=None, rendezvous_end=None, workers_start=0.0, wall_offset=0.0)
            ledger.observe(reading(2, 1, 1.0))
            ledger.acknowledge(ledger.reports())  # the master got every mark
    assert len(ledger.reports()) == 1
    assert ledger.dropped_marks == 0
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
