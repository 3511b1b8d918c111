"""The step slot file: what a worker writes is what its agent reads, consistently and cheaply."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import attrs
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dlrover.common import ConfigError
from dlrover.common.step_slots import (
    PHASES,
    STACK_DUMP_ENV_VAR,
    STEP_SLOT_ENV_VAR,
    STEP_SLOTS_ENV_VAR,
    SlotReading,
    StepReporter,
    StepSlotFile,
    optional_reporter,
)

pytestmark = pytest.mark.timeout(60)


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_new_file_has_every_slot_empty(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 3)
    try:
        assert slots.read_all() == {}
        assert (tmp_path / "s").stat().st_size == 64 + 3 * 128
    finally:
        slots.close()
    assert not (tmp_path / "s").exists()


def test_steps_samples_and_phases_round_trip_with_their_times(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 2)
    clock = _Clock()
    writer = StepReporter(slots.path, 1, clock=clock)
    try:
        writer.step(samples=8)
        first = slots.read(1)
        assert first is not None
        assert (first.step, first.samples, first.step_end_s, first.phase, first.pid) == (
            1,
            8,
            100.0,
            "train",
            os.getpid(),
        )
        clock.t = 101.5
        writer.phase("checkpoint")
        clock.t = 103.0
        writer.step(5, samples=2)
        writer.add_samples(6)
        got = slots.read(1)
        assert got is not None
        assert (got.step, got.samples, got.step_end_s, got.phase, got.phase_since_s) == (
            5,
            16,
            103.0,
            "checkpoint",
            101.5,
        )
        assert got.seq > first.seq
        assert got.seq % 2 == 0
        assert slots.read(0) is None
    finally:
        writer.close()
        slots.close()


def test_a_step_not_above_the_slots_keeps_it_and_its_end_time(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 1)
    clock = _Clock()
    writer = StepReporter(slots.path, 0, clock=clock)
    second = StepReporter(slots.path, 0, clock=clock)  # another library in the same process
    try:
        writer.step(10)
        clock.t = 200.0
        second.step(4, samples=3)  # e.g. a checkpointer saving an older step number
        got = slots.read(0)
        assert got is not None
        assert (got.step, got.samples, got.step_end_s) == (10, 3, 100.0)
    finally:
        writer.close()
        second.close()
        slots.close()


def test_reset_clears_every_slot(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 2)
    writer = StepReporter(slots.path, 0)
    try:
        writer.step()
        assert 0 in slots.read_all()
        slots.reset()
        assert slots.read_all() == {}
    finally:
        writer.close()
        slots.close()


@pytest.mark.parametrize("slots", [0, -1, 5000, 1.5])
def test_a_slot_count_out_of_range_is_refused(tmp_path: Path, slots: object) -> None:
    with pytest.raises(ConfigError, match="slots must be"):
        StepSlotFile(tmp_path / "s", slots)  # type: ignore[arg-type]
    assert not (tmp_path / "s").exists()


def test_a_writer_refuses_a_file_that_is_not_a_slot_file_and_a_slot_out_of_range(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"x" * 256)
    with pytest.raises(ConfigError, match="not a step slot file"):
        StepReporter(tmp_path / "junk", 0)
    slots = StepSlotFile(tmp_path / "s", 2)
    try:
        with pytest.raises(ConfigError, match=r"slot index must be in \[0, 2\)"):
            StepReporter(slots.path, 2)
    finally:
        slots.close()


def test_bad_reports_are_refused_and_change_nothing(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 1)
    writer = StepReporter(slots.path, 0)
    try:
        writer.step(3)
        before = slots.read(0)
        with pytest.raises(ConfigError, match="phase must be one of"):
            writer.phase("lunch")
        with pytest.raises(ConfigError, match="step must be"):
            writer.step(-1)
        with pytest.raises(ConfigError, match="samples must be"):
            writer.add_samples(-5)
        assert slots.read(0) == before
        assert PHASES == ("train", "checkpoint", "eval", "wait")
    finally:
        writer.close()
        slots.close()


def test_without_dlrover_run_there_is_no_reporter_and_a_broken_setup_only_warns(tmp_path: Path) -> None:
    assert StepReporter.from_env({}) is None
    assert optional_reporter({}) is None
    bad = {STEP_SLOTS_ENV_VAR: str(tmp_path / "missing"), STEP_SLOT_ENV_VAR: "0"}
    assert optional_reporter(bad) is None
    with pytest.raises(ConfigError, match="must be an integer"):
        StepReporter.from_env({STEP_SLOTS_ENV_VAR: str(tmp_path / "x"), STEP_SLOT_ENV_VAR: "one"})


def test_a_reporting_process_dumps_its_stacks_on_sigusr1_while_blocked(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 1)
    dump = tmp_path / "stacks.txt"
    script = textwrap.dedent(
        """
        import threading
        from dlrover.common.step_slots import StepReporter
        rep = StepReporter.from_env()
        rep.step()
        def blocked_here():
            threading.Event().wait()
        blocked_here()
        """
    )
    env = {**os.environ, STEP_SLOTS_ENV_VAR: str(slots.path), STEP_SLOT_ENV_VAR: "0", STACK_DUMP_ENV_VAR: str(dump)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        while slots.read(0) is None:  # registered before its first report
            assert proc.poll() is None
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGUSR1)
        while "blocked_here" not in (dump.read_text() if dump.exists() else ""):
            assert proc.poll() is None, "SIGUSR1 killed the process: no handler"
            time.sleep(0.02)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        slots.close()


class SlotMachine(RuleBasedStateMachine):
    """Several writers in one process, a reader, resets: every read equals a trivially correct model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="slots-"))
        self.slots = StepSlotFile(self.dir / "s", 2)
        self.clock = _Clock()
        # Two writers of slot 0 (the script's own, a library's) and one of slot 1.
        self.writers = [
            StepReporter(self.slots.path, 0, clock=self.clock),
            StepReporter(self.slots.path, 0, clock=self.clock),
            StepReporter(self.slots.path, 1, clock=self.clock),
        ]
        self.model: dict[int, dict[str, object]] = {}

    def _slot(self, writer: int) -> dict[str, object]:
        index = 0 if writer < 2 else 1
        if index not in self.model:
            self.model[index] = {
                "step": 0,
                "samples": 0,
                "end": 0.0,
                "phase": "train",
                "since": self.clock.t,
                "synced": 0,
                "lead": 0.0,
                "leads": 0,
                "first": 0,
                "group": 0,
                "marks": 0,
            }
        return self.model[index]

    @rule(dt=st.floats(0.0, 5.0))
    def time_passes(self, dt: float) -> None:
        self.clock.t += dt

    @rule(writer=st.integers(0, 2), step=st.one_of(st.none(), st.integers(0, 50)), samples=st.integers(0, 9))
    def step(self, writer: int, step: int | None, samples: int) -> None:
        slot = self._slot(writer)
        target = int(slot["step"]) + 1 if step is None else step  # type: ignore[call-overload]
        self.writers[writer].step(step, samples=samples)
        if target > int(slot["step"]):  # type: ignore[call-overload]
            slot["step"], slot["end"] = target, self.clock.t
            slot["first"] = slot["first"] or target
            slot["marks"] = int(slot["marks"]) + 1  # type: ignore[call-overload]
        slot["samples"] = int(slot["samples"]) + samples  # type: ignore[call-overload]

    @rule(writer=st.integers(0, 2), phase=st.sampled_from(PHASES))
    def phase(self, writer: int, phase: str) -> None:
        slot = self._slot(writer)
        self.writers[writer].phase(phase)
        if phase != slot["phase"]:
            slot["phase"], slot["since"] = phase, self.clock.t

    @rule(writer=st.integers(0, 2), group=st.integers(0, 3), earlier=st.sampled_from([0.0, 0.25, 3.0]))
    def synchronizing(self, writer: int, group: int, earlier: float) -> None:
        counted = self.writers[writer].synchronizing(group, earlier_lead_s=earlier)
        slot = self.model.get(0 if writer < 2 else 1)
        if slot is None:
            assert counted is None
            return  # a slot never written stays unwritten
        step, first, synced = int(slot["step"]), int(slot["first"]), int(slot["synced"])  # type: ignore[call-overload]
        if first > 0 and step > first and slot["phase"] == "train" and synced < step:
            started = max(float(slot["end"]), float(slot["since"]))  # type: ignore[arg-type]
            lead = max(self.clock.t - started, 0.0)
            assert counted == pytest.approx(lead)
            slot["synced"], slot["group"] = step, group
            slot["lead"] = float(slot["lead"]) + lead + earlier  # type: ignore[arg-type]
            slot["leads"] = int(slot["leads"]) + 1  # type: ignore[call-overload]
        else:
            assert counted is None  # and what came from earlier steps is not written

    @rule()
    def reset(self) -> None:
        self.slots.reset()
        self.model.clear()

    @invariant()
    def reads_equal_the_model(self) -> None:
        got = self.slots.read_all()
        assert sorted(got) == sorted(self.model)
        for index, slot in self.model.items():
            r = got[index]
            assert (r.step, r.samples, r.step_end_s, r.phase, r.phase_since_s) == (
                slot["step"],
                slot["samples"],
                slot["end"],
                slot["phase"],
                slot["since"],
            )
            assert (r.lead_s, r.lead_steps, r.sync_group) == (pytest.approx(slot["lead"]), slot["leads"], slot["group"])
            assert r.marks == slot["marks"]
            assert r.seq % 2 == 0

    def teardown(self) -> None:
        for writer in self.writers:
            writer.close()
        self.slots.close()
        self.dir.rmdir()


