"""Launches a backend failed for a passing reason, tried again with backoff before they count as a failure.

A backend that cannot start a node right now (the Kubernetes API server answering 503 through its own
retries while it restarts, a Ray cluster whose control store is away, a local fork refused for a moment)
raises a plain `SchedulerError`. Taking that for the node's failure would spend the rank's relaunches
within milliseconds, one per refused create, and stop a healthy job over a minute of API trouble; a
launch the platform refuses for good is `NodeRejectedError` and never comes here. So the master keeps
the node pending and launches it again after a bounded exponential backoff, up to `retries` more
times, and only then decides the launch failure as before (the node is lost, within its budgets).

While a launch failed moments ago (`LaunchRetrySettings.initial_s`), the backend is taken for away:
other launches are held back unsent (`hold_back`) instead of each spending the backend's own retries.

Pure: the master passes the times in, and this holds no lock (the master's own lock covers it). The
master journals each wait as a ``launch_retry`` event, and a master that restarts takes over the
waits of nodes still pending (`resume`).
"""

from __future__ import annotations

import argparse
import math

import attrs

from dlrover.common import ConfigError
from dlrover.master.backoff import Backoff

__all__ = ["LaunchRetries", "LaunchRetrySettings", "add_launch_retry_flags", "launch_retry_settings"]


@attrs.frozen
class LaunchRetrySettings:
    """How launches the backend failed are tried again.

    Attributes:
        retries: more launches after the first failed one; 0 decides the first failure at once.
        initial_s: the wait before the first retry; each further retry waits twice as long.
        max_s: the longest wait between two launches.
    """

    retries: int = 5
    initial_s: float = 2.0
    max_s: float = 30.0

    def __attrs_post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"launch retries must be a whole number >= 0, got {self.retries!r}")
        for name, value in (("initial_s", self.initial_s), ("max_s", self.max_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"launch retry {name} must be a positive number of seconds, got {value!r}")
        if self.max_s < self.initial_s:
            raise ConfigError(f"launch retry max_s ({self.max_s!r}) must be at least initial_s ({self.initial_s!r})")


def add_launch_retry_flags(parser: argparse.ArgumentParser) -> None:
    """The command-line flags of `LaunchRetrySettings` (`dlrover-master` and `dlrover-master ps-job`)."""
    defaults = LaunchRetrySettings()
    parser.add_argument(
        "--launch-retries",
        type=int,
        default=defaults.retries,
        help="a launch the backend failed for a passing reason (the API server away) is tried again this many "
        "times, the node pending and no budget charged, before it counts as the node's failure; 0: at once",
    )
    parser.add_argument(
        "--launch-retry-initial-s",
        type=float,
        default=defaults.initial_s,
        help="the wait before the first launch retry (doubling)",
    )
    parser.add_argument(
        "--launch-retry-max-s", type=float, default=defaults.max_s, help="the longest wait between launch retries"
    )


def launch_retry_settings(args: argparse.Namespace) -> LaunchRetrySettings:
    """The settings `add_launch_retry_flags` parsed.

    Raises:
        ConfigError: a value out of range, named.
    """
    return LaunchRetrySettings(
        retries=args.launch_retries, initial_s=args.launch_retry_initial_s, max_s=args.launch_retry_max_s
    )


@attrs.define
class _Waiting:
    backoff: Backoff
    due: float
    error: str = ""


class LaunchRetries:
    """The launches waiting to be tried again, by node id."""

    def __init__(self, settings: LaunchRetrySettings) -> None:
        self._settings = settings
        self._waiting: dict[int, _Waiting] = {}
        self._last_failure: tuple[float, str] | None = None  # when a launch last failed, and why

    def backend_away(self, now: float) -> str | None:
        """Why a launch should not be sent now: a launch failed less than `initial_s` ago (the reason
        names that failure's words), so a burst of launches (a job's start, a mass relaunch) waits for its
        retries instead of each spending the backend's own retries in turn; None: send it. Never
        with no retries (a failure is then decided at once, as it always was)."""
        if self._settings.retries == 0 or self._last_failure is None:
            return None
        at, error = self._last_failure
        if now - at >= self._settings.initial_s:
            return None
        return f"held back: another launch failed just before ({error})"

    def launched(self, node_id: int) -> None:
        """A launch went through: the node waits for nothing, and the backend is not taken for away."""
        self._waiting.pop(node_id, None)
        self._last_failure = None

    def resume(self, node_id: int, now: float, reason: str) -> float:
        """Take over the launch of a node a previous master was to send again (`reason`: its words): due
        after the initial wait, with its retries afresh, and the backend not taken for away. Returns the
        wait."""
        self._waiting[node_id] = _Waiting(self._backoff(), now + self._settings.initial_s, reason)
        return self._settings.initial_s

    def failed(self, node_id: int, now: float, error: str = "") -> float | None:
        """One more launch of the node failed (`error`: the backend's words): the seconds until it is
        tried again, or None when its retries are spent (it is forgotten; the caller decides the
        failure)."""
        self._last_failure = (now, error)
        waiting = self._waiting.setdefault(node_id, _Waiting(self._backoff(), now))
        if waiting.backoff.failures >= self._settings.retries:
            del self._waiting[node_id]
            return None
        delay = waiting.backoff.next_delay()
        waiting.due, waiting.error = now + delay, error
        return delay

    def hold_back(self, node_id: int, now: float, reason: str) -> float:
        """Keep the node's launch unsent while the backend is away (`backend_away` gave `reason`): it is
        due when that ends (now, if nothing failed) and counts as no failure. Returns the seconds it
        waits."""
        due = now if self._last_failure is None else self._last_failure[0] + self._settings.initial_s
        waiting = self._waiting.setdefault(node_id, _Waiting(self._backoff(), due))
        waiting.due, waiting.error = max(waiting.due, due), reason
        return max(waiting.due - now, 0.0)

    def _backoff(self) -> Backoff:
        return Backoff(self._settings.initial_s, self._settings.max_s)

    def failures(self, node_id: int) -> int:
        """How many launches of the node failed since it last waited for none (0: none failed; it may
        still be held back or resumed, see `__contains__`)."""
        waiting = self._waiting.get(node_id)
        return 0 if waiting is None else waiting.backoff.failures

    def due(self, now: float) -> list[int]:
        """The nodes whose wait is over, earliest first; each stays until `failed`, `launched` or
        `forget` (a launch that is not tried again must be forgotten, or it is due at every call). The
        master builds each launch afresh (`JobLifecycle.launch_of`): the hosts avoided may have changed."""
        ready = [(w.due, node_id) for node_id, w in self._waiting.items() if w.due <= now]
        return [node_id for _, node_id in sorted(ready)]

    def reasons(self) -> dict[int, str]:
        """Why each waiting node is still pending, by node id (for the pending announcement)."""
        return {
            node_id: (
                f"its launch failed {w.backoff.failures} time(s) and is tried again: {w.error}"
                if w.backoff.failures
                else f"its launch waits: {w.error}"
            )
            for node_id, w in self._waiting.items()
        }

    def forget(self, node_id: int) -> None:
        """The node was launched, stopped or decided otherwise: it waits for nothing (idempotent)."""
        self._waiting.pop(node_id, None)

    def __contains__(self, node_id: object) -> bool:
        """Whether the node waits to be launched (again)."""
        return node_id in self._waiting
