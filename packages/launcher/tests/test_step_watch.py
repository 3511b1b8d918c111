"""The agent's step watch: slot readings in, hang verdicts and heartbeat stats out (fake time)."""

from __future__ import annotations

import pytest

from dlrover.common.step_slots import SlotReading
from dlrover.diagnosis import HangConfig, PeerExcuse
from dlrover.launcher.step_watch import StepWatch

pytestmark = pytest.mark.timeout(30)

CONFIG = HangConfig(k=5.0, floor_s=2.0, warmup_steps=1, first_steps_allowance_s=60.0, min_step_samples=2)


class Slots:
    """What the workers wrote: one SlotReading per local rank, rewritten as a writer would."""

    def __init__(self) -> None:
        self.seq: dict[int, int] = {}
        self.now: dict[int, SlotReading] = {}

    def write(self, local: int, step: int, t: float, phase: str = "train", *, samples: int = 0, marks: int = 1) -> None:
        """`marks`: the step marks since the last write that moved the step to `step`."""
        before = self.now.get(local)
        seq = self.seq.get(local, 0) + 2
        self.seq[local] = seq
        moved = before is None or step > before.step
        end = t if moved else before.step_end_s
        since = t if before is None or phase != before.phase else before.phase_since_s
        total = samples + (before.samples if before is not None else 0)
        count = (before.marks if before is not None else 0) + (marks if moved and step > 0 else 0)
        self.now[local] = SlotReading(seq, step, total, end, phase, since, 1000 + local, marks=count)


def run_steps(
    watch: StepWatch, slots: Slots, start: float, steps: range, *, step_s: float, ranks: tuple[int, ...]
) -> float:
    t = start
    for step in steps:
        t += step_s
        for local in ranks:
            slots.write(local, step, t, samples=4)
        watch.observe(slots.now, t)
        assert watch.check(t) is not None
        verdict = watch.check(t)
        assert verdict is not None
        assert not verdict.hung, verdict.reason
    return t


def test_nothing_is_judged_before_any_worker_reports() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    watch.observe({}, 0.0)
    assert watch.check(10_000.0) is None
    assert not watch.reporting
    assert watch.stats(10_000.0) == ()


def test_a_rank_that_stops_reporting_is_hung_after_k_times_the_median_step() -> None:
    watch = StepWatch({0: 8, 1: 9}, CONFIG)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 12), step_s=1.0, ranks=(0, 1))
    # Rank 9 (local 1) stops; rank 8 waits for it in the next collective and stops too.
    assert watch.window_s() == pytest.approx(5.0)
    assert not watch.check(t + 4.9).hung  # type: ignore[union-attr]
    verdict = watch.check(t + 5.1)
    assert verdict is not None
    assert verdict.hung
    assert verdict.stalled_ranks == (8, 9)
    assert verdict.window_s == pytest.approx(5.0)
    assert "5 x the median training time between step marks of 1 s" in verdict.reason
    assert watch.local_rank(9) == 1
    assert watch.global_rank(0) == 8


def test_fast_steps_are_judged_by_the_floor() -> None:
    watch = StepWatch({0: 0}, CONFIG)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 20), step_s=0.1, ranks=(0,))
    assert not watch.check(t + 1.9).hung  # type: ignore[union-attr]
    verdict = watch.check(t + 2.1)
    assert verdict is not None
    assert verdict.hung
    assert "the floor" in verdict.reason


def test_a_checkpoint_phase_gets_its_own_allowance() -> None:
    config = HangConfig(
        k=5.0, floor_s=2.0, warmup_steps=1, min_step_samples=2, phase_allowance_s={"checkpoint": 30.0, "eval": 60.0}
    )
    watch = StepWatch({0: 0}, config)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 10), step_s=1.0, ranks=(0,))
    slots.write(0, 9, t + 0.5, phase="checkpoint")
    watch.observe(slots.now, t + 0.5)
    assert not watch.check(t + 25.0).hung  # type: ignore[union-attr]
    verdict = watch.check(t + 31.0)
    assert verdict is not None
    assert verdict.hung
    assert "phase 'checkpoint'" in verdict.reason
    # Back to training: judged by the steps again.
    slots.write(0, 10, t + 31.5, phase="train")
    watch.observe(slots.now, t + 31.5)
    assert not watch.check(t + 32.0).hung  # type: ignore[union-attr]


