"""`DeviceLeads`: a step's lead on the device's timeline, added to the CPU's once the device got there."""

from __future__ import annotations

import pytest

from dlrover.common import ConfigError
from dlrover.diagnosis.device_leads import DeviceLeads, TimedEvent

pytestmark = pytest.mark.timeout(30)


class FakeDevice:
    """A device whose queue reaches each event at a time the test sets; `now` is how far it got."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queued: list[FakeEvent] = []

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at: float | None = None  # when the device reaches it; set by the test after record

    def record(self) -> None:
        self.device.queued.append(self)

    def query(self) -> bool:
        return self.at is not None and self.at <= self.device.now

    def elapsed_time(self, end_event: TimedEvent) -> float:
        assert isinstance(end_event, FakeEvent)
        assert self.query()
        assert end_event.query()
        assert self.at is not None
        assert end_event.at is not None
        return (end_event.at - self.at) * 1000.0


class FakeReporter:
    """The reporter's ``synchronizing`` bound to a group: counts the first call of each step."""

    def __init__(self, cpu_lead: float) -> None:
        self.cpu_lead = cpu_lead
        self.counting = True  # the next call is a step's first, past warm-up
        self.written: list[tuple[float, float]] = []  # (cpu lead, earlier) per counted step

    def mark(self, earlier: float) -> float | None:
        if not self.counting:
            return None
        self.counting = False
        self.written.append((self.cpu_lead, earlier))
        return self.cpu_lead


def one_step(leads: DeviceLeads, device: FakeDevice, reporter: FakeReporter, *, start: float, end: float) -> None:
    """A step whose forward reaches the device at `start` and whose first bucket at `end`."""
    leads.forward_started()
    reporter.counting = True
    leads.synchronizing(reporter.mark)
    leads.synchronizing(reporter.mark)  # the step's later buckets
    for event, at in zip(device.queued[-2:], (start, end), strict=True):
        event.at = at


def test_a_device_slower_than_the_cpu_lengthens_the_lead_by_the_difference_with_a_later_step() -> None:
    device, reporter = FakeDevice(), FakeReporter(cpu_lead=0.010)
    leads = DeviceLeads(device.event)
    one_step(leads, device, reporter, start=1.0, end=1.300)  # 300 ms on the device, 10 ms on the CPU
    assert leads.pending == 1
    device.now = 1.300
    one_step(leads, device, reporter, start=2.0, end=2.005)  # 5 ms: the CPU's 10 ms stand
    assert reporter.written[1] == (0.010, pytest.approx(0.290))
    device.now = 2.005
    one_step(leads, device, reporter, start=3.0, end=3.010)
    assert reporter.written[2] == (0.010, 0.0)
    # Each step's lead is the longer of the two: 300, 10 ms (and 10 ms for the third so far).
    assert sum(cpu + earlier for cpu, earlier in reporter.written) == pytest.approx(0.320)


def test_the_device_is_never_waited_for_and_is_read_in_order() -> None:
    device, reporter = FakeDevice(), FakeReporter(cpu_lead=0.0)
    leads = DeviceLeads(device.event)
    one_step(leads, device, reporter, start=1.0, end=1.2)
    one_step(leads, device, reporter, start=2.0, end=2.1)
    assert leads.pending == 2
    assert [earlier for _, earlier in reporter.written] == [0.0, 0.0]  # the device got to neither
    device.now = 2.1
    one_step(leads, device, reporter, start=3.0, end=3.4)
    assert reporter.written[2][1] == pytest.approx(0.3)  # both steps' 200 and 100 ms
    assert leads.pending == 1


def test_what_was_found_waits_for_a_step_that_counts() -> None:
    device, reporter = FakeDevice(), FakeReporter(cpu_lead=0.0)
    leads = DeviceLeads(device.event)
    one_step(leads, device, reporter, start=1.0, end=1.5)
    device.now = 9.0
    leads.forward_started()
    reporter.counting = False  # an evaluation's collective, or a warm-up step: nothing counted
    leads.synchronizing(reporter.mark)
    assert len(reporter.written) == 1
    one_step(leads, device, reporter, start=10.0, end=10.0)
    assert reporter.written[-1][1] == pytest.approx(0.5)


def test_gradient_accumulation_times_the_step_from_its_first_forward() -> None:
    device, reporter = FakeDevice(), FakeReporter(cpu_lead=0.0)
    leads = DeviceLeads(device.event)
    leads.forward_started()  # micro-batch 1 (its backward synchronizes nothing)
    leads.forward_started()  # micro-batch 2
    leads.synchronizing(reporter.mark)
    assert len(device.queued) == 2
    device.queued[0].at, device.queued[1].at = 1.0, 1.8
    device.now = 2.0
    one_step(leads, device, reporter, start=3.0, end=3.0)
    assert reporter.written[-1][1] == pytest.approx(0.8)


def test_a_device_far_behind_drops_its_oldest_steps_instead_of_holding_them() -> None:
    device, reporter = FakeDevice(), FakeReporter(cpu_lead=0.0)
    leads = DeviceLeads(device.event, max_pending=2)
    for i in range(5):
        one_step(leads, device, reporter, start=float(i), end=i + 0.5)
    assert leads.pending == 2
    assert leads.dropped == 3
    device.now = 10.0
    one_step(leads, device, reporter, start=11.0, end=11.0)
    assert reporter.written[-1][1] == pytest.approx(1.0)  # the two kept steps only


def test_a_bucket_without_a_forward_seen_marks_the_cpu_lead_only() -> None:
    device, reporter = FakeDevice(), FakeReporter(cpu_lead=0.02)
    leads = DeviceLeads(device.event)
    leads.synchronizing(reporter.mark)
    assert reporter.written == [(0.02, 0.0)]
    assert device.queued == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_pending_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_pending"):
        DeviceLeads(FakeDevice().event, max_pending=bad)  # type: ignore[arg-type]
