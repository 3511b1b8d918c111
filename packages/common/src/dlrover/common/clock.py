"""Injectable time: every core takes a `Clock` (or a `now` argument) instead of reading time itself."""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of time.

    `now()` is monotonic and is what timeouts and intervals are measured with; `wall_time()` is
    seconds since the epoch, used only for what people read (event logs, status).
    """

    def now(self) -> float:
        """Monotonic seconds; only differences between two readings mean anything."""
        ...

    def wall_time(self) -> float:
        """Seconds since the Unix epoch."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for `seconds` of this clock's time."""
        ...


class SystemClock:
    """The real clock: `time.monotonic`, `time.time` and `time.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    def wall_time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to, for deterministic tests.

    `sleep` advances the clock instead of blocking, so code that sleeps between retries runs
    instantly under test and the total time it waited can be read back from `now()`.

    Args:
        start: the initial monotonic reading.
        wall_start: the wall-clock reading that corresponds to `start`.
    """

    def __init__(self, start: float = 0.0, wall_start: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now = float(start)
        self._wall_offset = float(wall_start) - float(start)

    def now(self) -> float:
        with self._lock:
            return self._now

    def wall_time(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)

    def advance(self, seconds: float) -> float:
        """Move the clock forward and return the new reading.

        Raises:
            ValueError: if `seconds` is negative; a monotonic clock never goes back.
        """
        if seconds < 0:
            raise ValueError(f"a clock cannot move backwards: advance({seconds!r})")
        with self._lock:
            self._now += seconds
            return self._now