TestSlotMachine = SlotMachine.TestCase


def test_steps_per_mark_counts_the_marks_between_two_reads_even_when_many_fall_between(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 1)
    writer = StepReporter(slots.path, 0)
    try:
        writer.step(4)
        first = slots.read(0)
        for step in range(5, 51):  # one step per mark, 46 of them between two reads
            writer.step(step)
        assert first is not None
        middle = slots.read(0)
        assert middle is not None
        assert middle.steps_per_mark(first) == 1.0
        for step in range(55, 105, 5):  # a mark every fifth step
            writer.step(step)
        late = slots.read(0)
        assert late is not None
        assert late.steps_per_mark(middle) == 5.0
        writer.step(100)  # not above the slot's step: no mark
        writer.add_samples(3)
        again = slots.read(0)
        assert again is not None
        assert again.steps_per_mark(late) is None
    finally:
        writer.close()
        slots.close()


def test_a_slots_first_mark_is_no_measure_of_steps_per_mark() -> None:
    # A restored process's first mark is its checkpoint's step (1000), not 1000 steps it took.
    loading = SlotReading(2, 0, 0, 0.0, "checkpoint", 0.0, 1)
    first = attrs.evolve(loading, seq=4, step=1000, marks=1)
    assert first.steps_per_mark(loading) is None
    assert attrs.evolve(first, seq=6, step=1001, marks=2).steps_per_mark(first) == 1.0


