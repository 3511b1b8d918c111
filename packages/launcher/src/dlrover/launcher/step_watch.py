"""The agent's view of its workers' step reports: hang detection and the stats heartbeats carry.

Workers write their progress into their slot of the node's step slot file
(`dlrover.common.step_slots`); each monitor tick the agent hands the slots it read to a
`StepWatch`, which turns them into `StepReport`s for the adaptive `HangDetector` and keeps what
the heartbeat batches to the master (`RankStepStats`: steps, samples, recent step time and lead
time, see `dlrover.common.step_slots`). A rank blocked in a collective burns CPU
while it spins, so the CPU-idle watch (`dlrover.launcher.hang`) misses it; its step reports stop
all the same.

Pure: readings and ``now`` (CLOCK_MONOTONIC seconds, the clock the workers stamp with) come in as
arguments. A rank is judged only once it has marked enough steps itself for the detector to know
its pace (`HangConfig.warmup_steps` + `min_step_samples` step marks): a script that never marks a
step, a rank that never does (rank 0 alone saving checkpoints), one that only counts samples, or
one whose marks are far apart at first (a checkpoint saved every half hour) is never called hung
by it; the CPU-idle watch still covers them. A collective hang stops every rank's steps, so the
ranks that did mark steps reveal it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence

from dlrover.common import ConfigError
from dlrover.common.step_slots import SlotReading
from dlrover.diagnosis import (
    AnchoredExcuse,
    HangConfig,
    HangDetector,
    HangReport,
    PeerExcuse,
    RankStepStats,
    StepReport,
)

__all__ = ["LEAD_MIN_SAMPLES", "LEAD_SAMPLES", "StepWatch"]

LEAD_SAMPLES = 5
"""Lead times kept per rank for the median the heartbeat carries: one per monitor tick that saw
the rank synchronize (one per step where steps outlast the tick). Few, so a rank slowed now shows
once three of its samples are slowed (a job of 5 s steps finds it in 15 s, not in the 50 s of
ten); the median still ignores two odd ones (a garbage collection, a slow batch)."""
LEAD_MIN_SAMPLES = 3
"""A rank's lead is sent to the master once this many samples are in (one alone may be a warm-up
step's)."""
# Steps per mark kept per rank (one per reading that saw marks), for their median.
_PER_MARK_SAMPLES = 16