def test_only_ranks_that_marked_enough_steps_to_know_their_pace_are_judged() -> None:
    # CONFIG: one warm-up step and two clean durations, so a rank is judged from its third mark.
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    # Rank 1 never marks a step (say only rank 0 saves checkpoints): never judged, however long.
    slots.write(0, 1, 1.0)
    watch.observe(slots.now, 1.0)
    # Marks far apart at first (a checkpoint every half hour) are no hang either.
    assert not watch.check(1_800.0).hung  # type: ignore[union-attr]
    slots.write(0, 2, 1_801.0)
    watch.observe(slots.now, 1_801.0)
    assert not watch.check(3_600.0).hung  # type: ignore[union-attr]
    slots.write(0, 3, 3_601.0)
    watch.observe(slots.now, 3_601.0)
    # From its third mark rank 0's pace is known (1800 s a step) and it is judged by it.
    assert not watch.check(3_601.0 + 5 * 1_800.0 - 1).hung  # type: ignore[union-attr]
    verdict = watch.check(3_601.0 + 5 * 1_800.0 + 1)
    assert verdict is not None
    assert verdict.stalled_ranks == (0,)


def test_samples_alone_never_start_the_watch() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    for t in range(1, 700, 10):  # a sampler counting what it hands out, no step marks
        slots.write(0, 0, float(t), samples=4)
        slots.write(1, 0, float(t), samples=4)
        watch.observe(slots.now, float(t))
    assert watch.check(700.0) is None
    assert {s.samples for s in watch.stats(700.0)} == {4 * 70}


def test_without_a_hang_config_only_stats_are_kept() -> None:
    watch = StepWatch({0: 4, 1: 5}, None)
    slots = Slots()
    t = 0.0
    for step in range(1, 8):
        t += 1.0
        slots.write(0, step, t, samples=2)
        slots.write(1, step, t + 1.0 if step > 3 else t, samples=2)
        watch.observe(slots.now, t + 1.0)
    assert watch.check(t + 1000.0) is None
    stats = {s.rank: s for s in watch.stats(t + 1.5)}
    assert sorted(stats) == [4, 5]
    assert (stats[4].steps, stats[4].samples, stats[4].phase) == (7, 14, "train")
    assert stats[4].median_step_s == pytest.approx(1.0)
    assert stats[4].since_step_s == pytest.approx(1.5)
    assert stats[5].since_step_s == pytest.approx(0.5)


def test_an_unchanged_slot_is_not_a_new_report_and_reports_never_go_back_in_time() -> None:
    watch = StepWatch({0: 0}, CONFIG)
    slots = Slots()
    run_steps(watch, slots, 10.0, range(1, 5), step_s=1.0, ranks=(0,))
    # A step end stamped before the watch began (the worker wrote, the agent read later): clamped.
    late = StepWatch({0: 0}, CONFIG)
    late.observe({0: SlotReading(2, 1, 0, 5.0, "train", 5.0, 1)}, 20.0)
    late.observe({0: SlotReading(2, 1, 0, 5.0, "train", 5.0, 1)}, 30.0)
    verdict = late.check(30.0)
    assert verdict is not None
    assert not verdict.hung


