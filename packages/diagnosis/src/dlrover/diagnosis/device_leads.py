"""Lead times on an accelerator's own timeline, for ranks whose slow work is queued there.

`dlrover.common.step_slots.StepReporter.synchronizing` times a rank's lead on the CPU: from its
step mark to its first gradient synchronization. On CUDA the CPU only queues the forward and
backward kernels, so the moment the first bucket is handed to the all-reduce says little about
when the device got there: a slow GPU (throttled, degraded, sharing its SMs) makes the rank's
step slow while its CPU lead stays as short as its peers'. `DeviceLeads` times the same stretch
on the device: an event recorded on the current stream where the step's forward starts, another
where the first bucket is synchronized, and the time between them once the device reached both.

Why the device's time says what the CPU's cannot. Every rank leaves the previous step's
all-reduce at about the same moment on its device; from there the device runs the rank's forward
and backward up to the first bucket, and waits, idle, wherever the CPU was late to queue work (a
slow input pipeline). So the device's time from the forward's start to the first bucket is the
rank's own work on whichever of its host or its device was slower, and a straggler's is the
longest in its group.

The lead counted per step is the longer of the two: the CPU's (which also covers what ran
before the forward, such as loading the batch) and the device's. The device's is known only once
the device reached both events, typically during a later step; it is never waited for (an event
not yet reached is asked again at the next step) and at most `max_pending` steps are kept
waiting (the oldest beyond are dropped: a device that far behind is not read). The difference is
added with a later step's lead (`StepReporter.synchronizing`'s ``earlier_lead_s``), so the agent
reads the slot's sum and count moving together.

The core here needs no accelerator: events come from a factory (`TimedEvent`), torch's
``torch.cuda.Event(enable_timing=True)`` in `dlrover.diagnosis.report_gradient_sync`, a fake in
tests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from dlrover.common import ConfigError

__all__ = ["DeviceLeads", "TimedEvent"]


class TimedEvent(Protocol):
    """What `DeviceLeads` needs of an accelerator event (``torch.cuda.Event(enable_timing=True)``
    has it)."""

    def record(self) -> None:
        """Queue the event on the current stream."""

    def query(self) -> bool:
        """Whether the device has reached the event (never blocks)."""

    def elapsed_time(self, end_event: TimedEvent) -> float:
        """Milliseconds on the device from this event to `end_event`, both reached."""


class DeviceLeads:
    """Times each counted step's lead on the device and says how much longer than the CPU's it was.

    Call `forward_started` where a training step's forward begins, `synchronizing` where the
    step's gradients are first synchronized (in place of `StepReporter.synchronizing`, which it
    calls). One thread at a time, as the reporter's own writes (a DDP hook runs on autograd's
    thread while the training thread waits in ``backward()``).

    Args:
        new_event: makes a timed event.
        max_pending: most steps kept waiting for the device (>= 1).
    """

    def __init__(self, new_event: Callable[[], TimedEvent], *, max_pending: int = 8) -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending must be an integer >= 1, got {max_pending!r}")
        self._new_event = new_event
        self._start: TimedEvent | None = None
        # (forward start, first synchronization, the CPU's lead of that step), oldest first.
        self._pending: deque[tuple[TimedEvent, TimedEvent, float]] = deque()
        self._max_pending = max_pending
        self._carried_s = 0.0  # found on the device, not yet written with a step's lead
        self.dropped = 0
        """Steps dropped because the device was more than `max_pending` steps behind."""

    @property
    def pending(self) -> int:
        """Steps whose device time is not known yet."""
        return len(self._pending)

    def forward_started(self) -> None:
        """A training forward starts. Only the first one after a synchronization opens a step:
        with gradient accumulation the step is every micro-batch's forward and backward."""
        if self._start is None:
            start = self._new_event()
            start.record()
            self._start = start

    def synchronizing(self, mark: Callable[[float], float | None]) -> None:
        """A gradient bucket is synchronized. `mark` is the reporter's ``synchronizing`` bound
        to the rank's group (``lambda earlier: reporter.synchronizing(group,
        earlier_lead_s=earlier)``): it returns the CPU's lead when this is the step's first
        synchronization, counted, else None."""
        start, self._start = self._start, None
        if start is None:
            mark(0.0)  # not the step's first bucket, or no forward was seen: the CPU's lead only
            return
        self._collect()
        carried = self._carried_s
        cpu_lead = mark(carried)
        if cpu_lead is None:
            return  # nothing counted (the first steps, an evaluation): what was found waits
        self._carried_s = 0.0
        end = self._new_event()
        end.record()
        self._pending.append((start, end, cpu_lead))
        while len(self._pending) > self._max_pending:
            self._pending.popleft()
            self.dropped += 1

    def _collect(self) -> None:
        """Move what the device has reached into the carried seconds, oldest first, never waiting."""
        while self._pending:
            start, end, cpu_lead = self._pending[0]
            if not (end.query() and start.query()):
                return  # a stream runs in order: the later ones are not reached either
            self._pending.popleft()
            device_s = start.elapsed_time(end) / 1000.0
            if device_s > cpu_lead:
                self._carried_s += device_s - cpu_lead
