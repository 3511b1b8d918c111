"""Refused calls made visible: each one is reported to observers, and logged without flooding.

A server refuses a call for a handful of reasons (`REFUSAL_REASONS`): no job token, a wrong one,
a request that does not parse, one larger than the server's limit, a call that ended before its
request arrived, and a servicer's own refusals (a bad argument, an unproven or wrong identity).
`GrpcServer` reports each one as a `Refusal` to its `RefusalObserver`s, among them always a
`RefusalLog`: a WARNING that names the reason, the method and the peer, at most once per reason
per interval, with a count of the refusals of that reason it did not log since its last line.
An embedder (the job master) adds observers of its own, a metric by reason for example.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol, runtime_checkable

import attrs

from dlrover.common.clock import Clock

__all__ = [
    "BAD_TOKEN",
    "INVALID_ARGUMENT",
    "MALFORMED",
    "MISSING_TOKEN",
    "NO_REQUEST",
    "PERMISSION_DENIED",
    "REFUSAL_REASONS",
    "TOO_LARGE",
    "UNAUTHENTICATED",
    "LogRateLimiter",
    "Refusal",
    "RefusalLog",
    "RefusalObserver",
    "report_refusal",
]

_log = logging.getLogger(__name__)
_MAX_DETAIL_CHARS = 500  # what the caller was told; a servicer's message may quote its request

MISSING_TOKEN = "missing_token"  # noqa: S105 (a reason's name, not a secret)
"""The call carried no `authorization` metadata."""
BAD_TOKEN = "bad_token"  # noqa: S105
"""The call carried a token, but not the job's (or not as `Bearer <token>`)."""
MALFORMED = "malformed"
"""The request's bytes do not parse as the method's request message."""
TOO_LARGE = "too_large"
"""The request is larger than the server's `max_message_bytes`."""
NO_REQUEST = "no_request"
"""The call ended before its request arrived: larger than gRPC's own backstop limit (twice
`max_message_bytes`), or the client went away mid-send."""
INVALID_ARGUMENT = "invalid_argument"
"""The request parsed, but a servicer refused a field of it (INVALID_ARGUMENT)."""
UNAUTHENTICATED = "unauthenticated"
"""A servicer refused the caller's identity (a wrong node credential: UNAUTHENTICATED)."""
PERMISSION_DENIED = "permission_denied"
"""A servicer refused an authenticated caller (a node speaking for another: PERMISSION_DENIED)."""

REFUSAL_REASONS = (
    MISSING_TOKEN,
    BAD_TOKEN,
    MALFORMED,
    TOO_LARGE,
    NO_REQUEST,
    INVALID_ARGUMENT,
    UNAUTHENTICATED,
    PERMISSION_DENIED,
)


@attrs.frozen
class Refusal:
    """One refused call.

    Attributes:
        reason: one of `REFUSAL_REASONS`.
        method: the full method name (`/package.Service/Method`).
        peer: the caller's address as gRPC gives it (`ipv4:127.0.0.1:51234`); empty when gRPC no
            longer knows it (a call it ended itself).
        detail: what the caller was told.
    """

    reason: str
    method: str
    peer: str
    detail: str


@runtime_checkable
class RefusalObserver(Protocol):
    """Told about every refused call; must be quick and thread-safe (it runs on serving threads)."""

    def refused(self, refusal: Refusal) -> None:
        """Account for one refused call."""
        ...


def report_refusal(observers: tuple[RefusalObserver, ...], refusal: Refusal) -> None:
    """Tell every observer; one that raises is logged and never fails the call or the others."""
    for observer in observers:
        try:
            observer.refused(refusal)
        except Exception:
            _log.exception("refusal observer %r failed on %r", observer, refusal)


class LogRateLimiter:
    """At most one line per key per `interval_s`; counts the lines it holds back. A pure core.

    Args:
        interval_s: the shortest time between two lines of one key (0 admits every line).

    Raises:
        ValueError: `interval_s` is negative.
    """

    def __init__(self, interval_s: float) -> None:
        if not interval_s >= 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s!r}")
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held_back: dict[str, int] = {}

    def admit(self, key: str, now: float) -> int | None:
        """Whether a line of `key` may be written at `now` (monotonic seconds).

        Returns:
            None: hold it back (it is counted). A number: write it, saying that this many lines
            of `key` were held back since the previous one written.
        """
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._held_back[key] = self._held_back.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held_back.pop(key, 0)

    def take_held_back(self) -> dict[str, int]:
        """Every key's count of lines held back since its last written one, cleared: for a last word."""
        held, self._held_back = self._held_back, {}
        return held


class RefusalLog:
    """A `RefusalObserver` that logs a WARNING per refused call, at most once per reason per interval.

    Args:
        logger: where the lines go.
        clock: the time source of the rate limit.
        interval_s: the shortest time between two lines of one reason (0 logs every refusal).
    """

    def __init__(self, logger: logging.Logger, clock: Clock, interval_s: float) -> None:
        self._logger = logger
        self._clock = clock
        self._interval_s = interval_s
        self._limiter = LogRateLimiter(interval_s)
        self._lock = threading.Lock()

    def flush(self) -> None:
        """Log how many refusals of each reason were held back since its last line (a server stopping
        calls this, so a burst that ended in silence is still counted in the log)."""
        with self._lock:
            held = self._limiter.take_held_back()
        for reason, count in sorted(held.items()):
            self._logger.warning(
                "%d more %s refusals since the last such line were not logged (at most one line per reason every %g s)",
                count,
                reason,
                self._interval_s,
            )

    def refused(self, refusal: Refusal) -> None:
        """Log `refusal` unless a line of its reason was written less than `interval_s` ago."""
        with self._lock:
            held_back = self._limiter.admit(refusal.reason, self._clock.now())
        if held_back is None:
            return
        more = (
            f" ({held_back} more {refusal.reason} refusals since the last such line were not logged;"
            f" at most one line per reason every {self._interval_s:g} s)"
            if held_back
            else ""
        )
        self._logger.warning(
            "refused a call to %s from %s: %s: %s%s",
            refusal.method,
            refusal.peer or "an unknown peer",
            refusal.reason,
            refusal.detail[:_MAX_DETAIL_CHARS],
            more,
        )
