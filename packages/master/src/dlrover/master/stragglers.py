"""Runtime straggler detection from the step stats agents batch on their heartbeats.

Each heartbeat carries, per training process, its step count and the seconds since its last step
ended (`RankStepStats`). Seconds-ago survive the trip between machines whose monotonic clocks
differ: the master places each rank's last step end at ``now - since_step_s`` on its own clock and
feeds that to `dlrover.diagnosis.StragglerDetector`, which compares every rank's recent step time
with the other ranks' median. A rank over the factor is reported once (an event and a warning)
until it recovers.

In a synchronous job every rank's step takes as long as the slowest rank's; there the ranks are
compared by their lead times instead (`RankStepStats.median_sync_lead_s`: from a step's start to the
rank's first synchronization point, the median the agent keeps), which only the slow rank has long.

A rank's unfinished step is measured only up to when its node's last heartbeat came, not up to
now: the nodes' heartbeats come at their own moments, so just before one node's next heartbeat its
ranks' last known step end lies a whole heartbeat interval back (0.5 s + a 0.2 s step looks like
0.7 s), while a node heard a moment ago shows its true step time, and ranks stepping together in
one collective would look unequal.

Pure: ``now`` comes in as an argument.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from dlrover.common import ConfigError
from dlrover.diagnosis import RankStepStats, StepReport, StragglerConfig, StragglerDetector, StragglerReport

__all__ = ["StragglerFinding", "StragglerWatch"]


@attrs.frozen
class StragglerFinding:
    """Ranks newly found straggling.

    Attributes:
        ranks: the ranks found since the last finding, ascending.
        nodes: the node each of them runs on, in the same order.
        report: the detector's whole verdict (every judged rank's step time, the reason).
    """

    ranks: tuple[int, ...]
    nodes: tuple[int, ...]
    report: StragglerReport


class StragglerWatch:
    """Compares the step times of every rank of the job.

    Args:
        config: the detector's settings (a window counts heartbeats that saw a rank advance).
        stale_after_s: a rank whose stats have not come for this long is no longer judged (its
            node died, or its processes restart): its unfinished step would otherwise grow
            until it looked like a straggler.
        check_every_s: `check` judges the ranks at most once per this many seconds (0: on every
            call). A judgment reads every rank (about 50 ms at 16,384 ranks) and every node's
            heartbeat brings stats: twice per heartbeat interval sees them all, at a 1,024th of
            the cost of judging on each of 2,048 nodes' heartbeats.
    """

    def __init__(self, config: StragglerConfig, stale_after_s: float = 30.0, check_every_s: float = 0.0) -> None:
        if not stale_after_s > 0:
            raise ConfigError(f"stale_after_s must be > 0, got {stale_after_s!r}")
        if not 0 <= check_every_s < float("inf"):
            raise ConfigError(f"check_every_s must be a finite number >= 0, got {check_every_s!r}")
        self._check_every_s = check_every_s
        self._checked_at = float("-inf")
        self._detector = StragglerDetector(config)
        self._stale_after_s = stale_after_s
        self._last: dict[int, tuple[int, float]] = {}  # rank -> (steps, step end on our clock)
        self._heard: dict[int, float] = {}  # rank -> when its stats last came
        self._node_of: dict[int, int] = {}
        # node id -> its ranks: a heartbeat finds its node's ranks without reading every rank's node.
        self._ranks_of: dict[int, set[int]] = {}
        self._leads: dict[int, float] = {}  # rank -> its median lead time, as last reported
        self._groups: dict[int, int] = {}  # rank -> the group it synchronizes with
        self._reported: frozenset[int] = frozenset()

    def observe(self, node_id: int, stats: Iterable[RankStepStats], now: float) -> None:
        """Record one heartbeat's stats from `node_id`, received at `now`.

        A rank the node reported before and leaves out now is forgotten: its processes restart
        (they report again from their first step) or stopped reporting.
        """
        stats = tuple(stats)
        present = {stat.rank for stat in stats}
        for rank in self._ranks_of.get(node_id, set()) - present:
            self._forget(rank)
        for stat in stats:
            self._place(stat.rank, node_id)
            self._heard[stat.rank] = now
            last = self._last.get(stat.rank)
            if last is not None and stat.steps < last[0]:
                # Its process restarted (a new rendezvous round): steps before mean nothing now.
                self._forget(stat.rank)
                self._place(stat.rank, node_id)
                self._heard[stat.rank] = now
                last = None
            if stat.median_sync_lead_s > 0:
                self._leads[stat.rank] = stat.median_sync_lead_s
                self._groups[stat.rank] = stat.sync_group
            else:
                self._leads.pop(stat.rank, None)
                self._groups.pop(stat.rank, None)
            end = now - stat.since_step_s
            if last is not None:
                if stat.steps == last[0]:
                    if stat.phase == "train":
                        continue  # no news; the detector measures the unfinished step up to `_heard`
                    end = last[1]
                end = max(end, last[1])  # latency jitter never moves a step end back
            try:
                self._detector.observe(StepReport(stat.rank, stat.steps, end, stat.phase, stat.steps_per_mark))
            except ConfigError:
                continue
            self._last[stat.rank] = (stat.steps, end)

    def forget_node(self, node_id: int) -> None:
        """Stop judging the ranks of `node_id` (it left, or its processes restart)."""
        for rank in list(self._ranks_of.get(node_id, ())):
            self._forget(rank)

    def forget_all(self) -> None:
        """Stop judging every rank (a resize starts a new round: every worker restarts)."""
        for rank in list(self._node_of):
            self._forget(rank)

    def _place(self, rank: int, node_id: int) -> None:
        """`rank` runs on `node_id` (a rank another node reported before moved with a new round)."""
        before = self._node_of.get(rank)
        if before == node_id:
            return
        if before is not None:
            self._unplace(rank, before)
        self._node_of[rank] = node_id
        self._ranks_of.setdefault(node_id, set()).add(rank)

    def _unplace(self, rank: int, node_id: int) -> None:
        ranks = self._ranks_of.get(node_id)
        if ranks is not None:
            ranks.discard(rank)
            if not ranks:
                del self._ranks_of[node_id]

    def _forget(self, rank: int) -> None:
        self._detector.forget(rank)
        self._last.pop(rank, None)
        self._heard.pop(rank, None)
        node_id = self._node_of.pop(rank, None)
        if node_id is not None:
            self._unplace(rank, node_id)
        self._leads.pop(rank, None)
        self._groups.pop(rank, None)
        self._reported = self._reported - {rank}

    def node_paces(self, now: float) -> dict[int, float]:
        """Each node's recent pace, in seconds per step of its own work: its slowest judged rank's
        step time, or, where every rank reports a lead time (a synchronous job, whose step times
        are all the slowest rank's), its slowest rank's lead (nodes with no judged rank are left
        out). Changes nothing; the shrink order of a resize reads it to let the slowest go."""
        report = self._check(now)
        by_lead = bool(report.sync_lead_s) and set(self._leads) >= set(self._node_of)
        times: dict[int, float] = {}
        for rank, seconds in dict(report.sync_lead_s if by_lead else report.step_time_s).items():
            node = self._node_of.get(rank)
            if node is not None and now - self._heard.get(rank, now) <= self._stale_after_s:
                times[node] = max(times.get(node, 0.0), seconds)
        return times

    def _check(self, now: float) -> StragglerReport:
        return self._detector.check(now, known_at=self._heard, sync_leads=self._leads, sync_groups=self._groups)

    def check(self, now: float) -> StragglerFinding | None:
        """Newly straggling ranks at `now`; None when there are none (recovered ones may be found again),
        or when the last judgment was less than `check_every_s` ago."""
        if now - self._checked_at < self._check_every_s:
            return None
        self._checked_at = now
        for rank in [r for r, heard in self._heard.items() if now - heard > self._stale_after_s]:
            self._forget(rank)
        report = self._check(now)
        current = frozenset(report.stragglers)
        new = sorted(current - self._reported)
        self._reported = current
        if not new:
            return None
        return StragglerFinding(tuple(new), tuple(self._node_of[r] for r in new), report)
