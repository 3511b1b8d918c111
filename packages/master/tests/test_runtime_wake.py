"""A backend that reports its changes has the master observe them at once, not at its next tick."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from dlrover.common import ConfigError, ManualClock
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.factory import create_master
from dlrover.master.scheduler import ObservedState, ReportsChanges
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import NodeState

pytestmark = pytest.mark.integration


class ChangeReportingScheduler(FakeScheduler):
    """The fake cluster, telling its listeners after each change (as the Kubernetes backend's watch does)."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self.listeners.append(listener)

    def change(self, node_id: int, state: ObservedState) -> None:
        self.set_state(node_id, state)
        for listener in self.listeners:
            listener()


def _config(tick_interval_s: float) -> MasterConfig:
    return MasterConfig(
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), node_start_timeout_s=None),
        tick_interval_s=tick_interval_s,
    )


def _wait(predicate: Callable[[], bool], checks: int = 1200) -> bool:
    """Check `predicate` every 50 ms, `checks` times (a minute): far less than the hour between ticks."""
    pause = threading.Event()
    for _ in range(checks):
        if predicate():
            return True
        pause.wait(0.05)
    return predicate()


def test_a_reported_change_is_observed_long_before_the_next_tick() -> None:
    scheduler = ChangeReportingScheduler()
    assert isinstance(scheduler, ReportsChanges)
    # An hour between ticks: only the wake-up can have the master see the node run within the wait.
    runtime = create_master(_config(3600.0), scheduler=scheduler, clock=ManualClock())
    runtime.start()
    try:
        assert scheduler.listeners, "the runtime did not subscribe to the backend's changes"
        (node_id,) = scheduler.specs
        assert runtime.master.node(node_id).state is NodeState.PENDING
        scheduler.change(node_id, ObservedState.RUNNING)
        assert _wait(lambda: runtime.master.node(node_id).state is NodeState.STARTING), runtime.master.node(node_id)
    finally:
        runtime.stop()


def test_a_negative_tick_gap_is_refused() -> None:
    with pytest.raises(ConfigError, match="min_tick_gap_s"):
        MasterConfig(min_tick_gap_s=-1.0)
