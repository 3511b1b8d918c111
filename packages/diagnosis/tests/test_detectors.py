"""Hang and straggler detectors with a manual clock: fast detection, no false alarms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError, ManualClock
from dlrover.diagnosis import (
    HangConfig,
    HangDetector,
    PeerExcuse,
    StepReport,
    StragglerConfig,
    StragglerDetector,
)
from dlrover.diagnosis.evidence import PEER_EXCUSE_MAX_S

RANKS = (0, 1, 2, 3)


def _steady(detector: HangDetector | StragglerDetector, clock: ManualClock, steps: int, step_s: float = 1.0) -> int:
    """All ranks step together every `step_s`; returns the last step."""
    step = 0
    for step in range(1, steps + 1):
        clock.advance(step_s)
        for r in RANKS:
            detector.observe(StepReport(r, step, clock.now()))
    return step


def _first_alarm(detector: HangDetector, clock: ManualClock, limit_s: float, tick_s: float = 0.1) -> float | None:
    start = clock.now()
    while clock.now() - start < limit_s:
        clock.advance(tick_s)
        if detector.check(clock.now()).hung:
            return clock.now() - start
    return None


CFG = HangConfig(k=5.0, floor_s=3.0, first_steps_allowance_s=300.0, phase_allowance_s={"checkpoint": 120.0})


def test_stall_is_found_within_one_window_and_names_the_rank() -> None:
    clock = ManualClock()
    det = HangDetector(CFG)
    det.start(RANKS, clock.now())
    last = _steady(det, clock, 20)
    # Rank 2 stops; the others keep going.
    stall_start = clock.now()
    found = None
    for _ in range(200):
        clock.advance(0.1)
        if round((clock.now() - stall_start) * 10) % 10 == 0:
            last += 1
            for r in (0, 1, 3):
                det.observe(StepReport(r, last, clock.now()))
        report = det.check(clock.now())
        if report.hung:
            found = report
            break
    assert found is not None
    window = 5.0 * 1.0
    assert found.stalled_ranks == (2,)
    assert window <= found.stalled_for_s[0] <= window + 0.2  # within one window (plus one tick)
    assert found.window_s == pytest.approx(window)
    assert "rank(s) 2" in found.reason
    assert "median training time between step marks" in found.reason


def test_not_hung_before_the_window() -> None:
    clock = ManualClock()
    det = HangDetector(CFG)
    _steady(det, clock, 10)
    clock.advance(4.9)
    report = det.check(clock.now())
    assert not report.hung
    assert report.stalled_ranks == ()
    assert "within their windows" in report.reason


def test_floor_applies_to_fast_steps() -> None:
    clock = ManualClock()
    det = HangDetector(CFG)
    _steady(det, clock, 10, step_s=0.1)
    alarm = _first_alarm(det, clock, 10.0)
    assert alarm is not None
    assert 3.0 < alarm <= 3.2


def test_slow_first_step_raises_no_alarm() -> None:
    clock = ManualClock()
    det = HangDetector(CFG)
    det.start(RANKS, clock.now())
    clock.advance(240.0)  # compilation: far beyond k x any step time, within the first-steps allowance
    assert not det.check(clock.now()).hung
    _steady(det, clock, 1)
    clock.advance(100.0)  # the second step is slow too (still warm-up)
    assert not det.check(clock.now()).hung
    clock.advance(201.0)
    report = det.check(clock.now())
    assert report.hung
    assert "first-steps allowance" in report.reason


def test_rank_that_never_reports_is_found() -> None:
    clock = ManualClock()
    det = HangDetector(HangConfig(first_steps_allowance_s=60.0))
    det.start(RANKS, clock.now())
    for step in range(1, 5):
        clock.advance(20.0)
        for r in (0, 1, 2):
            det.observe(StepReport(r, step, clock.now()))
    report = det.check(clock.now())
    assert report.hung
    assert report.stalled_ranks == (3,)


def test_long_checkpoint_phase_raises_no_alarm_then_its_own_allowance() -> None:
    clock = ManualClock()
    det = HangDetector(CFG)
    last = _steady(det, clock, 20)
    for r in RANKS:
        det.observe(StepReport(r, last, clock.now(), phase="checkpoint"))
    clock.advance(100.0)  # 20 windows long, within the checkpoint allowance
    assert not det.check(clock.now()).hung
    for r in RANKS:
        det.observe(StepReport(r, last, clock.now(), phase="train"))
    # Back to training: the window is measured from the phase change, and the checkpoint did not
    # enter the median step time.
    clock.advance(4.0)
    assert not det.check(clock.now()).hung
    for r in RANKS:
        det.observe(StepReport(r, last + 1, clock.now()))
    assert det.window_for(det.progress()[0])[0] == pytest.approx(5.0)
    # A checkpoint that outlives its allowance is a hang.
    for r in RANKS:
        det.observe(StepReport(r, last + 1, clock.now(), phase="checkpoint"))
    alarm = _first_alarm(det, clock, 200.0, tick_s=1.0)
    assert alarm is not None
    assert 120.0 < alarm <= 121.0
    assert "phase 'checkpoint'" in det.check(clock.now()).reason


def test_unknown_phase_gets_the_default_allowance() -> None:
    clock = ManualClock()
    det = HangDetector(HangConfig(default_phase_allowance_s=50.0, floor_s=1.0))
    last = _steady(det, clock, 10)
    for r in RANKS:
        det.observe(StepReport(r, last, clock.now(), phase="export"))
    assert _first_alarm(det, clock, 100.0, tick_s=1.0) == pytest.approx(51.0)


def test_restart_from_checkpoint_counts_as_progress() -> None:
    clock = ManualClock()
    det = HangDetector(CFG)
    last = _steady(det, clock, 10)
    clock.advance(4.0)
    for r in RANKS:
        det.observe(StepReport(r, last - 5, clock.now()))
    clock.advance(4.0)
    assert not det.check(clock.now()).hung


def test_out_of_order_report_is_rejected_without_change() -> None:
    det = HangDetector(CFG)
    det.observe(StepReport(0, 1, 100.0))
    with pytest.raises(ConfigError, match="older than"):
        det.observe(StepReport(0, 2, 99.0))
    assert det.progress()[0].step == 1


@pytest.mark.parametrize(("field", "value"), [("k", 0), ("floor_s", -1.0), ("warmup_steps", -1), ("history_steps", 0)])
def test_hang_config_validation(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        HangConfig(**{field: value})
    with pytest.raises(ConfigError, match="train"):
        HangConfig(phase_allowance_s={"train": 10.0})


@given(step_times=st.lists(st.floats(0.05, 20.0), min_size=5, max_size=30), k=st.floats(2.0, 10.0))
def test_steady_progress_never_alarms(step_times: list[float], k: float) -> None:
    """Whatever the (bounded) step times, a rank that keeps stepping within k x median is never hung."""
    clock = ManualClock()
    det = HangDetector(HangConfig(k=k, floor_s=1.0, first_steps_allowance_s=100.0, warmup_steps=1))
    for step, dt in enumerate(step_times, start=1):
        # Check just before each step lands: never longer than the largest step so far allows.
        clock.advance(dt)
        det.observe(StepReport(0, step, clock.now()))
    clock.advance(min(step_times))
    assert not det.check(clock.now()).hung


def test_straggler_is_found_and_named() -> None:
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, window_steps=10, min_samples=5))
    times = {0: 1.0, 1: 1.1, 2: 3.5, 3: 0.9}
    next_at = dict.fromkeys(times, 0.0)
    steps = dict.fromkeys(times, 0)
    for _ in range(400):
        clock.advance(0.1)
        for r, dt in times.items():
            if clock.now() >= next_at[r] + dt:
                next_at[r] = clock.now()
                steps[r] += 1
                det.observe(StepReport(r, steps[r], clock.now()))
    report = det.check(clock.now())
    assert report.stragglers == (2,)
    assert dict(report.step_time_s)[2] == pytest.approx(3.5, abs=0.11)
    assert "rank 2" in report.reason


def test_no_straggler_when_ranks_are_even_or_too_few_samples() -> None:
    clock = ManualClock()
    det = StragglerDetector()
    assert "only 0 rank(s)" in det.check(clock.now()).reason
    _steady(det, clock, 30)
    report = det.check(clock.now())
    assert report.stragglers == ()
    assert len(report.step_time_s) == 4


def test_rank_that_just_became_slow_is_found_before_its_step_ends() -> None:
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, min_samples=3))
    last = _steady(det, clock, 10)
    for step in range(last + 1, last + 3):
        clock.advance(1.0)
        for r in (0, 1, 2):
            det.observe(StepReport(r, step, clock.now()))
        assert det.check(clock.now()).stragglers == ()  # rank 3 is at most 2 x the median so far
    clock.advance(1.5)  # rank 3 has now spent 3.5 s in one step; the others take 1 s
    report = det.check(clock.now())
    assert report.stragglers == (3,)
    assert dict(report.step_time_s)[3] == pytest.approx(3.5)


def test_ranks_waiting_for_one_that_saves_are_not_stragglers() -> None:
    # Rank 0 alone persists a checkpoint (or the final one at the job's end); the others wait for
    # it in a collective with their steps unfinished: they are not slow, rank 0's save is long.
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, min_samples=3))
    last = _steady(det, clock, 10)
    det.observe(StepReport(0, last, clock.now(), phase="checkpoint"))
    clock.advance(4.3)
    report = det.check(clock.now())
    assert report.stragglers == ()
    assert dict(report.step_time_s)[1] == pytest.approx(1.0)
    # Once the save ended, an unfinished step counts again.
    det.observe(StepReport(0, last, clock.now(), phase="train"))
    for r in (0, 1, 2):
        det.observe(StepReport(r, last + 1, clock.now()))
    clock.advance(3.5)
    assert det.check(clock.now()).stragglers == (3,)


def test_an_unfinished_step_is_measured_only_up_to_when_the_rank_was_last_known() -> None:
    # Reports that come in batches: rank 3's last batch came 1.5 s after its last step ended; that
    # it has not stepped since then is not known, so it is judged by 1.5 s, not by the 3.5 s to now.
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, min_samples=3))
    last = _steady(det, clock, 10)
    last_end = clock.now()
    for step in range(last + 1, last + 4):
        clock.advance(1.0)
        for r in (0, 1, 2):
            det.observe(StepReport(r, step, clock.now()))
    clock.advance(0.5)
    known = {0: clock.now(), 1: clock.now(), 2: clock.now(), 3: last_end + 1.5}
    report = det.check(clock.now(), known_at=known)
    assert report.stragglers == ()
    assert dict(report.step_time_s)[3] == pytest.approx(1.5)
    # Known later still unfinished: then it straggles; a time after `now` counts as `now`.
    assert det.check(clock.now(), known_at={**known, 3: clock.now()}).stragglers == (3,)
    assert det.check(clock.now(), known_at={**known, 3: clock.now() + 9.0}).stragglers == (3,)
    assert dict(det.check(clock.now(), known_at={**known, 3: clock.now() + 9.0}).step_time_s)[3] == pytest.approx(3.5)


def test_straggler_ignores_warmup_and_checkpoint_time() -> None:
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, min_samples=3, warmup_steps=2))
    clock.advance(50.0)  # slow first step on rank 0 only
    det.observe(StepReport(0, 1, clock.now()))
    for r in (1, 2, 3):
        det.observe(StepReport(r, 1, clock.now() - 49.0))
    last = _steady(det, clock, 10)
    det.observe(StepReport(0, last, clock.now(), phase="checkpoint"))
    clock.advance(30.0)
    det.observe(StepReport(0, last, clock.now(), phase="train"))
    for r in (1, 2, 3):
        det.observe(StepReport(r, last, clock.now()))
    clock.advance(1.0)
    for r in RANKS:
        det.observe(StepReport(r, last + 1, clock.now()))
    assert det.check(clock.now()).stragglers == ()


def _marked_every(det: HangDetector, clock: ManualClock, marks: int, stride: int, step_s: float) -> int:
    """Ranks marked only by their saves: one mark every `stride` steps of `step_s`."""
    step = 0
    for _ in range(marks):
        clock.advance(stride * step_s)
        step += stride
        for r in RANKS:
            det.observe(StepReport(r, step, clock.now()))
    return step


def test_ranks_marked_only_by_their_saves_are_not_hung_between_two_saves() -> None:
    # A save every 100 steps of 0.5 s: 50 s between marks, the floor 3 s and 5 x 0.5 s per step
    # shorter still. Judged by the step time the ranks were called hung after every save.
    clock = ManualClock()
    det = HangDetector(CFG)
    det.start(RANKS, clock.now())
    _marked_every(det, clock, 10, stride=100, step_s=0.5)
    clock.advance(249.0)
    assert not det.check(clock.now()).hung
    clock.advance(2.0)
    report = det.check(clock.now())
    assert report.hung
    assert report.window_s == pytest.approx(250.0)
    assert "5 x the median training time between step marks of 50 s" in report.reason


def _rank_3_marked_by_its_saves(steps: int, *, in_checkpoint_phase: bool) -> tuple[HangDetector, ManualClock]:
    """Ranks 0-2 mark every step (1 s); rank 3 only at its saves, every 20 steps (with its
    checkpoint phase reported before each mark, or not)."""
    clock = ManualClock()
    det = HangDetector(HangConfig(k=5.0, floor_s=3.0, warmup_steps=0, min_step_samples=3))
    det.start(RANKS, clock.now())
    for step in range(1, steps + 1):
        clock.advance(1.0)
        for r in (0, 1, 2):
            det.observe(StepReport(r, step, clock.now()))
        if step % 20 == 0:
            if in_checkpoint_phase:
                det.observe(StepReport(3, step, clock.now(), phase="checkpoint"))
            det.observe(StepReport(3, step, clock.now()))
    return det, clock


def test_a_rank_marked_only_by_its_saves_is_judged_by_its_own_pace_not_its_peers() -> None:
    # Each of rank 3's marks comes at the end of a checkpoint phase (none of its steps is a clean
    # step duration). Its window follows its own 20 s between marks; judged by its peers' 1 s it
    # would be hung 5 s after each save.
    det, clock = _rank_3_marked_by_its_saves(80, in_checkpoint_phase=True)
    progress = {s.rank: s for s in det.progress()}
    assert det.window_for(progress[0])[0] == pytest.approx(5.0)
    assert det.window_for(progress[3]) == (100.0, "5 x the median training time between step marks of 20 s")
    assert not progress[3].durations  # its marks say how often it marks, not how long a step takes
    clock.advance(19.0)
    assert det.check(clock.now()).stalled_ranks == (0, 1, 2)


def test_long_saves_between_marks_do_not_lengthen_the_window_of_the_training_after_them() -> None:
    # Every step (1 s of training) is followed by a 60 s save. The save is judged by the
    # checkpoint allowance; the training after it by its 1 s of training between marks, not by
    # the 61 s between marks (a window of 305 s: a hang right after a save found five minutes late).
    clock = ManualClock()
    det = HangDetector(HangConfig(k=5.0, floor_s=3.0, warmup_steps=0, min_step_samples=3))
    det.start([0], clock.now())
    for step in range(1, 6):
        clock.advance(1.0)
        det.observe(StepReport(0, step, clock.now()))
        det.observe(StepReport(0, step, clock.now(), phase="checkpoint"))
        clock.advance(60.0)
        assert not det.check(clock.now()).hung
        det.observe(StepReport(0, step, clock.now()))
    (state,) = det.progress()
    assert list(state.gaps) == [1.0] * 5
    assert det.window_for(state) == (5.0, "5 x the median training time between step marks of 1 s")
    clock.advance(5.5)
    assert det.check(clock.now()).stalled_ranks == (0,)


def test_training_split_around_an_evaluation_counts_both_parts_and_not_the_evaluation() -> None:
    clock = ManualClock()
    det = HangDetector(HangConfig(k=5.0, floor_s=3.0, warmup_steps=0, min_step_samples=3))
    det.start([0], clock.now())
    for step in range(1, 5):
        clock.advance(0.5)
        det.observe(StepReport(0, step - 1, clock.now(), phase="eval"))
        clock.advance(100.0)
        det.observe(StepReport(0, step - 1, clock.now()))
        clock.advance(0.5)
        det.observe(StepReport(0, step, clock.now()))
    (state,) = det.progress()
    assert list(state.gaps) == [1.0] * 4


def _rank_0_saves_alone(det: HangDetector, clock: ManualClock) -> None:
    """Ranks 0-3 step every second for 10 s; then rank 0 enters a checkpoint phase and the
    others, waiting for it at the next barrier, stop marking."""
    det.start(RANKS, clock.now())
    for step in range(1, 11):
        clock.advance(1.0)
        for r in RANKS:
            det.observe(StepReport(r, step, clock.now()))
    det.observe(StepReport(0, 10, clock.now(), phase="checkpoint"))


def test_ranks_waiting_for_a_peers_save_are_not_hung_while_it_is_within_its_allowance() -> None:
    clock = ManualClock()
    det = HangDetector(HangConfig(k=5.0, floor_s=3.0, warmup_steps=0, phase_allowance_s={"checkpoint": 100.0}))
    _rank_0_saves_alone(det, clock)
    clock.advance(99.0)  # far past the others' 5 s window, within the save's allowance
    assert not det.check(clock.now()).hung
    clock.advance(2.0)  # the save overran: every rank is hung, the saver first of all
    assert det.check(clock.now()).stalled_ranks == RANKS


def test_a_save_that_begins_after_a_rank_hung_does_not_excuse_it() -> None:
    clock = ManualClock()
    det = HangDetector(HangConfig(k=5.0, floor_s=3.0, warmup_steps=0, phase_allowance_s={"checkpoint": 100.0}))
    det.start(RANKS, clock.now())
    for step in range(1, 11):
        clock.advance(1.0)
        for r in RANKS:
            if r != 3 or step <= 4:  # rank 3 hangs after step 4; the others go on
                det.observe(StepReport(r, step, clock.now()))
    det.observe(StepReport(0, 10, clock.now(), phase="checkpoint"))
    clock.advance(1.0)
    assert det.check(clock.now()).stalled_ranks == (3,)  # quiet since step 4: 7 s, past its 5 s window
    clock.advance(10.0)
    # Ranks 1 and 2 wait for rank 0's save, begun within their windows; rank 3's began too late.
    assert det.check(clock.now()).stalled_ranks == (3,)


def _node_b_waits(clock: ManualClock) -> HangDetector:
    """Node B's detector (ranks 0..3 of it stand for the ranks of a node whose peer elsewhere evaluates): ten
    steps of 1 s together, then nothing (they wait in the next collective)."""
    det = HangDetector(HangConfig(k=5.0, floor_s=3.0, warmup_steps=0))
    det.start(RANKS, clock.now())
    _steady(det, clock, 10)
    return det


def test_ranks_waiting_for_a_peer_of_another_node_are_not_hung_while_its_excuse_lasts() -> None:
    clock = ManualClock()
    det = _node_b_waits(clock)
    clock.advance(1.0)
    # The peer's evaluation began a second ago (after B's last steps) and may last 100 s more.
    began_at, until = clock.now() - 1.0, clock.now() + 100.0
    clock.advance(60.0)  # far past B's 5 s windows

    def excuse() -> PeerExcuse:
        return PeerExcuse(clock.now() - began_at, max(0.0, until - clock.now()), "rank 8 in phase 'eval'")

    assert not det.check(clock.now(), excuses=[excuse()]).hung
    assert det.check(clock.now()).stalled_ranks == RANKS  # without it, hung
    clock.advance(41.0)  # the evaluation overran its allowance: the excuse no longer holds
    assert det.check(clock.now(), excuses=[PeerExcuse(clock.now() - began_at, 0.0)]).stalled_ranks == RANKS


def test_a_peer_elsewhere_that_began_after_the_ranks_hung_does_not_excuse_them() -> None:
    clock = ManualClock()
    det = _node_b_waits(clock)
    clock.advance(20.0)  # B has been quiet for 20 s, past its 5 s windows: hung before the peer began
    assert det.check(clock.now(), excuses=[PeerExcuse(1.0, 100.0)]).stalled_ranks == RANKS


def test_a_detectors_excuses_are_its_ranks_named_phases_within_their_allowance() -> None:
    clock = ManualClock()
    det = HangDetector(HangConfig(k=5.0, floor_s=3.0, warmup_steps=0, phase_allowance_s={"eval": 100.0}))
    det.start(RANKS, clock.now())
    _steady(det, clock, 10)
    assert det.excuses(clock.now()) == ()  # every rank trains
    det.observe(StepReport(0, 10, clock.now(), phase="eval"))
    clock.advance(2.0)
    det.observe(StepReport(1, 10, clock.now(), phase="eval"))
    clock.advance(3.0)
    assert det.excuses(clock.now()) == (
        PeerExcuse(5.0, 95.0, "rank 0 in phase 'eval'"),
        PeerExcuse(3.0, 97.0, "rank 1 in phase 'eval'"),
    )
    clock.advance(96.0)  # rank 0's allowance is over, rank 1's not yet
    assert det.excuses(clock.now()) == (PeerExcuse(99.0, 1.0, "rank 1 in phase 'eval'"),)
    clock.advance(2.0)
    assert det.excuses(clock.now()) == ()


def test_an_allowance_longer_than_an_excuse_may_last_excuses_for_the_longest_it_may() -> None:
    clock = ManualClock()
    det = HangDetector(HangConfig(warmup_steps=0, phase_allowance_s={"wait": 1e9}))
    det.start(RANKS, clock.now())
    det.observe(StepReport(0, 1, clock.now(), phase="wait"))
    clock.advance(1.0)
    (excuse,) = det.excuses(clock.now())
    assert excuse.remaining_s == PEER_EXCUSE_MAX_S


@pytest.mark.parametrize("field", ["began_s_ago", "remaining_s"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), 8 * 24 * 3600.0, True])
def test_a_peer_excuse_refuses_nonsense_times(field: str, value: float) -> None:
    args = {"began_s_ago": 1.0, "remaining_s": 1.0, field: value}
    with pytest.raises(ConfigError, match=field):
        PeerExcuse(**args)


def test_a_rank_with_too_few_marks_of_its_own_keeps_the_first_steps_allowance() -> None:
    det, _ = _rank_3_marked_by_its_saves(40, in_checkpoint_phase=False)  # two marks: one gap
    progress = {s.rank: s for s in det.progress()}
    assert det.window_for(progress[3]) == (600.0, "the first-steps allowance")


def _synchronous(det: StragglerDetector, clock: ManualClock, steps: int, step_s: float) -> None:
    """Every rank steps together: in a synchronous job each step takes the slowest rank's time."""
    for step in range(1, steps + 1):
        clock.advance(step_s)
        for r in RANKS:
            det.observe(StepReport(r, step, clock.now()))


