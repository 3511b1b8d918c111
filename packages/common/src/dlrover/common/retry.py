"""Deadlines and bounded retries for client calls.

Only idempotent calls are retried: a call that may have reached the server and changed its state
runs once, and its failure is the caller's to handle. Retries are bounded both by a number of
attempts and by a total time, and back off exponentially with jitter.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import grpc

from dlrover.common.clock import Clock, SystemClock
from dlrover.common.errors import ConfigError, DLRoverError
from dlrover.common.validators import positive

__all__ = [
    "MASTER_LOST_TIMEOUT_ENV_VAR",
    "RETRYABLE_CODES",
    "RetryPolicy",
    "RpcError",
    "call_unary",
    "master_retry_policy",
]

_Resp = TypeVar("_Resp")

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

MASTER_LOST_TIMEOUT_ENV_VAR = "DLROVER_MASTER_LOST_TIMEOUT_S"
"""Seconds a node keeps training while its master cannot be reached; the agent sets it for its workers."""


@attrs.frozen
class RetryPolicy:
    """Deadline and retry settings for one kind of call.

    Attributes:
        call_timeout_s: deadline of a single attempt.
        total_timeout_s: no attempt starts after this much time, and none runs past it.
        max_attempts: attempts in all, the first included; None bounds them by time alone.
        initial_backoff_s: wait before the second attempt.
        max_backoff_s: the longest wait between two attempts.
        backoff_multiplier: growth of the wait after each failed attempt.
        retryable_codes: status codes after which an idempotent call is tried again.
    """

    call_timeout_s: float = attrs.field(default=5.0, validator=positive)
    total_timeout_s: float = attrs.field(default=30.0, validator=positive)
    max_attempts: int | None = attrs.field(default=5, validator=attrs.validators.optional(positive))  # type: ignore[arg-type]
    initial_backoff_s: float = attrs.field(default=0.05, validator=positive)
    max_backoff_s: float = attrs.field(default=2.0, validator=positive)
    backoff_multiplier: float = attrs.field(default=2.0, validator=attrs.validators.ge(1.0))
    retryable_codes: frozenset[grpc.StatusCode] = RETRYABLE_CODES

    def backoff_s(self, failed_attempts: int, rng: random.Random) -> float:
        """Wait before the next attempt after `failed_attempts` failures ("full jitter")."""
        ceiling = min(
            self.max_backoff_s,
            self.initial_backoff_s * self.backoff_multiplier ** max(failed_attempts - 1, 0),
        )
        return rng.uniform(0.0, ceiling)


def master_retry_policy(base: RetryPolicy | None = None, env: Mapping[str, str] | None = None) -> RetryPolicy:
    """The retry policy of a training process's calls to its job's master.

    Under `dlrover-run` the agent names how long its node keeps training while the master is
    unreachable (``DLROVER_MASTER_LOST_TIMEOUT_S``, from ``--master-lost-timeout``): a call then
    keeps retrying an unreachable master that long, with no limit on the number of attempts, so a
    master restart delays a step instead of failing it. Elsewhere the policy is `base` unchanged.

    Args:
        base: per-attempt deadline and back-off to keep (default `RetryPolicy()`).
        env: the environment to read (default `os.environ`).

    Raises:
        ConfigError: the variable is set but is not a non-negative number of seconds.
    """
    policy = base or RetryPolicy()
    raw = (os.environ if env is None else env).get(MASTER_LOST_TIMEOUT_ENV_VAR, "").strip()
    if not raw:
        return policy
    try:
        wait_s = float(raw)
    except ValueError:
        wait_s = -1.0
    if not math.isfinite(wait_s) or wait_s < 0:
        raise ConfigError(f"{MASTER_LOST_TIMEOUT_ENV_VAR} must be a non-negative number of seconds, got {raw!r}")
    if wait_s <= policy.total_timeout_s:
        return policy
    return attrs.evolve(policy, total_timeout_s=wait_s, max_attempts=None)


class RpcError(DLRoverError):
    """A call failed for good: its last status, and how many attempts were made.

    Attributes:
        method: the RPC's name, for messages.
        code: the last gRPC status code.
        details: the server's (or the transport's) message.
        attempts: how many attempts were made.
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str, attempts: int) -> None:
        super().__init__(f"{method} failed with {code.name} after {attempts} attempt(s): {details}")
        self.method = method
        self.code = code
        self.details = details
        self.attempts = attempts


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    return code, details or ""


def call_unary(
    method: Callable[..., _Resp],
    request: Any,
    *,
    idempotent: bool,
    policy: RetryPolicy,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    name: str | None = None,
) -> _Resp:
    """Call a unary-unary stub method with deadlines, retrying only if `idempotent`.

    Args:
        method: a stub method such as `stub.Fetch`.
        request: the request message.
        idempotent: whether repeating the call is harmless; only then is it retried.
        policy: deadlines and retry bounds.
        clock: time source for the total bound and for sleeping between attempts.
        rng: jitter source (seed it for reproducible tests).
        name: the RPC's name in error messages.

    Raises:
        RpcError: the call failed with a non-retryable status, or retries ran out.
    """
    clk = clock or SystemClock()
    # Seeding a Random reads the OS entropy pool (tens of microseconds): only a retry needs one.
    jitter = rng
    label = name or getattr(method, "_method", None) or getattr(method, "__name__", "rpc")
    if isinstance(label, bytes):
        label = label.decode("utf-8", "replace")
    give_up_at = clk.now() + policy.total_timeout_s
    attempts = 0
    while True:
        attempts += 1
        remaining = give_up_at - clk.now()
        try:
            return method(request, timeout=max(min(policy.call_timeout_s, remaining), 0.001))
        except grpc.RpcError as exc:
            code, details = _status(exc)
            last = RpcError(str(label), code, details, attempts)
            out_of_attempts = policy.max_attempts is not None and attempts >= policy.max_attempts
            if not idempotent or code not in policy.retryable_codes or out_of_attempts:
                raise last from exc
            if jitter is None:
                jitter = random.Random()
            wait = policy.backoff_s(attempts, jitter)
            if clk.now() + wait >= give_up_at:
                raise last from exc
            clk.sleep(wait)