class StepWatch:
    """Step progress of one set of workers (one attempt).

    Args:
        ranks: local rank -> global rank of every worker.
        hang: the hang detector's settings; None: hangs are not judged (stats are still kept).
    """

    def __init__(self, ranks: Mapping[int, int], hang: HangConfig | None) -> None:
        self._ranks = dict(ranks)
        self._judge = hang is not None
        config = hang or HangConfig()
        self._detector = HangDetector(config)
        self._seen: dict[int, SlotReading] = {}
        self._last_time: dict[int, float] = {}
        self._started = False
        self._marks: dict[int, int] = {}  # global rank -> step marks seen from it
        self._leads: dict[int, deque[float]] = {}  # global rank -> recent lead times
        self._lead_at_mark: dict[int, int] = {}  # global rank -> its marks seen at its last lead sample
        self._groups: dict[int, int] = {}  # global rank -> the group it synchronizes with
        self._per_mark: dict[int, deque[float]] = {}  # global rank -> recent steps per mark
        self._marks_to_judge = max(config.warmup_steps + config.min_step_samples, 1)
        self._postponed_until = float("-inf")
        # When the ranks were first excused as busy, since the last mark; None once a probe found them idle.
        self._busy_since: float | None = None
        self._elsewhere: list[AnchoredExcuse] = []  # peers of other nodes, on this clock
        self._elsewhere_valid_until = float("-inf")  # relayed excuses are not used past this

    @property
    def reporting(self) -> bool:
        """Whether any worker has reported yet."""
        return self._started

    def observe(self, readings: Mapping[int, SlotReading], now: float) -> None:
        """Feed the slots read at `now` (local rank -> reading); unchanged ones are skipped."""
        for local_rank in sorted(readings):
            reading = readings[local_rank]
            rank = self._ranks.get(local_rank)
            if rank is None:
                continue
            before = self._seen.get(local_rank)
            if before is not None and before.seq == reading.seq:
                continue
            self._observe_leads(rank, before, reading)
            old_step = before.step if before is not None else 0
            old_phase = before.phase if before is not None else "train"
            if reading.step > old_step:
                self._marks[rank] = self._marks.get(rank, 0) + 1
                self._postponed_until, self._busy_since = float("-inf"), None  # progress: judge afresh
                per_mark = reading.steps_per_mark(before) if before is not None else None
                if per_mark is not None:
                    # From the slot's own count of marks: a rank that marks every step of 5 ms
                    # moves 20 steps between two 0.1 s reads, yet each mark covers one step.
                    self._per_mark.setdefault(rank, deque(maxlen=_PER_MARK_SAMPLES)).append(per_mark)
            elif reading.phase == old_phase:
                self._seen[local_rank] = reading  # samples only: a count, not a step
                continue
            if not self._started:
                # Every worker is expected from the first report of any: they run the same script,
                # so one that never reports is stuck before its first step.
                self._detector.start(sorted(self._ranks.values()), now)
                self._last_time = dict.fromkeys(self._ranks.values(), now)
                self._started = True
            self._seen[local_rank] = reading
            for report in self._reports(rank, before, reading):
                self._detector.observe(report)
                self._last_time[rank] = report.time_s

    def _observe_leads(self, rank: int, before: SlotReading | None, now: SlotReading) -> None:
        """Keep the mean lead time of the steps that synchronized since the last reading. A rank
        that has gone on stepping without synchronizing (a long stretch of steps with no
        collective, a switch to another model) has no current lead: its old ones go."""
        lead_s, leads = (before.lead_s, before.lead_steps) if before is not None else (0.0, 0)
        if now.lead_steps > leads and math.isfinite(now.lead_s) and now.lead_s >= lead_s:
            history = self._leads.setdefault(rank, deque(maxlen=LEAD_SAMPLES))
            history.append((now.lead_s - lead_s) / (now.lead_steps - leads))
            self._lead_at_mark[rank] = self._marks.get(rank, 0)
            self._groups[rank] = now.sync_group
        elif rank in self._leads and self._marks.get(rank, 0) - self._lead_at_mark.get(rank, 0) > LEAD_SAMPLES:
            del self._leads[rank]  # marks seen since its last lead, none with a synchronization

    def _reports(self, rank: int, before: SlotReading | None, now: SlotReading) -> list[StepReport]:
        floor = self._last_time.get(rank, 0.0)
        old_step = before.step if before is not None else 0
        old_phase = before.phase if before is not None else "train"
        out: list[StepReport] = []
        try:
            if now.step > old_step:
                if now.phase != old_phase and now.phase_since_s > now.step_end_s:
                    # The step ended in the old phase; the new one began after it.
                    out.append(StepReport(rank, now.step, max(floor, now.step_end_s), old_phase))
                    out.append(StepReport(rank, now.step, max(floor, now.phase_since_s), now.phase))
                elif now.phase != old_phase:
                    # The new phase began before the step ended (a mark inside a save, or a mark
                    # after returning to training): each stretch goes to its own phase.
                    out.append(StepReport(rank, old_step, max(floor, now.phase_since_s), now.phase))
                    out.append(StepReport(rank, now.step, max(floor, now.step_end_s), now.phase))
                else:
                    out.append(StepReport(rank, now.step, max(floor, now.step_end_s), now.phase))
            elif now.phase != old_phase:
                out.append(StepReport(rank, max(now.step, 0), max(floor, now.phase_since_s), now.phase))
        except ConfigError:
            return []  # a slot with nonsense (a negative step) says nothing
        return out

    def postpone(self, until: float) -> None:
        """Judge no hang before `until`; a new step mark from any rank lifts it."""
        self._postponed_until = max(self._postponed_until, until)

    def excuse_busy(self, now: float, wait_s: float) -> bool:
        """The agent found a stalled rank busy running code at `now`: postpone the verdict by
        `wait_s` and return True, unless the ranks have been excused as busy for longer than the
        ``eval`` phase's allowance without a step mark since (a rank that spins for ever is hung
        after all): then False, and the verdict stands."""
        if self._busy_since is None:
            self._busy_since = now
        if now - self._busy_since > self._busy_limit_s():
            self._busy_since = None  # the verdict stands: busy no more, for this node or its peers
            return False
        self.postpone(now + wait_s)
        return True

    def busy_over(self) -> None:
        """A stalled rank was probed and found not running code: its verdict stands, and these ranks excuse
        nobody as busy any more."""
        self._busy_since = None

    def _busy_limit_s(self) -> float:
        cfg = self._detector.config
        return cfg.phase_allowance_s.get("eval", cfg.default_phase_allowance_s)

    def excuses(self, now: float) -> tuple[PeerExcuse, ...]:
        """What these workers excuse on other nodes at `now` (sent with the heartbeat, relayed by the master):
        each rank in a named phase within its allowance, and ranks found busy running code (`excuse_busy`),
        from then until a step mark, a probe that finds them idle (`busy_over`) or the eval allowance."""
        found = self._detector.excuses(now) if self._started else ()
        busy_since = self._busy_since
        if busy_since is not None and busy_since <= now < busy_since + self._busy_limit_s():
            why = "a stalled rank busy running code"
            found += (PeerExcuse.within_bounds(now - busy_since, busy_since + self._busy_limit_s() - now, why),)
        return found

    def excuse_elsewhere(self, excuses: Sequence[PeerExcuse], now: float, *, valid_for_s: float = math.inf) -> None:
        """The excuses of other nodes' ranks, as the master relayed them at `now` (none: nobody elsewhere
        excuses anything): ranks here in ``train`` that went quiet before one's window ran out are not hung
        while it lasts, and while no more than `valid_for_s` passed without news from the master."""
        self._elsewhere = [e.anchored(now) for e in excuses]
        self._elsewhere_valid_until = now + valid_for_s

    def check(self, now: float) -> HangReport | None:
        """The hang detector's verdict at `now`; None while hangs are not judged, nobody reported,
        or judging is postponed."""
        if not self._judge or not self._started or now < self._postponed_until:
            return None
        judged = {rank for rank, marks in self._marks.items() if marks >= self._marks_to_judge}
        fresh = now <= self._elsewhere_valid_until
        excuses = tuple(e.relative(now) for e in self._elsewhere if fresh and e.lasts(now))
        return self._detector.check(now, judged, excuses)

    def window_s(self) -> float | None:
        """The current window of the rank judged most leniently, for logs; None before reports."""
        if not self._started:
            return None
        return max(self._detector.window_for(state)[0] for state in self._detector.progress())

    def stats(self, now: float) -> tuple[RankStepStats, ...]:
        """What the heartbeat carries: every reporting rank's steps, samples, recent step time and
        lead time."""
        progress = {state.rank: state for state in self._detector.progress()}
        out = []
        for local_rank in sorted(self._seen):
            reading = self._seen[local_rank]
            rank = self._ranks[local_rank]
            state = progress.get(rank)
            median = statistics.median(state.durations) if state is not None and state.durations else 0.0
            per_mark = statistics.median(self._per_mark[rank]) if rank in self._per_mark else 1.0
            leads = self._leads.get(rank)
            lead = statistics.median(leads) if leads and len(leads) >= LEAD_MIN_SAMPLES else 0.0
            since_mark = reading.step_end_s if reading.step > 0 else reading.phase_since_s
            since = now - since_mark
            if not math.isfinite(since):
                continue  # a slot with nonsense in it says nothing
            out.append(
                RankStepStats(
                    rank=rank,
                    steps=max(reading.step, 0),
                    samples=max(reading.samples, 0),
                    median_step_s=median,
                    since_step_s=max(0.0, since),
                    phase=reading.phase,
                    median_sync_lead_s=lead,
                    steps_per_mark=max(per_mark, 1.0),
                    sync_group=self._groups.get(rank, 0),
                )
            )
        return tuple(out)

    def global_rank(self, local_rank: int) -> int | None:
        """The global rank of `local_rank`, if it is one of the watched workers."""
        return self._ranks.get(local_rank)

    def local_rank(self, rank: int) -> int | None:
        """The local rank of global `rank`, if it is one of the watched workers."""
        for local, glob in self._ranks.items():
            if glob == rank:
                return local
        return None