def test_in_a_synchronous_job_the_slow_rank_is_found_by_its_lead_time() -> None:
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, min_samples=3))
    _synchronous(det, clock, 20, step_s=0.3)  # rank 2 works 0.3 s, the others 0.1 s and wait
    assert det.check(clock.now()).stragglers == ()  # equal step times say nothing
    report = det.check(clock.now(), sync_leads={0: 0.1, 1: 0.11, 2: 0.3, 3: 0.1})
    assert report.stragglers == (2,)
    assert dict(report.sync_lead_s) == {0: 0.1, 1: 0.11, 2: 0.3, 3: 0.1}
    assert "rank 2 works 0.3 s per step before it synchronizes, over 2 x the others' 0.1 s" in report.reason


def test_a_synchronized_rank_read_a_step_behind_is_not_a_straggler_by_its_step_time() -> None:
    # A CI run: rank 1 slowed from 0.1 s to 0.4 s a step; the agent read rank 0's slot a moment
    # after its step-end write and rank 1's a moment before its own, so rank 1's unfinished step
    # looked 0.36 s while the window medians still held the fast steps. Step times of ranks that
    # synchronize are equal; only the leads are compared.
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, window_steps=9, min_samples=3))
    for step in range(1, 11):
        clock.advance(0.1)
        for r in (0, 1):
            det.observe(StepReport(r, step, clock.now()))
    for step in (11, 12):
        clock.advance(0.4)
        for r in (0, 1):
            det.observe(StepReport(r, step, clock.now()))
    rank_1_seen_at = clock.now()
    clock.advance(0.36)
    det.observe(StepReport(0, 13, clock.now()))  # rank 1's write of step 13 lands just after the read
    assert det.check(clock.now(), known_at={0: clock.now(), 1: clock.now()}).stragglers == (1,), "the skew itself"
    even = det.check(clock.now(), known_at={0: clock.now(), 1: clock.now()}, sync_leads={0: 0.1, 1: 0.11})
    assert even.stragglers == ()
    assert dict(even.step_time_s)[1] == pytest.approx(clock.now() - rank_1_seen_at)  # still listed
    slow = det.check(clock.now(), known_at={0: clock.now(), 1: clock.now()}, sync_leads={0: 0.02, 1: 0.3})
    assert slow.stragglers == (1,)
    assert "before it synchronizes" in slow.reason
    assert "takes" not in slow.reason
    # A rank alone in its group has nobody to synchronize with: its step time still counts.
    apart = det.check(
        clock.now(), known_at={0: clock.now(), 1: clock.now()}, sync_leads={0: 0.1, 1: 0.11}, sync_groups={1: 1}
    )
    assert apart.stragglers == (1,)


