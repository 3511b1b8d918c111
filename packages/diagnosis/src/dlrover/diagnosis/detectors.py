"""Hang and straggler detection from step progress. Pure: time comes in as ``now``.

Hang: a rank is stalled when it made no progress for longer than its window:

* in a named phase other than ``train`` (``checkpoint``, ``eval``): that phase's allowance;
* during its first `warmup_steps` steps, or while fewer than `min_step_samples` gaps between its
  step marks are known: `first_steps_allowance_s`;
* otherwise ``max(floor_s, k x the median training time between its step marks)``. A rank that
  marks every step trains a step time between marks; one marked only by its checkpointer (a save
  every 100 steps) trains 100, and is not called hung between two saves. A save or evaluation
  between two marks is judged by its own phase's allowance and not counted in the training time;
  the idle time compared with the window starts at its end.

A rank in ``train`` that has gone quiet while another rank of the detector is in a named phase
(one that began before the quiet rank's window ran out, and is still within its allowance) is not
stalled: it waits for that rank in a collective (a save or an evaluation by rank 0 alone, its
peers at the next barrier). It is judged again once no peer is in such a phase. The detector sees
only the ranks it is fed (an agent's, the ranks of one node); a peer of another node is known to it
only as a `PeerExcuse` (its agent's `excuse`, relayed by the master with heartbeats) passed to
`check`, and excuses the same way.

So a 1 s-per-step job with k=5 and a 10 s floor is found hung 10 s after it stops, not after
minutes, while a 3-minute first step or a 5-minute checkpoint raises nothing.

Straggler: a rank whose median step time over its last `window_steps` steps (or its current
unfinished step, if already longer) exceeds ``k x`` the median of the other ranks' medians. The
unfinished time since a rank's last mark counts per step as its marks usually cover
(`StepReport.steps_per_mark`, from the count of marks its slot keeps): a rank marking every fifth
step is five steps into the next mark, not one slow step.

In a synchronous job the step times say nothing: every rank waits for the slowest in the gradient
all-reduce, so every step takes as long as the slowest rank's. Ranks that report their lead time
(from a step's start to their first synchronization point, `StepReporter.synchronizing`) are
compared by it instead, within the group they synchronize with (a pipeline's stages differ in lead
by design): a rank whose lead exceeds ``k x`` the median of the others of its group, by at least
`min_lead_excess_s`, straggles.
"""

from __future__ import annotations

import math
import statistics
import types
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative_finite, positive_finite
from dlrover.diagnosis.evidence import DEFAULT_PHASE, HangReport, PeerExcuse, StepReport
from dlrover.diagnosis.timeline import RankProgress, StepTimeline

__all__ = ["HangConfig", "HangDetector", "StragglerConfig", "StragglerDetector", "StragglerReport"]


