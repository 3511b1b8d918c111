"""Scheduler backends: one Protocol, a fake, the local and the external backend."""

from dlrover.master.scheduler.base import (
    REASON_DEADLINE_EXCEEDED,
    REASON_DELETED,
    REASON_EVICTED,
    REASON_NODE_LOST,
    REASON_OOM_KILLED,
    REASON_PREEMPTED,
    REASON_UNSCHEDULABLE,
    AdjustableCapacity,
    MemoryRecord,
    NodeMemoryRecords,
    NodePlacement,
    NodeShapeLimit,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerBackend,
    SchedulerError,
    check_node_fits,
)
from dlrover.master.scheduler.cgroups import (
    CgroupMemoryGroups,
    FakeMemoryGroups,
    MemoryGroup,
    MemoryGroups,
    UnavailableMemoryGroups,
    detect_memory_groups,
)
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.scheduler.local import LocalScheduler, parse_slots

__all__ = [
    "REASON_DEADLINE_EXCEEDED",
    "REASON_DELETED",
    "REASON_EVICTED",
    "REASON_NODE_LOST",
    "REASON_OOM_KILLED",
    "REASON_PREEMPTED",
    "REASON_UNSCHEDULABLE",
    "CgroupMemoryGroups",
    "AdjustableCapacity",
    "ExternalScheduler",
    "FakeMemoryGroups",
    "FakeScheduler",
    "LocalScheduler",
    "MemoryGroup",
    "MemoryGroups",
    "MemoryRecord",
    "NodeMemoryRecords",
    "NodePlacement",
    "NodeShapeLimit",
    "NodeSpec",
    "ObservedNode",
    "ObservedState",
    "SchedulerBackend",
    "SchedulerError",
    "UnavailableMemoryGroups",
    "check_node_fits",
    "detect_memory_groups",
    "parse_slots",
]
