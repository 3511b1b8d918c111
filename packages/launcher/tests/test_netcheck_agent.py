"""The network check against an unreachable master, other nodes' settings, and the master's actions.

No probe process runs here: the store tests end before any probe starts (a settings mismatch, a
store that never answers), and the agent tests script the check itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import pytest

from dlrover.common import ConfigError, DLRoverError, ManualClock
from dlrover.diagnosis import ActionKind
from dlrover.launcher.agent import Agent, AgentConfig, AgentResult
from dlrover.launcher.control import RoundAssignment
from dlrover.launcher.fake_control import FakeControlPlane
from dlrover.launcher.netcheck import (
    InMemoryRoundStore,
    NetworkCheck,
    NetworkCheckConfig,
    NetworkCheckSettingsMismatch,
    NetworkCheckStopped,
    NetworkCheckStoreLost,
)
from dlrover.launcher.netcheck_plan import CheckAction, CheckOutcome, settings_key

_OTHER = NetworkCheckConfig(straggler_factor=3.0).settings()


class _DownStore(InMemoryRoundStore):
    """A store that fails its first `failures` calls (None: every call) as if the master were away."""

    def __init__(self, failures: int | None) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    def _down(self) -> None:
        self.calls += 1
        if self.failures is None or self.failures > 0:
            if self.failures is not None:
                self.failures -= 1
            raise DLRoverError("the master is unreachable (scripted)")

    def kv_get(self, keys: Sequence[str]) -> list[bytes | None]:
        self._down()
        return super().kv_get(keys)

    def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        self._down()
        return super().kv_compare_set(key, expected, desired)


def _check(store: InMemoryRoundStore, clock: ManualClock) -> NetworkCheck:
    return NetworkCheck(NetworkCheckConfig(), store, local_addr="127.0.0.1", clock=clock, python="/nonexistent")


def test_the_check_outlasts_a_short_master_outage() -> None:
    # Ten failures in a row: more than any fixed small retry count, well within the bound.
    store = _DownStore(failures=10)
    InMemoryRoundStore.kv_compare_set(store, settings_key(3), b"", _OTHER)
    clock = ManualClock()
    beats: list[float] = []
    with pytest.raises(NetworkCheckSettingsMismatch):
        _check(store, clock).run(
            RoundAssignment(3, 0, 2, "127.0.0.1", 1), keepalive=lambda: beats.append(clock.now()), store_retry_s=60.0
        )
    assert store.failures == 0
    assert beats, "the agent was not kept alive while the store was retried"


def test_the_check_gives_up_on_a_lost_master_after_the_bound_with_a_reason() -> None:
    store = _DownStore(failures=None)
    clock = ManualClock()
    with pytest.raises(NetworkCheckStoreLost, match=r"giving up after 45 s without the master"):
        _check(store, clock).run(RoundAssignment(3, 0, 2, "127.0.0.1", 1), store_retry_s=45.0)
    assert clock.now() >= 45.0
    assert store.calls > 2


def test_a_stop_ends_the_retries() -> None:
    with pytest.raises(NetworkCheckStopped):
        _check(_DownStore(failures=None), ManualClock()).run(
            RoundAssignment(3, 0, 2, "127.0.0.1", 1), should_stop=lambda: True
        )


def test_a_bad_retry_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match="store_retry_s"):
        _check(InMemoryRoundStore(), ManualClock()).run(RoundAssignment(3, 0, 1, "127.0.0.1", 1), store_retry_s=-1.0)


def test_a_node_with_other_settings_refuses_naming_both() -> None:
    store = InMemoryRoundStore()
    # What the round's first node, run with --straggler-factor 3, published.
    store.kv_compare_set(settings_key(4), b"", _OTHER)
    with pytest.raises(NetworkCheckSettingsMismatch) as caught:
        _check(store, ManualClock()).run(RoundAssignment(4, 1, 2, "127.0.0.1", 1))
    assert '"straggler_factor": 3.0' in str(caught.value)
    assert '"straggler_factor": 2.0' in str(caught.value)
    assert "--straggler-factor" in str(caught.value)


def test_a_nodes_keys_are_deleted_at_its_next_check() -> None:
    store = InMemoryRoundStore()
    check = _check(store, ManualClock())
    for round_number in (5, 6):
        store.kv_compare_set(settings_key(round_number), b"", _OTHER)
        with pytest.raises(NetworkCheckSettingsMismatch):
            check.run(RoundAssignment(round_number, 0, 2, "127.0.0.1", 1))
    # Round 5's key went when round 6's check began; round 6's waits for the next one.
    assert store.keys() == [settings_key(6)]


# -- the agent ---------------------------------------------------------------------------------------


class _ScriptedCheck(NetworkCheck):
    """A check that heartbeats until told to stop or until `beats` heartbeats, then answers `outcome`.

    Args:
        control: the fake master (its heartbeat count tells the check that a heartbeat went out).
        outcomes: one outcome per run, or an exception to raise; the last repeats.
        beats: heartbeats to wait for before answering.
    """

    def __init__(
        self, control: FakeControlPlane, outcomes: Sequence[CheckOutcome | DLRoverError], beats: int = 2
    ) -> None:
        super().__init__(NetworkCheckConfig(), control, local_addr="127.0.0.1")
        self._fake = control
        self._outcomes = list(outcomes)
        self._beats = beats
        self.retry_bounds: list[float | None] = []
        self.node_ids: list[str] = []

    def run(
        self,
        assignment: RoundAssignment,
        *,
        should_stop: Callable[[], bool] = lambda: False,
        keepalive: Callable[[], None] = lambda: None,
        store_retry_s: float | None = None,
        node_id: str = "",
    ) -> CheckOutcome:
        self.retry_bounds.append(store_retry_s)
        self.node_ids.append(node_id)
        target = len(self._fake.heartbeats) + self._beats
        for _ in range(100_000):
            if should_stop():
                raise NetworkCheckStopped("stopped during the network check")
            if len(self._fake.heartbeats) >= target:
                break
            keepalive()
        else:
            raise AssertionError("the agent never heartbeat during the check")
        outcome = self._outcomes.pop(0) if len(self._outcomes) > 1 else self._outcomes[0]
        if isinstance(outcome, DLRoverError):
            raise outcome
        return outcome


TRAIN = CheckOutcome(CheckAction.TRAIN, "network check of round 1 passed on all 2 nodes")
LEAVE = CheckOutcome(CheckAction.EXCLUDE_SELF, "node rank 0 is faulty", "node rank 0 is faulty\npair 0-1: failed")


def _agent(control: FakeControlPlane, check: NetworkCheck) -> AgentResult:
    config = AgentConfig(
        worker_argv=(sys.executable, "-c", "pass"),
        monitor_interval_s=0.01,
        host_checkpoint_saver=False,
        master_lost_timeout_s=30.0,
    )
    return Agent(config, control, clock=_TickingClock(), network_check=check).run()


class _TickingClock(ManualClock):
    """Time moves a second per reading, so every heartbeat interval has passed at each look."""

    def now(self) -> float:
        self.advance(1.0)
        return super().now()


def test_a_restart_asked_during_the_check_starts_a_new_round_without_workers() -> None:
    control = FakeControlPlane(actions=[[(ActionKind.RESTART_PROCESSES, "membership changed")]])
    check = _ScriptedCheck(control, [TRAIN])
    result = _agent(control, check)
    assert result.exit_code == 0, result.reason
    assert len(control.rounds) == 2, "the restart was lost: the workers of the first round ran"
    assert len(check.retry_bounds) == 2
    # The check learns the node's id, so the same nodes can skip the probes after passing together.
    assert check.node_ids == ["node-0"] * 2  # FakeControlPlane registers "node-0"


def test_a_stop_asked_during_the_check_exits_with_the_stops_code() -> None:
    control = FakeControlPlane(actions=[[(ActionKind.REMOVE_NODE, "job cancelled")]])
    result = _agent(control, _ScriptedCheck(control, [TRAIN], beats=100))
    assert result.exit_code == 1
    assert "the master removed this node from the job: job cancelled" in result.reason
    assert len(control.rounds) == 1


def test_a_lost_master_during_the_check_ends_the_agent_with_a_reason_after_its_bound() -> None:
    control = FakeControlPlane()
    check = _ScriptedCheck(control, [NetworkCheckStoreLost("giving up after 30 s without the master")])
    result = _agent(control, check)
    assert result.exit_code == 1
    assert "gave up: giving up after 30 s without the master" in result.reason
    # The agent lends the check its own bound on a lost master.
    assert check.retry_bounds == [30.0]


def test_a_node_left_out_reports_itself_through_a_short_master_outage() -> None:
    control = FakeControlPlane(unreachable_reports=1)
    result = _agent(control, _ScriptedCheck(control, [LEAVE]))
    assert result.exit_code == 1
    assert "reported to the master" in result.reason
    assert len(control.failures) == 1
    assert control.failures[0].network_check


def test_other_settings_are_a_configuration_error_reported_to_the_master() -> None:
    control = FakeControlPlane()
    result = _agent(control, _ScriptedCheck(control, [NetworkCheckSettingsMismatch("settings differ")]))
    assert result.exit_code == 2
    assert result.reason.startswith("configuration error: settings differ; reported to the master")
    assert len(control.failures) == 1
    assert "configuration error" in control.failures[0].evidence