def test_workers_marked_only_by_their_saves_are_not_hung_between_two_saves() -> None:
    # No script marks: the checkpointer marks a step at each save, every 100 steps of 0.5 s.
    # The window follows the 50 s between marks, not the 0.5 s per step (30 s floor).
    watch = StepWatch({0: 0, 1: 1}, HangConfig(k=5.0, floor_s=30.0))
    slots = Slots()
    t = 0.0
    for mark in range(1, 12):
        t += 50.0
        for local in (0, 1):
            slots.write(local, mark * 100, t)
        watch.observe(slots.now, t)
        verdict = watch.check(t + 49.0)
        assert verdict is not None
        assert not verdict.hung, verdict.reason
    verdict = watch.check(t + 251.0)
    assert verdict is not None
    assert verdict.hung
    assert verdict.window_s == pytest.approx(250.0)


def test_the_heartbeat_carries_each_ranks_median_lead_time() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 4), step_s=1.0, ranks=(0, 1))
    assert all(s.median_sync_lead_s == 0.0 for s in watch.stats(t))  # nobody synchronized yet
    lead = {0: 0.0, 1: 0.0}
    for tick in range(1, 8):
        t += 1.0
        for local, per_step in ((0, 0.1), (1, 0.4)):
            # Two steps synchronized since the last tick; one tick a slow step of 1 s on rank 0.
            per = 1.0 if local == 0 and tick == 3 else per_step
            lead[local] += 2 * per
            r = slots.now[local]
            slots.now[local] = SlotReading(
                r.seq + 2, r.step + 2, r.samples, t, "train", r.phase_since_s, r.pid,
                lead_s=lead[local], lead_steps=2 * tick,
            )  # fmt: skip
        watch.observe(slots.now, t)
    stats = {s.rank: s for s in watch.stats(t)}
    assert stats[0].median_sync_lead_s == pytest.approx(0.1)  # the median, not the slow tick's mean
    assert stats[1].median_sync_lead_s == pytest.approx(0.4)


def _synchronized(slots: Slots, local: int, t: float, *, steps: int, lead_s: float, leads: int, group: int = 0) -> None:
    r = slots.now[local]
    slots.now[local] = SlotReading(
        r.seq + 2, r.step + steps, r.samples, t if steps else r.step_end_s, "train", r.phase_since_s, r.pid,
        lead_s=lead_s, lead_steps=leads, sync_group=group,
    )  # fmt: skip


def test_a_lead_is_sent_once_three_samples_are_in_and_goes_when_the_rank_stops_synchronizing() -> None:
    watch = StepWatch({0: 6}, CONFIG)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 4), step_s=1.0, ranks=(0,))
    for tick in range(1, 4):
        t += 1.0
        _synchronized(slots, 0, t, steps=1, lead_s=0.2 * tick, leads=tick, group=4)
        watch.observe(slots.now, t)
        lead = watch.stats(t)[0].median_sync_lead_s
        assert lead == (pytest.approx(0.2) if tick == 3 else 0.0)  # one or two may be warm-up's
    assert watch.stats(t)[0].sync_group == 4
    for _ in range(6):  # marks with no synchronization (a stretch with no collective)
        t += 1.0
        _synchronized(slots, 0, t, steps=1, lead_s=0.6, leads=3, group=4)
        watch.observe(slots.now, t)
    assert watch.stats(t)[0].median_sync_lead_s == 0.0


def test_the_heartbeat_says_how_many_steps_a_ranks_marks_cover() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    t = 0.0
    for mark in range(1, 10):
        t += 5.0
        slots.write(0, mark * 10, t)  # marked only by its saves, every 10 steps
        slots.write(1, mark, t)
        watch.observe(slots.now, t)
    stats = {s.rank: s for s in watch.stats(t)}
    assert stats[0].steps_per_mark == 10.0
    assert stats[1].steps_per_mark == 1.0


