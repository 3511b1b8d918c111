"""The launch retry schedule (`dlrover.master.launch_retry`), against a model."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dlrover.master.launch_retry import LaunchRetries, LaunchRetrySettings

pytestmark = pytest.mark.timeout(120)

NODES = st.integers(min_value=0, max_value=3)


def test_waits_double_up_to_the_cap_and_the_retries_end() -> None:
    retries = LaunchRetries(LaunchRetrySettings(retries=4, initial_s=1.0, max_s=5.0))
    delays = [retries.failed(7, now=0.0, error="503") for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, None]
    assert 7 not in retries  # spent: forgotten, the caller decides the failure
    assert retries.failed(7, now=0.0) == 1.0  # a later launch of it starts afresh


def test_a_launch_held_back_while_the_backend_is_away_spends_no_retry() -> None:
    retries = LaunchRetries(LaunchRetrySettings(retries=3, initial_s=2.0, max_s=8.0))
    assert retries.backend_away(0.0) is None
    retries.failed(0, now=10.0, error="503")
    reason = retries.backend_away(10.5)
    assert reason == "held back: another launch failed just before (503)"
    assert retries.hold_back(1, 10.5, reason) == 1.5
    assert retries.failures(1) == 0
    assert retries.reasons()[1] == f"its launch waits: {reason}"
    assert retries.due(12.0) == [0, 1]
    assert retries.backend_away(12.0) is None
    assert LaunchRetries(LaunchRetrySettings(retries=0)).backend_away(0.0) is None
    retries.launched(0)  # a launch went through: the backend is back
    assert retries.backend_away(10.5) is None
    assert 0 not in retries


def test_a_resumed_wait_is_due_after_the_initial_wait_with_its_retries_afresh() -> None:
    retries = LaunchRetries(LaunchRetrySettings(retries=3, initial_s=2.0, max_s=8.0))
    assert retries.resume(4, now=100.0, reason="503 before the restart") == 2.0
    assert retries.backend_away(100.0) is None  # an old error holds nothing back
    assert retries.due(101.9) == []
    assert retries.due(102.0) == [4]
    assert retries.failures(4) == 0
    assert [retries.failed(4, 102.0, "503") for _ in range(4)] == [2.0, 4.0, 8.0, None]


def test_due_launches_come_earliest_first_and_stay_until_decided() -> None:
    retries = LaunchRetries(LaunchRetrySettings(retries=3, initial_s=2.0, max_s=8.0))
    retries.failed(1, now=1.0, error="a")
    retries.failed(0, now=0.5, error="b")
    assert retries.due(2.4) == []
    assert retries.due(3.0) == [0, 1]
    assert retries.due(3.0) == [0, 1]  # not consumed by asking
    assert retries.reasons() == {
        0: "its launch failed 1 time(s) and is tried again: b",
        1: "its launch failed 1 time(s) and is tried again: a",
    }
    retries.forget(0)
    retries.forget(0)  # idempotent
    assert retries.due(3.0) == [1]


class LaunchRetryMachine(RuleBasedStateMachine):
    """Any order of failed launches, forgotten nodes and time: a node is due only once its wait is
    over, waits never shrink and never pass the cap, and exactly `retries` failures are retried."""

    SETTINGS = LaunchRetrySettings(retries=3, initial_s=1.0, max_s=3.0)

    def __init__(self) -> None:
        super().__init__()
        self.retries = LaunchRetries(self.SETTINGS)
        self.now = 0.0
        self.model: dict[int, tuple[int, float, float]] = {}  # node -> (retries granted, last delay, due)
        self.last_failure: float | None = None

    @rule(node=NODES)
    def launch_failed(self, node: int) -> None:
        granted, last, _ = self.model.get(node, (0, 0.0, 0.0))
        delay = self.retries.failed(node, self.now, error="refused")
        self.last_failure = self.now
        if granted == self.SETTINGS.retries:
            assert delay is None
            self.model.pop(node, None)
            return
        assert delay is not None
        assert last <= delay <= self.SETTINGS.max_s
        self.model[node] = (granted + 1, delay, self.now + delay)

    @precondition(lambda self: self.retries.backend_away(self.now) is not None)
    @rule(node=NODES)
    def launch_held_back(self, node: int) -> None:
        assert self.last_failure is not None
        reason = self.retries.backend_away(self.now)
        assert reason is not None
        wait = self.retries.hold_back(node, self.now, reason)
        granted, last, due = self.model.get(node, (0, 0.0, 0.0))
        due = max(due, self.last_failure + self.SETTINGS.initial_s)
        assert wait == pytest.approx(max(due - self.now, 0.0))
        self.model[node] = (granted, last, due)  # held back: no retry spent

    @rule(node=NODES)
    def forget(self, node: int) -> None:
        self.retries.forget(node)
        self.model.pop(node, None)

    @rule(seconds=st.floats(min_value=0.0, max_value=4.0, allow_nan=False))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def the_backend_is_away_for_the_initial_wait_after_a_failure(self) -> None:
        away = self.last_failure is not None and self.now - self.last_failure < self.SETTINGS.initial_s
        assert (self.retries.backend_away(self.now) is not None) == away

    @invariant()
    def due_is_what_the_model_says(self) -> None:
        expected = sorted((due, node) for node, (_, _, due) in self.model.items() if due <= self.now)
        assert self.retries.due(self.now) == [node for _, node in expected]
        assert {node for node in range(4) if node in self.retries} == set(self.model)
        for node, (granted, _, _) in self.model.items():
            assert self.retries.failures(node) == granted


TestLaunchRetryMachine = LaunchRetryMachine.TestCase
TestLaunchRetryMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