def test_lead_times_within_the_factor_or_within_the_least_excess_are_no_stragglers() -> None:
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, min_samples=3, min_lead_excess_s=0.05))
    _synchronous(det, clock, 20, step_s=0.3)
    within = det.check(clock.now(), sync_leads={0: 0.2, 1: 0.21, 2: 0.35, 3: 0.2})
    assert within.stragglers == ()
    assert "4 rank(s) within it of the median lead time" in within.reason
    # Milliseconds: three times the others' but 4 ms more, jitter in a small model's step.
    jitter = det.check(clock.now(), sync_leads={0: 0.002, 1: 0.002, 2: 0.006, 3: 0.002})
    assert jitter.stragglers == ()
    # One rank reporting leads has nobody to be compared with; ranks with 0 report none.
    assert det.check(clock.now(), sync_leads={2: 5.0, 0: 0.0}).stragglers == ()


def test_leads_of_different_groups_are_not_compared() -> None:
    clock = ManualClock()
    det = StragglerDetector(StragglerConfig(k=2.0, min_samples=3))
    _synchronous(det, clock, 20, step_s=0.4)
    leads = {0: 0.4, 1: 0.41, 2: 0.1, 3: 0.1}
    assert det.check(clock.now(), sync_leads=leads).stragglers == (0, 1)  # one group: stage 0 "slow"
    by_stage = det.check(clock.now(), sync_leads=leads, sync_groups={0: 0, 1: 0, 2: 2, 3: 2})
    assert by_stage.stragglers == ()


@given(
    st.lists(st.floats(min_value=0.001, max_value=1000.0), min_size=0, max_size=40),
    st.floats(min_value=1.01, max_value=5.0),
)
def test_each_rank_is_compared_with_the_median_of_the_others(values: list[float], k: float) -> None:
    import statistics

    from dlrover.diagnosis.detectors import _over_the_others

    ranked = tuple(enumerate(values))
    expected = []
    if len(ranked) >= 2:
        for rank, value in ranked:
            others = statistics.median(v for r, v in ranked if r != rank)
            if value > k * others:
                expected.append((rank, value, others))
    assert _over_the_others(ranked, k) == expected
