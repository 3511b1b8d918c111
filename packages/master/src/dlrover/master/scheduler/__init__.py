"""Scheduler backends: one Protocol, a fake, the local and the external backend."""

from dlrover.master.scheduler.base import (
    AdjustableCapacity,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerBackend,
    SchedulerError,
)
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.scheduler.local import LocalScheduler, parse_slots

__all__ = [
    "AdjustableCapacity",
    "ExternalScheduler",
    "FakeScheduler",
    "LocalScheduler",
    "NodeSpec",
    "ObservedNode",
    "ObservedState",
    "SchedulerBackend",
    "SchedulerError",
    "parse_slots",
]