def test_a_mark_inside_a_save_begun_between_two_reads_counts_only_the_training_before_the_save() -> None:
    # Each cycle: 1 s of training, a save entered, the step marked 0.5 s into it, training again
    # 10 s later. The agent reads once after the mark (phase and mark both new) and once after the
    # return to training. The training between marks is 1 s (a 5 s window), not 1.5 s.
    watch = StepWatch({0: 0}, HangConfig(k=5.0, floor_s=0.1, warmup_steps=0, min_step_samples=3))
    t, seq = 0.0, 0
    for step in range(1, 6):
        seq += 2
        reading = SlotReading(seq, step, 0, t + 1.5, "checkpoint", t + 1.0, 1000, marks=step)
        watch.observe({0: reading}, t + 1.6)
        t += 11.5
        seq += 2
        watch.observe({0: SlotReading(seq, step, 0, t - 10.0, "train", t, 1000, marks=step)}, t)
    assert watch.window_s() == pytest.approx(5.0)


def test_a_postponed_watch_judges_nothing_until_then_and_judges_again_after() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 8), step_s=1.0, ranks=(0, 1))
    watch.postpone(t + 30.0)
    assert watch.check(t + 29.0) is None
    verdict = watch.check(t + 30.0)
    assert verdict is not None
    assert verdict.hung


def test_a_new_mark_lifts_the_postponement() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 8), step_s=1.0, ranks=(0, 1))
    watch.postpone(t + 1000.0)
    t = run_steps(watch, slots, t, range(8, 10), step_s=1.0, ranks=(0, 1))
    verdict = watch.check(t + 10.0)  # stalled again, past its 5 s window: judged, not postponed
    assert verdict is not None
    assert verdict.hung


def test_busy_ranks_are_excused_up_to_the_eval_allowance_without_a_mark() -> None:
    config = HangConfig(k=5.0, floor_s=2.0, warmup_steps=1, min_step_samples=2, phase_allowance_s={"eval": 100.0})
    watch = StepWatch({0: 0, 1: 1}, config)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 8), step_s=1.0, ranks=(0, 1))
    assert watch.excuse_busy(t + 5.0, 30.0)
    assert watch.check(t + 34.0) is None
    assert watch.excuse_busy(t + 35.0, 30.0)
    assert watch.excuse_busy(t + 104.0, 30.0)
    assert not watch.excuse_busy(t + 106.0, 30.0)  # busy for 101 s with no mark: the verdict stands
    t = run_steps(watch, slots, t + 106.0, range(8, 10), step_s=1.0, ranks=(0, 1))
    assert watch.excuse_busy(t + 5.0, 30.0)  # marks came: a new episode


def test_a_rank_in_a_named_phase_or_found_busy_excuses_peers_of_other_nodes() -> None:
    config = HangConfig(k=5.0, floor_s=2.0, warmup_steps=1, min_step_samples=2, phase_allowance_s={"eval": 100.0})
    watch = StepWatch({0: 0, 1: 1}, config)
    assert watch.excuses(0.0) == ()  # nobody reported yet
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 8), step_s=1.0, ranks=(0, 1))
    assert watch.excuses(t) == ()  # both train
    slots.write(0, 7, t + 1.0, "eval")  # rank 0 evaluates alone; rank 1 waits for it
    watch.observe(slots.now, t + 1.0)
    assert watch.excuses(t + 11.0) == (PeerExcuse(10.0, 90.0, "rank 0 in phase 'eval'"),)
    assert watch.excuses(t + 102.0) == ()  # past its allowance: it excuses nobody
    # Busy: a stalled rank runs code (the agent's probe). It excuses peers from then on, through every
    # postponement, up to the eval allowance, until a probe finds it idle.
    busy = StepWatch({0: 0, 1: 1}, config)
    t = run_steps(busy, Slots(), 0.0, range(1, 8), step_s=1.0, ranks=(0, 1))
    assert busy.excuse_busy(t + 6.0, 30.0)
    assert busy.excuses(t + 10.0) == (PeerExcuse(4.0, 96.0, "a stalled rank busy running code"),)
    assert busy.excuses(t + 38.0) == (PeerExcuse(32.0, 68.0, "a stalled rank busy running code"),)  # re-probed
    busy.busy_over()  # the next probe found it idle: its verdict stands
    assert busy.excuses(t + 39.0) == ()