def test_steps_per_mark_survives_the_counter_wrapping_and_ignores_a_reset_slot() -> None:
    before = SlotReading(2, 100, 0, 1.0, "train", 0.0, 1, marks=2**32 - 2)
    after = attrs.evolve(before, seq=4, step=112, marks=2)
    assert after.steps_per_mark(before) == 3.0
    reset = attrs.evolve(before, seq=6, step=3, marks=1)
    assert reset.steps_per_mark(before) is None


def test_checkpoint_phases_before_the_first_step_are_the_load_and_after_it_saves(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 1)
    now = [10.0]
    writer = StepReporter(slots.path, 0, clock=lambda: now[0])
    writer.phase("checkpoint")  # the first write: ready at 10
    now[0] = 12.0
    writer.phase("train")  # a 2 s load ends: ready at 12
    now[0] = 13.0
    writer.step(1, samples=4)
    writer.phase("checkpoint")
    now[0] = 13.5
    writer.step(2)
    writer.phase("train")  # a 0.5 s save
    reading = slots.read(0)
    assert reading is not None
    assert (reading.ready_s, reading.load_s, reading.save_s) == (12.0, 2.0, 0.5)
    assert (reading.step, reading.samples, reading.step_end_s) == (2, 4, 13.5)
    writer.close()
    slots.close()


