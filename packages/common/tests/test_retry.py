from __future__ import annotations

import random
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError, ManualClock, RetryPolicy, RpcError, call_unary


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code.name)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"fake {self._code.name}"


class FlakyMethod:
    """A stub method that fails with the given codes, then answers."""

    def __init__(self, clock: ManualClock, failures: list[grpc.StatusCode], cost_s: float = 0.0) -> None:
        self.clock = clock
        self.failures = list(failures)
        self.cost_s = cost_s
        self.timeouts: list[float] = []

    def __call__(self, request: Any, timeout: float) -> str:
        self.timeouts.append(timeout)
        self.clock.advance(self.cost_s)
        if self.failures:
            raise FakeRpcError(self.failures.pop(0))
        return f"reply to {request}"


POLICY = RetryPolicy(call_timeout_s=1.0, total_timeout_s=10.0, max_attempts=4, initial_backoff_s=0.1)


def test_idempotent_call_retries_transient_failures() -> None:
    clock = ManualClock()
    method = FlakyMethod(clock, [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
    result = call_unary(method, "r", idempotent=True, policy=POLICY, clock=clock, rng=random.Random(0))
    assert result == "reply to r"
    assert len(method.timeouts) == 3


def test_non_idempotent_call_runs_once() -> None:
    clock = ManualClock()
    method = FlakyMethod(clock, [grpc.StatusCode.UNAVAILABLE])
    with pytest.raises(RpcError) as info:
        call_unary(method, "r", idempotent=False, policy=POLICY, clock=clock, name="Done")
    assert info.value.attempts == 1
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert "Done" in str(info.value)


def test_non_retryable_status_is_not_retried() -> None:
    clock = ManualClock()
    method = FlakyMethod(clock, [grpc.StatusCode.INVALID_ARGUMENT])
    with pytest.raises(RpcError) as info:
        call_unary(method, "r", idempotent=True, policy=POLICY, clock=clock)
    assert info.value.attempts == 1
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_attempts_are_bounded() -> None:
    clock = ManualClock()
    method = FlakyMethod(clock, [grpc.StatusCode.UNAVAILABLE] * 10)
    with pytest.raises(RpcError) as info:
        call_unary(method, "r", idempotent=True, policy=POLICY, clock=clock)
    assert info.value.attempts == POLICY.max_attempts


def test_total_time_is_bounded() -> None:
    clock = ManualClock()
    policy = RetryPolicy(call_timeout_s=3.0, total_timeout_s=5.0, max_attempts=100, initial_backoff_s=0.5)
    method = FlakyMethod(clock, [grpc.StatusCode.DEADLINE_EXCEEDED] * 100, cost_s=3.0)
    with pytest.raises(RpcError):
        call_unary(method, "r", idempotent=True, policy=policy, clock=clock)
    # No attempt's deadline reaches past the total bound.
    assert clock.now() <= policy.total_timeout_s + policy.call_timeout_s
    assert all(t <= policy.call_timeout_s for t in method.timeouts)
    assert method.timeouts[-1] <= policy.total_timeout_s


@given(
    failures=st.integers(min_value=1, max_value=50),
    initial=st.floats(min_value=0.001, max_value=1.0),
    ceiling=st.floats(min_value=0.001, max_value=5.0),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_stays_within_bounds(failures: int, initial: float, ceiling: float, seed: int) -> None:
    policy = RetryPolicy(initial_backoff_s=initial, max_backoff_s=ceiling)
    wait = policy.backoff_s(failures, random.Random(seed))
    assert 0.0 <= wait <= ceiling


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ConfigError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigError, match="call_timeout_s"):
        RetryPolicy(call_timeout_s=-1)


def test_the_master_policy_waits_as_long_as_the_agent_and_counts_no_attempts() -> None:
    from dlrover.common import MASTER_LOST_TIMEOUT_ENV_VAR, master_retry_policy

    assert master_retry_policy(POLICY, env={}) == POLICY
    waiting = master_retry_policy(POLICY, env={MASTER_LOST_TIMEOUT_ENV_VAR: "300"})
    assert (waiting.total_timeout_s, waiting.max_attempts, waiting.call_timeout_s) == (300.0, None, 1.0)
    # An agent that waits less than the policy already does changes nothing.
    assert master_retry_policy(POLICY, env={MASTER_LOST_TIMEOUT_ENV_VAR: "0"}) == POLICY
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ConfigError, match=MASTER_LOST_TIMEOUT_ENV_VAR):
            master_retry_policy(POLICY, env={MASTER_LOST_TIMEOUT_ENV_VAR: bad})

    # A master away for a minute: far more attempts than any count would allow, then the answer.
    clock = ManualClock()
    method = FlakyMethod(clock, [grpc.StatusCode.UNAVAILABLE] * 200, cost_s=0.3)
    assert call_unary(method, "r", idempotent=True, policy=waiting, clock=clock, rng=random.Random(1)) == "reply to r"
    assert len(method.timeouts) == 201
    # ... and a master that never comes back is given up on at the agent's limit.
    clock = ManualClock()
    method = FlakyMethod(clock, [grpc.StatusCode.UNAVAILABLE] * 100_000, cost_s=0.3)
    with pytest.raises(RpcError):
        call_unary(method, "r", idempotent=True, policy=waiting, clock=clock, rng=random.Random(1))
    assert clock.now() <= 300.0 + 1.0
