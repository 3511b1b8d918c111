"""Where a job's elapsed time went: useful steps, and the rest in named buckets. Pure.

Inputs are events as they appear in the event log (`{"wall_time", "kind", "data", ...}`) and
`AttemptReport`s: what a node's agent read from the step slots of its lowest local rank during one
set of workers (one *attempt*): its rendezvous, when its workers started, when the worker was
ready to train (after loading a checkpoint), how long the load took, and step marks (a step
index, its end time, the cumulative seconds that worker spent blocked in checkpoint saves, its
samples). Agents batch them onto heartbeats; the master keeps those of global rank 0 (present in
every world: ranks of a data-parallel job step together).

The rule, computed at query time over `[job_start, job_end or now]`:

* **Training spans.** Within an attempt the marks chain: the step ending at a mark began at the
  previous mark (the first at the worker's ready time). Each interval's save delta is
  ``checkpoint_save``; the rest is ``useful`` for steps beyond the best step reached before
  (in arrival order) and ``steps_redone`` for the others (an interval mixing both is split in
  proportion to its steps).
* **Gaps** between spans are labelled by the windows covering them, first match wins:
  ``resize`` (from a ``resize`` event, which the lifecycle core records for every resize, until
  training resumes: the start of the first training span that begins after it), ``rendezvous``
  (an attempt's rendezvous), ``checkpoint_load`` (the load before an attempt's ready time),
  ``failure_detection`` (from the last sign of training before a ``failure`` event, or a
  ``disruption`` of a running node that held a rank (the platform took it away), to that
  event); otherwise ``restart`` after a failure or between two stretches of training,
  ``startup`` before the first, and after the last ``shutdown`` once the job ended,
  ``in_progress`` (the step being computed) while it runs.

Useful time and the buckets always sum to the elapsed time and none is negative. Events that
arrive late (a failed attempt's last marks come with the next heartbeat) are placed by their
times, not by their arrival.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from dlrover.common import DLRoverError

__all__ = [
    "BUCKETS",
    "DISRUPTION_EVENT",
    "FAILURE_EVENT",
    "MAX_ATTEMPTS_PER_HEARTBEAT",
    "MAX_MARKS_PER_REPORT",
    "RESIZE_EVENT",
    "STEPS_EVENT",
    "AttemptReport",
    "GoodputAccountant",
    "GoodputBreakdown",
    "GoodputInputError",
    "SampleRate",
    "StepMark",
    "compute_breakdown",
]

BUCKETS: tuple[str, ...] = (
    "startup",
    "failure_detection",
    "restart",
    "rendezvous",
    "checkpoint_load",
    "steps_redone",
    "checkpoint_save",
    "resize",
    "shutdown",
    "in_progress",
)
"""The named buckets of time that is not useful, in display order."""

STEPS_EVENT = "steps"
"""The event kind that carries attempt reports (`data.attempts`, see `AttemptReport.to_dict`)."""

FAILURE_EVENT = "failure"
DISRUPTION_EVENT = "disruption"
"""The platform took a node away (evicted, preempted, its host lost): a failure for the breakdown when
the node held a rank and was running (not a spare, not a node still starting), though charged to no
budget."""


def _took_a_training_node(event: Mapping[str, Any], data: Mapping[str, Any]) -> bool:
    return event.get("rank") is not None and data.get("state") == "running"


RESIZE_EVENT = "resize"
"""The lifecycle core resized the job: training stopped from then until it resumes is ``resize``."""

MAX_ATTEMPTS_PER_HEARTBEAT = 16
"""The most attempt reports one heartbeat may carry; the master refuses a heartbeat with more."""

MAX_MARKS_PER_REPORT = 4096
"""The most step marks one attempt report may carry (on a heartbeat and in a `steps` event)."""


class GoodputInputError(DLRoverError):
    """An attempt report or event that cannot be accounted; nothing was changed."""


def _finite(value: Any, what: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise GoodputInputError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise GoodputInputError(f"{what} must be finite, got {value!r}")
    return out


def _optional_time(value: Any, what: str) -> float | None:
    if value is None:
        return None
    out = _finite(value, what)
    return out if out > 0 else None


@attrs.frozen
class StepMark:
    """A step boundary as the agent read it from a worker's slot.

    Attributes:
        step: the steps the worker had finished.
        end_time: when it finished the newest (wall seconds).
        save_s: seconds it spent blocked in checkpoint saves during this attempt, in total.
        samples: samples it consumed during this attempt, in total.
    """

    step: int
    end_time: float
    save_s: float = 0.0
    samples: int = 0

    def to_list(self) -> list[float | int]:
        """The compact JSON form ``[step, end_time, save_s, samples]``."""
        return [self.step, round(self.end_time, 6), round(self.save_s, 6), self.samples]

    @classmethod
    def from_list(cls, raw: Sequence[Any]) -> StepMark:
        """Parse `to_list`'s form.

        Raises:
            GoodputInputError: not four numbers, or a negative one.
        """
        if not isinstance(raw, (list, tuple)) or len(raw) != 4:
            raise GoodputInputError(f"a step mark is [step, end_time, save_s, samples], got {raw!r}")
        step, end, save, samples = int(raw[0]), _finite(raw[1], "end_time"), _finite(raw[2], "save_s"), int(raw[3])
        if step < 0 or end < 0 or save < 0 or samples < 0:
            raise GoodputInputError(f"a step mark has a negative field: {raw!r}")
        return cls(step, end, save, samples)


@attrs.frozen
class AttemptReport:
    """What one node's agent read about one set of workers, since its previous report.

    Attributes:
        node_id: the reporting node (the master stamps it from the caller's identity).
        attempt: the agent's count of worker starts (an attempt's reports share it).
        rank: the global rank of the worker the marks come from (the node's local rank 0).
        rendezvous_start: when the agent joined the round these workers train in (wall).
        rendezvous_end: when that round completed.
        workers_start: when the workers were started.
        ready_time: when the worker was ready to train (after its checkpoint load), if known.
        load_s: seconds it spent loading a checkpoint before its first step.
        marks: step marks since the previous report, oldest first.
    """

    node_id: int
    attempt: int
    rank: int
    rendezvous_start: float | None = None
    rendezvous_end: float | None = None
    workers_start: float | None = None
    ready_time: float | None = None
    load_s: float = 0.0
    marks: tuple[StepMark, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept in `steps` events."""
        return {
            "node_id": self.node_id,
            "attempt": self.attempt,
            "rank": self.rank,
            "rendezvous_start": self.rendezvous_start,
            "rendezvous_end": self.rendezvous_end,
            "workers_start": self.workers_start,
            "ready_time": self.ready_time,
            "load_s": round(self.load_s, 6),
            "marks": [m.to_list() for m in self.marks],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AttemptReport:
        """Parse `to_dict`'s form.

        Raises:
            GoodputInputError: a field is missing or not a number.
        """
        try:
            marks = raw.get("marks") or []
            if len(marks) > MAX_MARKS_PER_REPORT:
                raise GoodputInputError(f"at most {MAX_MARKS_PER_REPORT} marks per report, got {len(marks)}")
            return cls(
                node_id=int(raw["node_id"]),
                attempt=int(raw["attempt"]),
                rank=int(raw["rank"]),
                rendezvous_start=_optional_time(raw.get("rendezvous_start"), "rendezvous_start"),
                rendezvous_end=_optional_time(raw.get("rendezvous_end"), "rendezvous_end"),
                workers_start=_optional_time(raw.get("workers_start"), "workers_start"),
                ready_time=_optional_time(raw.get("ready_time"), "ready_time"),
                load_s=max(_finite(raw.get("load_s", 0.0), "load_s"), 0.0),
                marks=tuple(StepMark.from_list(m) for m in marks),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GoodputInputError(f"not an attempt report ({exc!r}): {dict(raw)!r:.200}") from None


@attrs.frozen
class GoodputBreakdown:
    """Useful time and the buckets, over the elapsed time.

    Attributes:
        elapsed_s: seconds from the job's start to its end (or now).
        useful_s: seconds of steps that were kept.
        buckets: seconds per bucket of `BUCKETS` (every one present).
        best_step: the newest step reached (-1 before any).
    """

    elapsed_s: float
    useful_s: float
    buckets: Mapping[str, float]
    best_step: int = -1

    @property
    def ratio(self) -> float:
        """useful_s / elapsed_s; 0 before any time passed."""
        return self.useful_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def fraction(self, bucket: str) -> float:
        """A bucket's share of the elapsed time."""
        return self.buckets[bucket] / self.elapsed_s if self.elapsed_s > 0 else 0.0


@attrs.define
class _Attempt:
    report: AttemptReport
    order: int
    span_start: float | None = None
    last: StepMark | None = None
    useful_s: float = 0.0
    redone_s: float = 0.0
    save_s: float = 0.0

    @property
    def span(self) -> tuple[float, float] | None:
        if self.span_start is None or self.last is None or self.last.end_time <= self.span_start:
            return None
        return self.span_start, self.last.end_time


class GoodputAccountant:
    """Accumulates events and attempt reports; `breakdown` applies the rule of the module.

    The state is a few numbers per attempt and per failure or resize: replaying the journal's
    events into a new accountant gives the same answer as the live one.
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self._end: float | None = None
        self._last_time: float | None = None
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._best = -1
        self._failures: list[float] = []
        self._resizes: list[float] = []

    @property
    def best_step(self) -> int:
        """The newest step any accounted mark reached (-1 before any)."""
        return self._best

    def add_event(self, event: Mapping[str, Any]) -> None:
        """Account for one event; kinds other than those the rule names only move the clock.

        Raises:
            GoodputInputError: a `steps` event whose attempts cannot be parsed (nothing changed).
        """
        t = _finite(event.get("wall_time"), "wall_time")
        kind = event.get("kind")
        data = event.get("data") or {}
        if kind == STEPS_EVENT:
            reports = [AttemptReport.from_dict(a) for a in data.get("attempts", [])]
            self.add_attempts(reports)
        if self._start is None or (kind == "job_start" and t < self._start):
            self._start = t
        self._last_time = t if self._last_time is None else max(self._last_time, t)
        if kind == "job_end":
            self._end = t
        elif kind == FAILURE_EVENT or (kind == DISRUPTION_EVENT and _took_a_training_node(event, data)):
            bisect.insort(self._failures, t)
        elif kind == RESIZE_EVENT:
            bisect.insort(self._resizes, t)

    def add_attempts(self, reports: Iterable[AttemptReport]) -> None:
        """Account for attempt reports (only rank 0's are kept), in arrival order."""
        for report in reports:
            if report.rank != 0:
                continue
            key = (report.node_id, report.attempt)
            state = self._attempts.get(key)
            if state is None:
                state = self._attempts[key] = _Attempt(report=attrs.evolve(report, marks=()), order=len(self._attempts))
            else:
                known = state.report
                state.report = attrs.evolve(
                    known,
                    rendezvous_start=known.rendezvous_start or report.rendezvous_start,
                    rendezvous_end=known.rendezvous_end or report.rendezvous_end,
                    workers_start=known.workers_start or report.workers_start,
                    ready_time=known.ready_time or report.ready_time,
                    load_s=max(known.load_s, report.load_s),
                )
            for mark in report.marks:
                self._add_mark(state, mark)

    def _add_mark(self, state: _Attempt, mark: StepMark) -> None:
        last = state.last
        if last is None:
            ready = state.report.ready_time
            if ready is not None and ready < mark.end_time:
                prev_end, prev_step, prev_save = ready, mark.step - 1, 0.0
            else:
                # When this step began is unknown: its time stays with the gap before the span.
                state.span_start, state.last = mark.end_time, mark
                self._best = max(self._best, mark.step)
                return
            state.span_start = prev_end
        else:
            prev_end, prev_step, prev_save = last.end_time, last.step, last.save_s
        if mark.step <= prev_step or mark.end_time <= prev_end:
            return  # not a new boundary: a repeated or reordered read
        length = mark.end_time - prev_end
        save = min(max(mark.save_s - prev_save, 0.0), length)
        rest = length - save
        steps = mark.step - prev_step
        new = min(max(mark.step - max(prev_step, self._best), 0), steps)
        useful = rest * new / steps
        state.useful_s += useful
        state.redone_s += max(rest - useful, 0.0)
        state.save_s += save
        state.last = mark
        self._best = max(self._best, mark.step)

    def breakdown(self, now_wall: float | None = None) -> GoodputBreakdown:
        """The breakdown over `[job_start, job_end or now_wall or the newest event]`."""
        buckets = dict.fromkeys(BUCKETS, 0.0)
        if self._start is None:
            return GoodputBreakdown(0.0, 0.0, buckets, self._best)
        t0 = self._start
        if self._end is not None:
            t_end = self._end
        elif now_wall is not None:
            t_end = now_wall
        else:
            t_end = self._last_time if self._last_time is not None else t0
        t_end = max(t_end, t0)
        useful = 0.0
        spans: list[tuple[float, float]] = []
        attempts = sorted(self._attempts.values(), key=lambda a: (a.span or (math.inf, 0.0), a.order))
        cursor = t0
        for attempt in attempts:
            span = attempt.span
            if span is None:
                continue
            start, end = max(span[0], cursor), min(span[1], t_end)
            if end <= start:
                continue
            share = (end - start) / (span[1] - span[0])
            useful += attempt.useful_s * share
            buckets["steps_redone"] += attempt.redone_s * share
            buckets["checkpoint_save"] += attempt.save_s * share
            spans.append((start, end))
            cursor = end
        # Built once per breakdown, not per gap: a month-long job has hundreds of attempts, and the
        # master asks for a breakdown on every tick (its metrics).
        windows = _WindowIndex(self._windows())
        signs = self._training_signs()
        for gap_start, gap_end, position in _gaps(spans, t0, t_end):
            self._label_gap(gap_start, gap_end, position, buckets, index=windows, signs=signs)
        return GoodputBreakdown(t_end - t0, useful, buckets, self._best)

    def _windows(self) -> list[tuple[str, float, float]]:
        """Labelled windows by priority (first match wins)."""
        span_starts = sorted(a.span[0] for a in self._attempts.values() if a.span is not None)
        out: list[tuple[str, float, float]] = []
        for began in self._resizes:
            i = bisect.bisect_right(span_starts, began)
            out.append(("resize", began, span_starts[i] if i < len(span_starts) else math.inf))
        reports = [a.report for a in self._attempts.values()]
        for r in reports:
            if r.rendezvous_start is not None and r.rendezvous_end is not None:
                out.append(("rendezvous", r.rendezvous_start, r.rendezvous_end))
        for r in reports:
            if r.ready_time is not None and r.load_s > 0:
                out.append(("checkpoint_load", r.ready_time - r.load_s, r.ready_time))
        return out

    def _training_signs(self) -> list[float]:
        """Times training was last seen alive: span ends and workers' ready times, sorted."""
        signs = [a.span[1] for a in self._attempts.values() if a.span is not None]
        signs += [a.report.ready_time for a in self._attempts.values() if a.report.ready_time is not None]
        return sorted(signs)

    def _label_gap(
        self,
        start: float,
        end: float,
        position: str,
        buckets: dict[str, float],
        *,
        index: _WindowIndex,
        signs: Sequence[float],
    ) -> None:
        windows = index.overlapping(start, end)
        failures = [f for f in self._failures if start < f <= end]
        for f in failures:
            i = bisect.bisect_right(signs, f)
            detect_from = max(signs[i - 1] if i else start, start)
            windows.append(("failure_detection", detect_from, f))
        cuts = {start, end}
        for _label, a, b in windows:
            for t in (a, b):
                if start < t < end:
                    cuts.add(t)
        cuts.update(failures)
        edges = sorted(cuts)
        for a, b in itertools.pairwise(edges):
            if b <= a:
                continue
            mid = (a + b) / 2
            label = next((lab for lab, lo, hi in windows if lo <= mid <= hi), None)
            if label is None:
                if any(f <= mid for f in failures):
                    label = "restart"
                elif position == "first":
                    label = "startup"
                elif position == "last":
                    label = "shutdown" if self._end is not None else "in_progress"
                else:
                    label = "restart"
            buckets[label] += b - a


class _WindowIndex:
    """Labelled windows (in priority order) found by the stretch of time they overlap, without a scan
    of every window for every gap."""

    def __init__(self, windows: Sequence[tuple[str, float, float]]) -> None:
        self._windows = list(windows)
        self._by_start = sorted(range(len(self._windows)), key=lambda i: self._windows[i][1])
        self._starts = [self._windows[i][1] for i in self._by_start]
        finite = [hi - lo for _, lo, hi in self._windows if math.isfinite(hi)]
        self._longest = max(finite, default=0.0)
        self._unbounded = [i for i, (_, _, hi) in enumerate(self._windows) if not math.isfinite(hi)]

    def overlapping(self, start: float, end: float) -> list[tuple[str, float, float]]:
        """The windows that overlap `[start, end]`, in priority order."""
        first = bisect.bisect_left(self._starts, start - self._longest)
        last = bisect.bisect_right(self._starts, end)
        picked = {self._by_start[k] for k in range(first, last)}
        picked.update(self._unbounded)
        found = (self._windows[i] for i in sorted(picked))
        return [w for w in found if w[1] <= end and w[2] >= start]


def _gaps(spans: Sequence[tuple[float, float]], t0: float, t_end: float) -> list[tuple[float, float, str]]:
    """The stretches of [t0, t_end] outside the (sorted, disjoint) spans, with their position."""
    out: list[tuple[float, float, str]] = []
    cursor = t0
    for i, (a, b) in enumerate(spans):
        if a > cursor:
            out.append((cursor, a, "first" if i == 0 else "middle"))
        cursor = b
    if t_end > cursor or not spans:
        out.append((cursor, t_end, "last" if spans else "first"))
    return [g for g in out if g[1] > g[0]]


def compute_breakdown(events: Iterable[Mapping[str, Any]], now_wall: float | None = None) -> GoodputBreakdown:
    """The breakdown of a whole timeline (an event log read back, or the journal's events)."""
    accountant = GoodputAccountant()
    for event in events:
        accountant.add_event(event)
    return accountant.breakdown(now_wall)


class SampleRate:
    """Samples per second of the whole job over a sliding window, from nodes' running totals.

    A node's total that goes down started over (its workers restarted): the new total counts as
    new samples.

    Args:
        window_s: the window the rate is taken over.
    """

    def __init__(self, window_s: float) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise GoodputInputError(f"window_s must be a positive number, got {window_s!r}")
        self._window_s = window_s
        self._totals: dict[int, int] = {}
        # (time, new samples); the first is the window's time base, whose samples are not counted.
        self._points: deque[tuple[float, int]] = deque()
        self._in_window = 0  # the samples of every point after the first
        self._total = 0

    @property
    def total(self) -> int:
        """Samples counted since the first report."""
        return self._total

    def observe(self, node_id: int, samples: int, now: float) -> None:
        """Node `node_id` reported `samples` consumed in total at `now`."""
        before = self._totals.get(node_id)
        self._totals[node_id] = samples
        if before is None:
            new = samples
            if not self._points:
                self._points.append((now, 0))
                return  # a first total has no time base: it starts the window
        else:
            new = samples - before if samples >= before else samples
        if new > 0:
            self._total += new
            self._points.append((now, new))
            if len(self._points) > 1:
                self._in_window += new
        self._trim(now)

    def _trim(self, now: float) -> None:
        # The last point before the window stays as its time base. O(points dropped): every
        # heartbeat asks for the rate, and a sum over the window made a round of them O(nodes²).
        cut = now - self._window_s
        points = self._points
        while len(points) > 1 and points[1][0] < cut:
            points.popleft()
            self._in_window -= points[0][1]

    def rate(self, now: float) -> float:
        """Samples per second over the window ending at `now`; 0 with fewer than two reports."""
        self._trim(now)
        if len(self._points) < 2:
            return 0.0
        first_t = self._points[0][0]
        span = now - first_t
        if span <= 0:
            return 0.0
        return self._in_window / span