def test_the_agents_save_request_reaches_every_worker_and_survives_a_reset(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "steps.slots", 2)
    first, second = StepReporter(slots.path, 0), StepReporter(slots.path, 1)
    try:
        assert (first.save_request(), second.save_request()) == (0, 0)
        assert slots.request_save() == 1
        assert (first.save_request(), second.save_request()) == (1, 1)
        first.step(4)  # a worker's own writes leave the header alone
        slots.reset()
        assert second.save_request() == 1
        assert slots.request_save() == 2
        assert first.save_request() == 2
        assert slots.read(0) is None
    finally:
        first.close()
        second.close()
        slots.close()


def test_a_served_save_request_is_read_by_the_agent_and_only_grows(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "steps.slots", 1)
    worker = StepReporter(slots.path, 0)
    try:
        worker.step(3, samples=8)
        assert slots.read(0).served_request == 0  # type: ignore[union-attr]
        worker.serve_save_request(2)
        worker.serve_save_request(1)  # an older answer does not undo a newer one
        reading = slots.read(0)
        assert reading is not None
        assert (reading.served_request, reading.step, reading.samples) == (2, 3, 8)
        worker.step(4)
        assert slots.read(0).served_request == 2  # type: ignore[union-attr]  # other writes keep it
        with pytest.raises(ConfigError, match="request"):
            worker.serve_save_request(-1)
        assert slots.read(0).served_request == 2  # type: ignore[union-attr]
    finally:
        worker.close()
        slots.close()


def test_a_worker_marks_that_it_polls_save_requests_and_the_mark_stays_until_a_reset(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "steps.slots", 2)
    worker = StepReporter(slots.path, 1)
    try:
        worker.step(1)
        assert not slots.read(1).polls_save_requests  # type: ignore[union-attr]
        worker.mark_polling_save_requests()
        worker.step(2, samples=4)
        worker.serve_save_request(1)
        reading = slots.read(1)
        assert reading is not None
        assert (reading.polls_save_requests, reading.step, reading.samples, reading.served_request) == (True, 2, 4, 1)
        assert slots.read(0) is None  # the other slot is untouched
        slots.reset()  # the next workers must say so themselves
        worker.step(3)
        assert not slots.read(1).polls_save_requests  # type: ignore[union-attr]
    finally:
        worker.close()
        slots.close()


def test_the_current_phase_is_read_from_the_slot_whoever_wrote_it(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 1)
    script = StepReporter(slots.path, 0)
    library = StepReporter(slots.path, 0)  # a checkpointer's own writer of the same slot
    try:
        assert library.current_phase == "train"  # nothing written yet
        script.phase("eval")
        assert library.current_phase == "eval"
        library.phase("checkpoint")
        assert script.current_phase == "checkpoint"
    finally:
        script.close()
        library.close()
        slots.close()
    with pytest.raises(ConfigError, match="closed"):
        script.current_phase  # noqa: B018