def test_ranks_waiting_for_a_peer_of_another_node_are_judged_by_its_excuse() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    t = run_steps(watch, slots, 0.0, range(1, 8), step_s=1.0, ranks=(0, 1))
    # Another node's rank began evaluating a second after these ranks' last step; the master relays it 4 s later.
    watch.excuse_elsewhere([PeerExcuse(3.0, 97.0, "rank 2 in phase 'eval'")], t + 4.0)
    verdict = watch.check(t + 60.0)
    assert verdict is not None
    assert not verdict.hung, verdict.reason
    watch.excuse_elsewhere([], t + 61.0)  # it ended, or its node went: judged by their own windows again
    verdict = watch.check(t + 61.0)
    assert verdict is not None
    assert verdict.stalled_ranks == (0, 1)
    # Relayed excuses are used only while the master's answers keep coming.
    watch.excuse_elsewhere([PeerExcuse(3.0, 97.0)], t + 4.0, valid_for_s=30.0)
    verdict = watch.check(t + 34.0)
    assert verdict is not None
    assert not verdict.hung
    verdict = watch.check(t + 35.0)  # no answer for 31 s: no longer known to last
    assert verdict is not None
    assert verdict.stalled_ranks == (0, 1)
    # One ran out before the ranks moved again; the other began after their 5 s window ran out: a hang first.
    watch.excuse_elsewhere([PeerExcuse(6.0, 0.5), PeerExcuse(0.5, 80.0)], t + 7.0)
    verdict = watch.check(t + 8.0)
    assert verdict is not None
    assert verdict.stalled_ranks == (0, 1)


def test_a_rank_marking_every_fast_step_covers_one_step_per_mark_however_many_fall_between_reads() -> None:
    watch = StepWatch({0: 0}, CONFIG)
    slots = Slots()
    t = 0.0
    for read in range(1, 10):
        t += 0.1
        slots.write(0, read * 20, t, marks=20)  # 5 ms steps, each marked: 20 between two reads
        watch.observe(slots.now, t)
    (stats,) = watch.stats(t)
    assert stats.steps_per_mark == 1.0


def test_a_slot_with_nonsense_times_is_left_out_of_the_heartbeat() -> None:
    watch = StepWatch({0: 0, 1: 1}, CONFIG)
    slots = Slots()
    run_steps(watch, slots, 0.0, range(1, 4), step_s=1.0, ranks=(0, 1))
    r = slots.now[1]
    slots.now[1] = SlotReading(r.seq + 2, r.step + 1, r.samples, float("inf"), "train", r.phase_since_s, r.pid)
    watch.observe(slots.now, 5.0)
    assert [s.rank for s in watch.stats(5.0)] == [0]


def test_workers_marked_inside_their_saves_checkpoint_phase_are_judged_by_the_time_between_saves() -> None:
    # The real checkpointer's pattern: a checkpoint phase, the step mark inside it, back to
    # training. No step is a clean step duration; the time between marks still is a pace.
    watch = StepWatch({0: 0}, HangConfig(k=5.0, floor_s=30.0))
    slots = Slots()
    t = 0.0
    for mark in range(1, 12):
        t += 50.0
        slots.write(0, (mark - 1) * 100, t - 0.5, phase="checkpoint")
        watch.observe(slots.now, t - 0.5)
        slots.write(0, mark * 100, t - 0.1, phase="checkpoint")
        watch.observe(slots.now, t - 0.1)
        slots.write(0, mark * 100, t, phase="train")
        watch.observe(slots.now, t)
        verdict = watch.check(t + 49.0)
        assert verdict is not None
        assert not verdict.hung, verdict.reason
    assert watch.window_s() == pytest.approx(250.0, rel=0.01)
    verdict = watch.check(t + 255.0)
    assert verdict is not None
    assert verdict.hung
