"""The step marks an agent batches onto its heartbeats for the master's goodput accounting.

One `AttemptLedger` per set of workers (an *attempt*): it follows the node's local rank 0, turns
each new step the agent reads from its slot into a `StepMark` (wall time, cumulative seconds
blocked in checkpoint saves, samples), and keeps the attempt's rendezvous and start times. A
`StepLedger` holds the current attempt and what earlier attempts still owe the master (the last
marks of workers that failed), and hands everything not yet sent to the next heartbeat; marks the
master did not get (the heartbeat failed) are sent again with the next one. A heartbeat carries at
most `MAX_ATTEMPTS_PER_HEARTBEAT` attempts (the master refuses more), so while heartbeats fail the
ledger keeps that many attempts and drops the marks of the oldest, with a warning that names them.

Pure: readings, CLOCK_MONOTONIC times and the offset to wall time come in as arguments.
"""

from __future__ import annotations

import logging

import attrs

from dlrover.common.step_slots import SlotReading
from dlrover.master.goodput import MAX_ATTEMPTS_PER_HEARTBEAT, AttemptReport, StepMark

__all__ = ["AttemptLedger", "StepLedger"]

_log = logging.getLogger(__name__)

MAX_PENDING_MARKS = 1024
"""Marks kept per attempt while heartbeats fail; beyond it the oldest are merged into the next."""


@attrs.define
class AttemptLedger:
    """Step marks of one set of workers, as read from local rank 0's slot.

    Args:
        attempt: the agent's count of worker starts.
        rank: the global rank of local rank 0.
        rendezvous_start: when the agent joined the round (wall seconds).
        rendezvous_end: when the round completed.
        workers_start: when the workers were started.
        wall_offset: wall seconds minus CLOCK_MONOTONIC seconds (the slots' clock).
    """

    attempt: int
    rank: int
    rendezvous_start: float | None
    rendezvous_end: float | None
    workers_start: float | None
    wall_offset: float
    ready_time: float | None = None
    load_s: float = 0.0
    last_seq: int = -1
    last_step: int = 0
    pending: list[StepMark] = attrs.Factory(list)

    def observe(self, reading: SlotReading | None) -> None:
        """Feed the latest reading of local rank 0's slot (None: not written yet)."""
        if reading is None or reading.seq == self.last_seq:
            return
        self.last_seq = reading.seq
        if reading.ready_s > 0:
            self.ready_time = reading.ready_s + self.wall_offset
        self.load_s = max(reading.load_s, 0.0)
        if reading.step > self.last_step and reading.step_end_s > 0:
            self.last_step = reading.step
            self.pending.append(
                StepMark(
                    step=reading.step,
                    end_time=reading.step_end_s + self.wall_offset,
                    save_s=max(reading.save_s, 0.0),
                    samples=max(reading.samples, 0),
                )
            )
            if len(self.pending) > MAX_PENDING_MARKS:
                # Merging two marks loses only the boundary between them; the time stays counted.
                del self.pending[0]

    def report(self) -> AttemptReport:
        """Everything not yet acknowledged: the attempt's times and its pending marks."""
        return AttemptReport(
            node_id=0,  # stamped by the master from the caller's identity
            attempt=self.attempt,
            rank=self.rank,
            rendezvous_start=self.rendezvous_start,
            rendezvous_end=self.rendezvous_end,
            workers_start=self.workers_start,
            ready_time=self.ready_time,
            load_s=self.load_s,
            marks=tuple(self.pending),
        )

    def acknowledge(self, sent: AttemptReport) -> None:
        """The master received `sent`: drop the marks it carried."""
        count = len(sent.marks)
        del self.pending[:count]


class StepLedger:
    """The current attempt and earlier ones with marks the master has not received yet."""

    def __init__(self) -> None:
        self._attempts: list[AttemptLedger] = []
        self._count = 0
        self._dropped_marks = 0

    @property
    def dropped_marks(self) -> int:
        """Unsent marks dropped so far because too many attempts were waiting for the master."""
        return self._dropped_marks

    @property
    def current(self) -> AttemptLedger | None:
        """The attempt of the workers started last."""
        return self._attempts[-1] if self._attempts else None

    def start_attempt(
        self,
        rank: int,
        *,
        rendezvous_start: float | None,
        rendezvous_end: float | None,
        workers_start: float,
        wall_offset: float,
    ) -> AttemptLedger:
        """New workers started; earlier attempts are kept until their marks are sent.

        At most `MAX_ATTEMPTS_PER_HEARTBEAT` attempts are kept, the new one included: the master refuses a
        heartbeat with more, and then every later heartbeat would be refused. The oldest attempts beyond that
        are dropped with their unsent marks, and a warning says which and how many marks.
        """
        self._count += 1
        self._attempts = [a for a in self._attempts if a.pending]
        excess = len(self._attempts) + 1 - MAX_ATTEMPTS_PER_HEARTBEAT
        if excess > 0:
            dropped, self._attempts = self._attempts[:excess], self._attempts[excess:]
            self._dropped_marks += sum(len(a.pending) for a in dropped)
            _log.warning(
                "the master has not received step marks of %d earlier worker starts; a heartbeat carries at most "
                "%d, so the oldest are dropped: %s (goodput loses their step boundaries)",
                len(self._attempts) + len(dropped),
                MAX_ATTEMPTS_PER_HEARTBEAT,
                ", ".join(f"attempt {a.attempt} ({len(a.pending)} mark(s))" for a in dropped),
            )
        ledger = AttemptLedger(self._count, rank, rendezvous_start, rendezvous_end, workers_start, wall_offset)
        self._attempts.append(ledger)
        return ledger

    def observe(self, reading: SlotReading | None) -> None:
        """Feed local rank 0's slot to the current attempt."""
        if self._attempts:
            self._attempts[-1].observe(reading)

    def reports(self) -> tuple[AttemptReport, ...]:
        """What the next heartbeat carries: each attempt with unsent marks, and the current one."""
        out = [a.report() for a in self._attempts[:-1] if a.pending]
        if self._attempts:
            out.append(self._attempts[-1].report())
        return tuple(out)

    def acknowledge(self, sent: tuple[AttemptReport, ...]) -> None:
        """A heartbeat carrying `sent` was answered."""
        by_attempt = {a.attempt: a for a in self._attempts}
        for report in sent:
            ledger = by_attempt.get(report.attempt)
            if ledger is not None:
                ledger.acknowledge(report)
        current = self.current
        self._attempts = [a for a in self._attempts if a.pending or a is current]