def test_the_lead_is_the_time_from_a_steps_start_to_its_first_synchronization_point(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "s", 1)
    clock = _Clock()
    writer = StepReporter(slots.path, 0, clock=clock)

    def lead() -> tuple[float, int, int]:
        reading = slots.read(0)
        assert reading is not None
        return reading.lead_s, reading.lead_steps, reading.sync_group

    try:
        writer.synchronizing()  # before any mark: nothing to measure from
        clock.t += 5.0
        writer.step(1)
        writer.synchronizing(2)  # the second step still warms up: not counted
        clock.t += 1.0
        writer.step(2)
        clock.t += 0.3
        assert writer.synchronizing(2) == pytest.approx(0.3)  # the first bucket of step 3, 0.3 s in
        clock.t += 0.1
        assert writer.synchronizing(2) is None  # later buckets of the same step do not count
        clock.t += 0.2
        writer.step(3)
        writer.phase("checkpoint")  # a save between two steps is no step's work
        clock.t += 4.0
        writer.phase("train")
        clock.t += 0.5
        writer.synchronizing(2)
        assert lead() == (pytest.approx(0.8), 2, 2)
        writer.step(4)
        # At the very moment of the mark: a lead of 0, still counted, written with what a device
        # found longer in an earlier step than the CPU saw.
        assert writer.synchronizing(2, earlier_lead_s=0.25) == 0.0
        assert lead() == (pytest.approx(1.05), 3, 2)
        writer.phase("eval")  # an evaluation's collectives are not a training step's
        clock.t += 1.0
        writer.step(5)
        writer.synchronizing(2)
        assert lead()[1] == 3
        with pytest.raises(ConfigError, match="group"):
            writer.synchronizing(-1)
        for bad in (-0.1, float("inf"), float("nan"), True):
            with pytest.raises(ConfigError, match="earlier_lead_s"):
                writer.synchronizing(2, earlier_lead_s=bad)  # type: ignore[arg-type]
        assert lead()[1] == 3
    finally:
        writer.close()
        slots.close()


def test_a_restored_process_counts_no_lead_in_its_first_step(tmp_path: Path) -> None:
    # Its first mark is the checkpoint's step (the loader marks it): the step after it compiles.
    slots = StepSlotFile(tmp_path / "s", 1)
    clock = _Clock()
    writer = StepReporter(slots.path, 0, clock=clock)
    try:
        writer.step(4800)
        clock.t += 60.0
        writer.synchronizing()
        writer.step(4801)
        clock.t += 0.2
        writer.synchronizing()
        reading = slots.read(0)
        assert reading is not None
        assert (reading.lead_s, reading.lead_steps) == (pytest.approx(0.2), 1)
    finally:
        writer.close()
        slots.close()


class _DescheduledWriter:
    """Stands in for the module's `time`: the slot's writer stopped inside its write (odd sequence)
    and finishes it at the reader's `finish_at`-th sleep (never when 0); the clock moves only by
    the sleeps."""

    def __init__(self, path: Path, index: int, finish_at: int) -> None:
        import mmap

        self._file = open(path, "r+b")  # noqa: SIM115 (closed by `close`)
        self._mm = mmap.mmap(self._file.fileno(), 0)
        self._off = 64 + index * 128
        (self._seq,) = struct.unpack_from("<Q", self._mm, self._off)
        struct.pack_into("<Q", self._mm, self._off, self._seq | 1)
        self._finish_at = finish_at
        self.sleeps = 0
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.sleeps == self._finish_at:
            struct.pack_into("<Q", self._mm, self._off, self._seq)

    def close(self) -> None:
        self._mm.close()
        self._file.close()


@pytest.mark.parametrize("finish_at", [1, 7, 0])
def test_a_reader_waits_a_bounded_while_for_a_writer_descheduled_inside_its_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finish_at: int
) -> None:
    from dlrover.common import step_slots

    slots = StepSlotFile(tmp_path / "steps.slots", 2)
    worker = StepReporter(slots.path, 1)
    try:
        worker.step(5)
        worker.mark_polling_save_requests()
        writer = _DescheduledWriter(slots.path, 1, finish_at)
        monkeypatch.setattr(step_slots, "time", writer)
        try:
            reading = slots.read_all().get(1)
        finally:
            writer.close()
        if finish_at:
            # The write ended while the reader waited: its reading, not "no reading" (the agent
            # would take a worker that polls save requests for one that does not).
            assert reading is not None
            assert (reading.step, reading.polls_save_requests) == (5, True)
            assert writer.sleeps == finish_at
        else:
            # A writer that died inside its write: no reading, after a bounded wait.
            assert reading is None
            assert writer.now == pytest.approx(0.02, abs=0.001)
    finally:
        worker.close()
        slots.close()
