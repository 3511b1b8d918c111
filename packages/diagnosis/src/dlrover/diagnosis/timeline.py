"""Per-rank step progress turned into step durations: the shared input of both detectors.

A step duration is recorded only for a step taken entirely in the ``train`` phase after the
warm-up steps, so a slow first step (compilation, data-loader start) or a checkpoint between two
steps does not distort the step times ranks are compared by. The hang windows are built on the
training time between marks instead (see below).

A rank need not mark every step: one whose only marks are its checkpointer's (a save every 100
steps) advances many steps at a time, each mark inside a save. Every advance after the warm-up is
kept as the seconds the rank spent in ``train`` between the two marks (`RankProgress.gaps`: how
long it may train before its next mark in the normal course; the saves between are judged by
their own phase's allowance, and the wait in ``train`` is measured from their end); a clean one
also as seconds per step (`RankProgress.durations`, what ranks are compared by). Time is
attributed to the phase the rank was known to be in: a phase entered and left between two
reports counts as training.
"""

from __future__ import annotations

from collections import deque

import attrs

from dlrover.common import ConfigError
from dlrover.diagnosis.evidence import DEFAULT_PHASE, StepReport

__all__ = ["RankProgress", "StepTimeline"]


@attrs.define
class RankProgress:
    """What is known about one rank's progress (mutable; owned by a `StepTimeline`).

    Attributes:
        rank: the rank.
        step: the last step it reported.
        last_advance_s: when its step last increased (or when it was first seen).
        last_report_s: when it last reported anything.
        phase: its current phase.
        phase_since_s: when it entered that phase.
        advances: how many times its step increased.
        durations: recent clean step durations (seconds per step), oldest first.
        clean: whether it stayed in ``train`` since its last advance.
        gaps: the seconds spent in ``train`` between consecutive marks after the warm-up.
        train_s: the seconds spent in ``train`` since the last advance, up to the last report.
        steps_per_mark: how many steps the rank's own marks usually cover, as its last report
            said (`StepReport.steps_per_mark`).
    """

    rank: int
    step: int
    last_advance_s: float
    last_report_s: float
    phase: str
    phase_since_s: float
    advances: int = 0
    durations: deque[float] = attrs.field(factory=deque)
    clean: bool = False
    gaps: deque[float] = attrs.field(factory=deque)
    train_s: float = 0.0
    steps_per_mark: float = 1.0

    @property
    def idle_since_s(self) -> float:
        """The time from which the current wait is measured: last advance or phase change."""
        return max(self.last_advance_s, self.phase_since_s)

    def copy(self) -> RankProgress:
        """An independent copy (the histories are copied too)."""
        return attrs.evolve(self, durations=deque(self.durations), gaps=deque(self.gaps))


class StepTimeline:
    """Collects step reports per rank.

    Args:
        history_steps: gaps and clean durations kept per rank.
        warmup_steps: steps per rank whose duration is never recorded.
    """

    def __init__(self, history_steps: int, warmup_steps: int) -> None:
        self._history = history_steps
        self._warmup = warmup_steps
        self._ranks: dict[int, RankProgress] = {}

    def start(self, ranks: list[int] | tuple[int, ...] | range, now: float) -> None:
        """Expect `ranks` from `now` on, so a rank that never reports is caught as well."""
        for rank in ranks:
            if rank < 0:
                raise ConfigError(f"ranks must be >= 0, got {rank!r}")
        for rank in ranks:
            if rank not in self._ranks:
                self._ranks[rank] = RankProgress(rank, 0, now, now, DEFAULT_PHASE, now)

    def observe(self, report: StepReport) -> None:
        """Record one report.

        Raises:
            ConfigError: if the report is older than the rank's previous one; nothing changes.
        """
        state = self._ranks.get(report.rank)
        now = report.time_s
        if state is None:
            self._ranks[report.rank] = RankProgress(
                report.rank,
                report.step,
                now,
                now,
                report.phase,
                now,
                advances=0,
                clean=report.phase == DEFAULT_PHASE,
                steps_per_mark=report.steps_per_mark,
            )
            return
        if now < state.last_report_s:
            raise ConfigError(
                f"step report of rank {report.rank} at {now!r} is older than "
                f"its previous one at {state.last_report_s!r}"
            )
        if state.phase == DEFAULT_PHASE:
            state.train_s += now - state.last_report_s
        state.last_report_s = now
        state.steps_per_mark = report.steps_per_mark
        if report.step > state.step:
            if state.advances >= self._warmup:
                # Every mark after the warm-up says how long the rank trains between marks (a rank
                # marked only by its saves has no other measure); only a step taken wholly in
                # training is a step duration.
                state.gaps.append(state.train_s)
                if state.clean and report.phase == DEFAULT_PHASE:
                    state.durations.append(state.train_s / (report.step - state.step))
                for history in (state.durations, state.gaps):
                    while len(history) > self._history:
                        history.popleft()
            state.advances += 1
            state.step = report.step
            state.last_advance_s = now
            state.train_s = 0.0
            state.clean = True
        elif report.step < state.step:
            # A restarted worker resumes from a checkpoint: progress again, warming up again.
            state.step = report.step
            state.last_advance_s = now
            state.train_s = 0.0
            state.clean = False
            state.advances = 0
        if report.phase != state.phase:
            state.phase = report.phase
            state.phase_since_s = now
            state.clean = False
        if state.phase != DEFAULT_PHASE:
            state.clean = False

    def forget(self, rank: int) -> None:
        """Stop tracking `rank` (it left the job)."""
        self._ranks.pop(rank, None)

    def ranks(self) -> tuple[RankProgress, ...]:
        """Every tracked rank, ascending."""
        return tuple(self._ranks[r] for r in sorted(self._ranks))
