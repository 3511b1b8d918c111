"""The goodput accounting core: worked examples and properties over arbitrary timelines."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover.master.goodput import (
    BUCKETS,
    AttemptReport,
    GoodputAccountant,
    GoodputInputError,
    SampleRate,
    StepMark,
    compute_breakdown,
)
from dlrover.master.timeline import render_timeline

pytestmark = pytest.mark.timeout(120)


def ev(t: float, kind: str, data: dict[str, Any] | None = None, node: int | None = None) -> dict[str, Any]:
    return {"wall_time": t, "kind": kind, "message": kind, "node_id": node, "rank": 0, "data": data or {}}


def steps_event(t: float, *reports: AttemptReport) -> dict[str, Any]:
    return ev(t, "steps", {"attempts": [r.to_dict() for r in reports]})


def attempt(attempt: int, marks: list[tuple[int, float, float]], **times: float) -> AttemptReport:
    return AttemptReport(
        node_id=1,
        attempt=attempt,
        rank=0,
        marks=tuple(StepMark(step, end, save) for step, end, save in marks),
        **times,  # type: ignore[arg-type]
    )


def total(b: Any) -> float:
    return float(b.useful_s + sum(b.buckets.values()))


def test_a_job_with_one_failure_is_split_into_named_buckets() -> None:
    # 0..2 start-up, 2..3 rendezvous, 3..4 load, 4..14 steps 1..10 (1 s each, 0.2 s of save in
    # step 10), 14..15 the step in flight when it failed (detection), failure at 15, restart
    # 15..16, rendezvous 16..17, load 17..18, steps 9..12 redo 9, 10 and train 11, 12; end at 23.
    first = attempt(
        1,
        [(s, 4.0 + s, 0.2 if s == 10 else 0.0) for s in range(1, 11)],
        rendezvous_start=2.0,
        rendezvous_end=3.0,
        ready_time=4.0,
        load_s=1.0,
    )
    second = attempt(
        2,
        [(s, 18.0 + (s - 8), 0.0) for s in range(9, 13)],
        rendezvous_start=16.0,
        rendezvous_end=17.0,
        ready_time=18.0,
        load_s=1.0,
    )
    events = [ev(0.0, "job_start"), ev(15.0, "failure", node=1), steps_event(16.0, first), steps_event(22.5, second)]
    events.append(ev(23.0, "job_end"))
    b = compute_breakdown(events)
    assert b.elapsed_s == pytest.approx(23.0)
    assert b.useful_s == pytest.approx(9.8 + 2.0)
    expected = {
        "startup": 2.0,
        "rendezvous": 2.0,
        "checkpoint_load": 2.0,
        "checkpoint_save": 0.2,
        "failure_detection": 1.0,
        "restart": 1.0,
        "steps_redone": 2.0,
        "shutdown": 1.0,
    }
    for bucket in BUCKETS:
        assert b.buckets[bucket] == pytest.approx(expected.get(bucket, 0.0)), bucket
    assert total(b) == pytest.approx(b.elapsed_s)
    assert b.ratio == pytest.approx(11.8 / 23.0)
    assert b.best_step == 12


def test_late_marks_of_a_failed_attempt_are_placed_by_their_times() -> None:
    acc = GoodputAccountant()
    acc.add_event(ev(0.0, "job_start"))
    acc.add_attempts([attempt(1, [(1, 2.0, 0.0), (2, 3.0, 0.0)], ready_time=1.0)])
    acc.add_event(ev(6.0, "failure"))
    # The last marks arrive with the next heartbeat, after the failure was journaled.
    acc.add_attempts([attempt(1, [(3, 4.0, 0.0), (4, 5.0, 0.0)], ready_time=1.0)])
    b = acc.breakdown(now_wall=8.0)
    assert b.useful_s == pytest.approx(4.0)
    assert b.buckets["failure_detection"] == pytest.approx(1.0)
    assert b.buckets["restart"] == pytest.approx(2.0)
    assert b.buckets["startup"] == pytest.approx(1.0)


def test_a_node_the_platform_took_away_is_detected_like_a_failure_and_its_consequences_are_restart() -> None:
    acc = GoodputAccountant()
    acc.add_event(ev(0.0, "job_start"))
    acc.add_attempts([attempt(1, [(1, 2.0, 0.0), (2, 3.0, 0.0)], ready_time=1.0)])
    # The master saw the pod preempted 1.5 s after the last step.
    acc.add_event(ev(4.5, "disruption", {"state": "running"}, node=1))
    acc.add_event(ev(4.7, "consequence_restart", node=0))  # the survivor's round broke: no second detection
    # A spare, and a replacement still starting, taken away during the restart: nobody was training there.
    acc.add_event({**ev(5.5, "disruption", {"state": "running"}, node=2), "rank": None})
    acc.add_event(ev(6.0, "disruption", {"state": "starting"}, node=3))
    b = acc.breakdown(now_wall=7.0)
    assert b.useful_s == pytest.approx(2.0)
    assert b.buckets["failure_detection"] == pytest.approx(1.5)
    assert b.buckets["restart"] == pytest.approx(2.5)
    assert b.buckets["startup"] == pytest.approx(1.0)
    assert total(b) == pytest.approx(b.elapsed_s)


def test_resize_window_and_the_open_tail_of_a_running_job() -> None:
    events = [
        ev(0.0, "job_start"),
        steps_event(3.0, attempt(1, [(1, 2.0, 0.0), (2, 3.0, 0.0)], ready_time=1.0)),
        ev(3.5, "resize", {"target": 2}),
        steps_event(8.0, attempt(2, [(3, 7.0, 0.0), (4, 8.0, 0.0)], ready_time=6.0)),
    ]
    b = compute_breakdown(events, now_wall=9.0)
    assert b.useful_s == pytest.approx(4.0)
    # From the resize until training resumes (the new attempt's first step began at 6).
    assert b.buckets["resize"] == pytest.approx(2.5)
    assert b.buckets["restart"] == pytest.approx(0.5)  # 3..3.5: stopped before the resize
    assert b.buckets["in_progress"] == pytest.approx(1.0)
    assert b.buckets["startup"] == pytest.approx(1.0)


def test_a_first_step_whose_start_is_unknown_stays_in_the_gap() -> None:
    b = compute_breakdown([ev(0.0, "job_start"), steps_event(5.0, attempt(1, [(1, 2.0, 0.0), (2, 3.0, 0.0)]))], 3.0)
    assert b.useful_s == pytest.approx(1.0)
    assert b.buckets["startup"] == pytest.approx(2.0)


def test_a_bad_steps_event_is_refused_whole() -> None:
    acc = GoodputAccountant()
    acc.add_event(ev(0.0, "job_start"))
    with pytest.raises(GoodputInputError, match="step mark"):
        acc.add_event(ev(1.0, "steps", {"attempts": [{"node_id": 1, "attempt": 1, "rank": 0, "marks": [[1, 2]]}]}))
    with pytest.raises(GoodputInputError, match="finite"):
        acc.add_event({"wall_time": math.nan, "kind": "job_end"})
    assert acc.breakdown(now_wall=1.0).useful_s == 0.0


def test_sample_rate_is_per_job_and_survives_worker_restarts() -> None:
    rate = SampleRate(window_s=10.0)
    rate.observe(1, 0, 0.0)
    rate.observe(2, 0, 0.0)
    rate.observe(1, 100, 1.0)
    rate.observe(2, 100, 1.0)
    assert rate.rate(2.0) == pytest.approx(100.0)
    rate.observe(1, 50, 3.0)  # node 1's workers restarted: 50 new samples
    assert rate.total == 250
    assert rate.rate(30.0) == 0.0
    with pytest.raises(GoodputInputError):
        SampleRate(0.0)


@settings(max_examples=200, deadline=None)
@given(
    reports=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 500), st.floats(0.0, 8.0), st.booleans()), max_size=40
    ),
    window=st.sampled_from([1.0, 5.0, 20.0]),
)
def test_sample_rate_is_the_samples_in_the_window_after_its_time_base(
    reports: list[tuple[int, int, float, bool]], window: float
) -> None:
    """The rate kept as a running sum agrees with a scan of every report: the new samples of the reports
    after the newest one older than the window (the time base), over the time since that base."""
    rate = SampleRate(window_s=window)
    totals: dict[int, int] = {}
    seen: list[tuple[float, int]] = []  # (time, new samples) of every report that brought any, the first base
    now = 0.0
    for node, samples, gap, ask in reports:
        now += gap
        before = totals.get(node)
        totals[node] = samples
        new = samples if before is None else (samples - before if samples >= before else samples)
        if not seen:
            seen.append((now, 0))
        elif new > 0:
            seen.append((now, new))
        rate.observe(node, samples, now)
        if ask:
            base = max((i for i in range(1, len(seen)) if seen[i][0] < now - window), default=0)
            span = now - seen[base][0]
            expected = 0.0 if len(seen) - base < 2 or span <= 0 else sum(n for _, n in seen[base + 1 :]) / span
            assert rate.rate(now) == pytest.approx(expected)


# ----------------------------------------------------------------------------- properties


@st.composite
def timelines(draw: st.DrawFn) -> tuple[list[dict[str, Any]], float]:
    """An arbitrary, not necessarily consistent, timeline: attempts with marks, failures,
    resizes, events out of order, a job that may or may not have ended."""
    t = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
    events: list[dict[str, Any]] = [ev(draw(t), "job_start")]
    for number in range(1, draw(st.integers(0, 4)) + 1):
        count = draw(st.integers(0, 6))
        ends = sorted(draw(st.lists(t, min_size=count, max_size=count)))
        steps = sorted(draw(st.lists(st.integers(0, 30), min_size=count, max_size=count)))
        saves = sorted(draw(st.lists(st.floats(0.0, 5.0), min_size=count, max_size=count)))
        report = AttemptReport(
            node_id=draw(st.integers(1, 3)),
            attempt=number,
            rank=draw(st.sampled_from([0, 0, 0, 1])),
            rendezvous_start=draw(st.none() | t),
            rendezvous_end=draw(st.none() | t),
            ready_time=draw(st.none() | t),
            load_s=draw(st.floats(0.0, 10.0)),
            marks=tuple(StepMark(s, e, v) for s, e, v in zip(steps, ends, saves, strict=True)),
        )
        events.append(steps_event(draw(t), report))
    for kind in draw(st.lists(st.sampled_from(["failure", "resize", "progress"]), max_size=6)):
        events.append(ev(draw(t), kind))
    if draw(st.booleans()):
        events.append(ev(draw(t), "job_end"))
    order = draw(st.permutations(range(len(events))))
    return [events[i] for i in order], draw(t)


@settings(max_examples=300, deadline=None)
@given(timelines())
def test_buckets_and_useful_time_always_sum_to_the_elapsed_time(case: tuple[list[dict[str, Any]], float]) -> None:
    events, now = case
    b = compute_breakdown(events, now_wall=now)
    assert b.elapsed_s >= 0
    assert b.useful_s >= 0
    assert all(v >= 0 for v in b.buckets.values())
    assert set(b.buckets) == set(BUCKETS)
    assert total(b) == pytest.approx(b.elapsed_s, abs=1e-6)
    assert 0.0 <= b.ratio <= 1.0 + 1e-9


@settings(max_examples=150, deadline=None)
@given(timelines())
def test_replaying_the_same_events_gives_the_same_answer(case: tuple[list[dict[str, Any]], float]) -> None:
    events, now = case
    first = compute_breakdown(events, now_wall=now)
    again = compute_breakdown([dict(e) for e in events], now_wall=now)
    assert first == again
    # Live: the attempts fed as they arrive, the other events journaled; the same answer.
    live = GoodputAccountant()
    for event in events:
        if event["kind"] == "steps":
            live.add_attempts(AttemptReport.from_dict(a) for a in event["data"]["attempts"])
            live.add_event({**event, "kind": "steps_seen"})
        else:
            live.add_event(event)
    assert live.breakdown(now_wall=now) == first


@settings(max_examples=60, deadline=None)
@given(timelines())
def test_the_timeline_picture_is_valid_svg_for_any_timeline(case: tuple[list[dict[str, Any]], float]) -> None:
    events, now = case
    root = ET.fromstring(render_timeline(sorted(events, key=lambda e: e["wall_time"]), now_wall=now))
    assert root.tag.endswith("svg")


def test_the_timeline_picture_shows_steps_failures_restarts_resizes_and_checkpoints() -> None:
    events = [
        ev(0.0, "job_start"),
        steps_event(5.0, attempt(1, [(1, 2.0, 0.0), (2, 3.0, 0.0), (3, 4.0, 0.0)], ready_time=1.0)),
        ev(4.5, "checkpoint", {"step": 3, "path": "/ckpt/3"}),
        ev(5.0, "failure", node=1),
        ev(5.2, "process_restart", node=1),
        ev(6.0, "resize"),
        steps_event(9.0, attempt(2, [(4, 8.0, 0.0), (5, 9.0, 0.0)], ready_time=7.0)),
        ev(9.5, "job_end"),
    ]
    svg = render_timeline(events, title="demo")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    classes = [el.get("class") for el in root.iter() if el.get("class")]
    assert classes.count("step") == 5
    assert classes.count("train") == 2
    for kind in ("node", "failure", "restart", "resize", "checkpoint", "bucket"):
        assert kind in classes, kind
    title = root.find(f"{ns}title")
    assert title is not None
    assert title.text is not None
    assert "goodput" in title.text
    assert "demo" in title.text
    b = compute_breakdown(events)
    assert f"{b.ratio:.1%}" in title.text
    buckets = {el.get("data-bucket") for el in root.iter() if el.get("class") == "bucket"}
    assert {"useful", "failure_detection", "resize", "shutdown"} <= buckets


def test_a_failure_that_waited_for_its_cause_is_drawn_apart_from_one_charged_at_once() -> None:
    waiting = {"charge": "awaiting_cause", "kind": "communication"}
    events = [
        ev(0.0, "job_start"),
        steps_event(5.0, attempt(1, [(1, 2.0, 0.0), (2, 3.0, 0.0)], ready_time=1.0)),
        ev(4.0, "failure", waiting, node=1),  # node 1's gloo error, its cause not known yet
        ev(4.1, "process_restart", {"awaiting_cause": True}, node=1),
        ev(4.2, "failure", waiting, node=2),
        ev(4.3, "process_restart", {"awaiting_cause": True}, node=2),
        ev(6.0, "failure", node=0),  # node 0's own failure explains node 1's
        ev(6.0, "failure_excused", node=1),
        ev(9.0, "failure_charged", node=2),  # nothing explained node 2's: charged late
        ev(9.5, "job_end"),
    ]
    root = ET.fromstring(render_timeline(events))
    marks = [(el.get("class"), el.get("fill")) for el in root.iter() if (el.get("class") or "").startswith("failure")]
    assert marks == [
        ("failure awaiting", "none"),
        ("failure awaiting", "none"),
        ("failure", "#c62828"),
        ("failure excused", "#9e9e9e"),
        ("failure", "#c62828"),
    ]


def test_steps_journaled_over_one_interval_stay_within_the_marks_a_replay_reads() -> None:
    from dlrover.master.goodput import MAX_MARKS_PER_REPORT, AttemptReport, StepMark
    from dlrover.master.master import _merge_reports

    def report(node: int, first: int, count: int, **times: float) -> AttemptReport:
        marks = tuple(StepMark(s, float(s)) for s in range(first, first + count))
        return AttemptReport(node_id=node, attempt=0, rank=node, marks=marks, **times)  # type: ignore[arg-type]

    # A fast job: three heartbeats of node 0 inside one progress interval hold more marks than
    # one report may carry; node 1's single report rides along.
    reports = [
        report(0, 0, 3000, rendezvous_start=1.0),
        report(1, 0, 10),
        report(0, 3000, 3000),
        report(0, 6000, 100),
    ]
    merged = _merge_reports(reports)
    for r in merged:
        assert len(r.marks) <= MAX_MARKS_PER_REPORT
        assert AttemptReport.from_dict(r.to_dict()) == r  # what a restarted master reads back
    node0 = [m.step for r in merged if r.node_id == 0 for m in r.marks]
    assert node0 == list(range(6100))  # every mark once, in order
    assert [len(r.marks) for r in merged if r.node_id == 0] == [3000, 3100]
    assert next(r.rendezvous_start for r in merged if r.node_id == 0) == 1.0
    assert [len(r.marks) for r in merged if r.node_id == 1] == [10]


_WINDOW = st.tuples(
    st.sampled_from(["resize", "rendezvous", "checkpoint_load"]),
    st.floats(0, 1000, allow_nan=False),
    st.one_of(st.floats(0, 200, allow_nan=False), st.just(math.inf)),
).map(lambda w: (w[0], w[1], w[1] + w[2]))


@given(
    windows=st.lists(_WINDOW, max_size=30),
    start=st.floats(0, 1200, allow_nan=False),
    length=st.floats(0, 300, allow_nan=False),
)
def test_the_window_index_finds_exactly_the_overlapping_windows_in_priority_order(
    windows: list[tuple[str, float, float]], start: float, length: float
) -> None:
    from dlrover.master.goodput import _WindowIndex

    end = start + length
    assert _WindowIndex(windows).overlapping(start, end) == [w for w in windows if w[1] <= end and w[2] >= start]


def test_a_breakdown_builds_its_windows_once_however_many_gaps_it_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = GoodputAccountant()
    acc.add_event(ev(1000.0, "job_start"))
    for i in range(50):  # fifty attempts, each ended by a failure: fifty gaps to label
        t = 1000.0 + 100.0 * i
        acc.add_attempts([attempt(i + 1, [(i * 10 + 10, t + 50.0, 0.0)], ready_time=t + 10.0, load_s=2.0)])
        acc.add_event(ev(t + 60.0, "failure"))
    built = 0
    windows = acc._windows

    def counted() -> list[tuple[str, float, float]]:
        nonlocal built
        built += 1
        return windows()

    monkeypatch.setattr(acc, "_windows", counted)
    breakdown = acc.breakdown(7000.0)
    assert built == 1
    assert total(breakdown) == pytest.approx(breakdown.elapsed_s)
    assert breakdown.buckets["failure_detection"] > 0