def _int_at_least(low: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{attribute.name} must be an integer >= {low}, got {value!r}")

    return check


def _phase_allowances(value: Mapping[str, float]) -> Mapping[str, float]:
    out: dict[str, float] = {}
    for phase, seconds in dict(value).items():
        if not isinstance(phase, str) or not phase or phase == DEFAULT_PHASE:
            raise ConfigError(f"phase allowances need non-empty phase names other than 'train', got {phase!r}")
        if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
            raise ConfigError(f"allowance of phase {phase!r} must be a finite number > 0, got {seconds!r}")
        out[phase] = float(seconds)
    return types.MappingProxyType(out)


_DEFAULT_PHASES = types.MappingProxyType({"checkpoint": 600.0, "eval": 1800.0, "wait": 3600.0})


@attrs.frozen
class HangConfig:
    """Settings of the hang detector.

    Attributes:
        k: the window is k times the median training time between step marks (default 5).
        floor_s: the window is never shorter than this (default 30 s).
        warmup_steps: steps per rank judged by `first_steps_allowance_s` (default 2).
        first_steps_allowance_s: the window for the first steps, which compile and warm caches
            (default 600 s).
        min_step_samples: gaps between a rank's step marks needed before the adaptive window is
            used (default 3).
        phase_allowance_s: per named phase, its window (defaults: checkpoint 600 s, eval 1800 s,
            wait 3600 s).
        default_phase_allowance_s: the window of a phase not listed (default 600 s).
        history_steps: gaps between marks (and clean step durations) kept per rank for the
            medians (default 32).
    """

    k: float = attrs.field(default=5.0, validator=positive_finite)
    floor_s: float = attrs.field(default=30.0, validator=positive_finite)
    warmup_steps: int = attrs.field(default=2, validator=_int_at_least(0))
    first_steps_allowance_s: float = attrs.field(default=600.0, validator=positive_finite)
    min_step_samples: int = attrs.field(default=3, validator=_int_at_least(1))
    phase_allowance_s: Mapping[str, float] = attrs.field(default=_DEFAULT_PHASES, converter=_phase_allowances, eq=False)
    default_phase_allowance_s: float = attrs.field(default=600.0, validator=positive_finite)
    history_steps: int = attrs.field(default=32, validator=_int_at_least(1))


class HangDetector:
    """Finds ranks that stopped making step progress.

    Args:
        config: windows and allowances; `HangConfig()` when omitted.
    """

    def __init__(self, config: HangConfig | None = None) -> None:
        self._config = config or HangConfig()
        self._timeline = StepTimeline(self._config.history_steps, self._config.warmup_steps)

    @property
    def config(self) -> HangConfig:
        """The settings in use."""
        return self._config

    def start(self, ranks: Iterable[int], now: float) -> None:
        """Expect `ranks` from `now`, so a rank that never reports its first step is caught too."""
        self._timeline.start(tuple(ranks), now)

    def observe(self, report: StepReport) -> None:
        """Record a step report.

        Raises:
            ConfigError: if it is older than the rank's previous report (nothing changes).
        """
        self._timeline.observe(report)

    def forget(self, rank: int) -> None:
        """Stop watching `rank`."""
        self._timeline.forget(rank)

    def progress(self) -> tuple[RankProgress, ...]:
        """A copy of every watched rank's progress, ascending by rank."""
        return tuple(state.copy() for state in self._timeline.ranks())

    def window_for(self, state: RankProgress) -> tuple[float, str]:
        """The window `state`'s rank is judged against now, and which rule set it."""
        cfg = self._config
        if state.phase != DEFAULT_PHASE:
            allowance = cfg.phase_allowance_s.get(state.phase, cfg.default_phase_allowance_s)
            return allowance, f"the allowance of phase '{state.phase}'"
        # Each rank by its own marks' pace: ranks of one job may mark at different strides (one
        # reports every step, another only saves), and a pace borrowed from faster-marking ranks
        # would call a rank hung between two of its marks.
        if state.advances < cfg.warmup_steps or len(state.gaps) < cfg.min_step_samples:
            # Too few marks of its own to know its pace (first steps, a restart, a sparse marker).
            return cfg.first_steps_allowance_s, "the first-steps allowance"
        gap = statistics.median(state.gaps)
        adaptive = cfg.k * gap
        if adaptive < cfg.floor_s:
            return cfg.floor_s, f"the floor (k x median training time between step marks = {adaptive:.3g} s is shorter)"
        return adaptive, f"{cfg.k:g} x the median training time between step marks of {gap:.3g} s"

    def excuses(self, now: float) -> tuple[PeerExcuse, ...]:
        """What this detector's ranks excuse elsewhere at `now`: each rank's named phase still within its
        allowance, ascending by rank. Peers of another node waiting on one are not hung (see `check`)."""
        out = []
        for state in self._timeline.ranks():
            if state.phase == DEFAULT_PHASE:
                continue
            until = state.phase_since_s + self.window_for(state)[0]
            if state.phase_since_s <= now < until:
                why = f"rank {state.rank} in phase '{state.phase}'"
                out.append(PeerExcuse.within_bounds(now - state.phase_since_s, until - now, why))
        return tuple(out)

    def check(
        self, now: float, judged: Collection[int] | None = None, excuses: Sequence[PeerExcuse] = ()
    ) -> HangReport:
        """Judge every rank (or only those in `judged`) at `now`.

        Args:
            now: the current time on the clock the reports were stamped with.
            judged: the ranks to judge; None judges every rank.
            excuses: peers elsewhere (other nodes) in a named phase or busy, relative to `now`: a rank in
                ``train`` gone quiet after one of them began, and before it ends, waits for it.

        Returns:
            A report naming the stalled ranks, how long each has been stalled, and why.
        """
        stalled: list[tuple[int, float, float, str]] = []
        ranks = self._timeline.ranks()
        in_phase = [s for s in ranks if s.phase != DEFAULT_PHASE and now - s.phase_since_s <= self.window_for(s)[0]]
        elsewhere = [e.anchored(now) for e in excuses]
        for state in ranks:
            if judged is not None and state.rank not in judged:
                continue
            window, why = self.window_for(state)
            idle = now - state.idle_since_s
            if idle <= window:
                continue
            if state.phase == DEFAULT_PHASE and any(
                peer.rank != state.rank and peer.phase_since_s <= state.idle_since_s + window for peer in in_phase
            ):
                continue  # waiting for a peer's save or evaluation
            if state.phase == DEFAULT_PHASE and any(
                peer.began_s <= state.idle_since_s + window and peer.lasts(now) for peer in elsewhere
            ):
                continue  # waiting for a peer of another node
            stalled.append((state.rank, idle, window, why))
        if not stalled:
            n = len(ranks) if judged is None else len(set(judged))
            return HangReport(False, (), (), 0.0, f"all {n} judged ranks made progress within their windows")
        worst = max(stalled, key=lambda s: s[1])
        names = ", ".join(str(s[0]) for s in stalled)
        reason = (
            f"no step progress from rank(s) {names}; rank {worst[0]} has been stalled for {worst[1]:.1f} s, "
            f"longer than its window of {worst[2]:.1f} s ({worst[3]})"
        )
        return HangReport(
            True,
            tuple(s[0] for s in stalled),
            tuple(round(s[1], 3) for s in stalled),
            worst[2],
            reason,
        )


@attrs.frozen
class StragglerConfig:
    """Settings of the straggler detector.

    Attributes:
        k: a rank straggles when its step time exceeds k times the others' median (default 2).
        window_steps: the sliding window of recent steps per rank (default 20).
        min_samples: a rank is judged only after this many clean steps (default 5).
        warmup_steps: steps per rank never measured (default 2).
        min_lead_excess_s: a rank's lead time straggles only when it exceeds the others' median by
            at least this much as well (default 0.05 s): leads of a few milliseconds (a small
            model, a script that synchronizes right after its step starts) differ by jitter.
    """

    k: float = attrs.field(default=2.0, validator=positive_finite)
    window_steps: int = attrs.field(default=20, validator=_int_at_least(1))
    min_samples: int = attrs.field(default=5, validator=_int_at_least(1))
    warmup_steps: int = attrs.field(default=2, validator=_int_at_least(0))
    min_lead_excess_s: float = attrs.field(default=0.05, validator=non_negative_finite)


@attrs.frozen
class StragglerReport:
    """What the straggler detector concluded.

    Attributes:
        stragglers: ranks slower than k x the others' median, ascending.
        step_time_s: per judged rank, ``(rank, its step time over the window)``.
        reason: one sentence saying why (or why not).
        sync_lead_s: per rank compared by its lead time, ``(rank, its median lead)``.
    """

    stragglers: tuple[int, ...]
    step_time_s: tuple[tuple[int, float], ...]
    reason: str
    sync_lead_s: tuple[tuple[int, float], ...] = ()


class StragglerDetector:
    """Finds ranks whose steps are much slower than the others'.

    Args:
        config: thresholds and windows; `StragglerConfig()` when omitted.
    """

    def __init__(self, config: StragglerConfig | None = None) -> None:
        self._config = config or StragglerConfig()
        self._timeline = StepTimeline(self._config.window_steps, self._config.warmup_steps)

    @property
    def config(self) -> StragglerConfig:
        """The settings in use."""
        return self._config

    def observe(self, report: StepReport) -> None:
        """Record a step report.

        Raises:
            ConfigError: if it is older than the rank's previous report (nothing changes).
        """
        self._timeline.observe(report)

    def forget(self, rank: int) -> None:
        """Stop watching `rank`."""
        self._timeline.forget(rank)

    def check(
        self,
        now: float,
        known_at: Mapping[int, float] | None = None,
        sync_leads: Mapping[int, float] | None = None,
        sync_groups: Mapping[int, int] | None = None,
    ) -> StragglerReport:
        """Judge every rank with enough samples at `now`, and every rank with a lead time.

        A rank in the middle of a ``train`` step that has already run longer than its window
        median is judged by that elapsed time, so a rank that just became slow is found without
        waiting for its slow step to finish; not while another rank is in a checkpoint or eval
        phase, which the others wait for.

        Args:
            now: the current time on the clock the reports were stamped with.
            known_at: per rank, when its progress was last known, for reports that come in
                batches (heartbeats): the unfinished step is measured up to then, not to `now`,
                since a rank may well have stepped after its last batch was sent. Ranks left out
                are measured up to `now` (reports come as each step ends).
            sync_leads: per rank, its median lead time (`RankStepStats.median_sync_lead_s`);
                ranks left out, or with 0, report none. A rank with a lead and a peer in its
                group with one is judged by its lead alone: synchronized ranks' step times are
                equal by construction.
            sync_groups: per rank, the group it synchronizes with (`RankStepStats.sync_group`;
                ranks left out: group 0); leads compare within a group.

        Returns:
            The stragglers, every judged rank's step time and every compared rank's lead.
        """
        cfg = self._config
        known = dict(known_at or {})
        times: dict[int, float] = {}
        ranks = list(self._timeline.ranks())
        # While a rank saves or evaluates, the others usually wait for it in a collective: their
        # unfinished steps grow for its sake (a rank-0-only save, the final persist), not their own.
        others_wait = any(state.phase != DEFAULT_PHASE for state in ranks)
        for state in ranks:
            if len(state.durations) < cfg.min_samples:
                continue
            value = statistics.median(state.durations)
            if state.phase == DEFAULT_PHASE and state.clean and not others_wait:
                until = min(now, known.get(state.rank, now))
                value = max(value, (until - state.last_advance_s) / state.steps_per_mark)
            times[state.rank] = value
        judged = tuple(sorted(times.items()))
        leads = tuple(sorted((r, v) for r, v in (sync_leads or {}).items() if v > 0))
        groups = dict(sync_groups or {})
        # Ranks that synchronize with a peer step together: their step times differ only by when
        # each one's last mark was read (a rank read a moment before its step-end write looks a
        # whole step behind, and while the window median still lags a slowdown that doubles it),
        # so among them only the lead times say who is slow.
        group_sizes = Counter(groups.get(rank, 0) for rank, _ in leads)
        synchronized = {rank for rank, _ in leads if group_sizes[groups.get(rank, 0)] >= 2}
        on_their_own = tuple((rank, value) for rank, value in judged if rank not in synchronized)
        slow: dict[int, str] = {}
        for rank, value, others in _over_the_others(on_their_own, cfg.k):
            slow[rank] = f"rank {rank} takes {value:.3g} s per step, over {cfg.k:g} x the others' {others:.3g} s"
        for group in sorted({groups.get(rank, 0) for rank, _ in leads}):
            members = tuple((rank, value) for rank, value in leads if groups.get(rank, 0) == group)
            for rank, value, others in _over_the_others(members, cfg.k):
                if value - others >= cfg.min_lead_excess_s and rank not in slow:
                    slow[rank] = (
                        f"rank {rank} works {value:.3g} s per step before it synchronizes, over {cfg.k:g} x the "
                        f"others' {others:.3g} s (they wait for it)"
                    )
        if slow:
            return StragglerReport(tuple(sorted(slow)), judged, "; ".join(slow[r] for r in sorted(slow)), leads)
        if len(times) < 2 and len(leads) < 2:
            why = f"only {len(times)} rank(s) have {cfg.min_samples} clean steps and {len(leads)} a lead time"
            return StragglerReport((), judged, why, leads)
        within = f"all {len(judged)} judged ranks are within {cfg.k:g} x the median"
        if leads:
            within += f" step time, and {len(leads)} rank(s) within it of the median lead time"
        return StragglerReport((), judged, within, leads)


def _over_the_others(values: tuple[tuple[int, float], ...], k: float) -> list[tuple[int, float, float]]:
    """``(rank, value, the others' median)`` of each rank whose value exceeds k x the others'
    median, in rank order; none with fewer than two ranks.

    One sort, then each rank's others' median read from it without the rank's own place: a job of
    16,384 ranks is judged on every heartbeat, and a median per rank over the others would be
    quadratic (half a second at 1,024 ranks, found by the goodput simulator).
    """
    n = len(values)
    if n < 2:
        return []
    ordered = sorted((value, rank) for rank, value in values)
    out = []
    for place, (value, rank) in enumerate(ordered):
        others = _median_without(ordered, place)
        if value > k * others:
            out.append((rank, value, others))
    return sorted(out)


def _median_without(ordered: list[tuple[float, int]], place: int) -> float:
    """The median of the sorted `ordered` values with the one at `place` left out."""

    def at(j: int) -> float:  # the j-th of the others, in order
        return ordered[j if j < place else j + 1][0]

    count = len(ordered) - 1
    middle = count // 2
    if count % 2:
        return at(middle)
    return (at(middle - 1) + at(middle)) / 2
