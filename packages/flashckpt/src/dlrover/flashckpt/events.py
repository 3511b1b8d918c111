"""Events: what happened and why, kept for status and tests and logged as it happens."""

from __future__ import annotations

import logging
import threading

import attrs

__all__ = ["EventLog", "FlashEvent"]

_log = logging.getLogger("dlrover.flashckpt")


@attrs.frozen
class FlashEvent:
    """One notable thing: a skipped or delayed snapshot, a re-layout, a persist, a fallback.

    Attributes:
        kind: a short machine-readable name (``save_skipped``, ``relayout``, ``persisted``...).
        step: the training step concerned (-1 when none).
        reason: a sentence saying why.
        wall_time: when, in seconds since the epoch.
    """

    kind: str
    step: int
    reason: str
    wall_time: float


class EventLog:
    """A thread-safe, bounded list of events; each is also logged (warnings for failures)."""

    WARN_KINDS = frozenset(
        {
            "save_skipped",
            "persist_failed",
            "checksum_mismatch",
            "fallback",
            "load_failed",
            "restored_not_persisted",
            "pin_failed",
            "keep_released",
        }
    )

    def __init__(self, limit: int = 1000) -> None:
        self._lock = threading.Lock()
        self._events: list[FlashEvent] = []
        self._limit = limit

    def record(self, event: FlashEvent) -> None:
        """Keep `event` (dropping the oldest beyond the limit) and log it."""
        level = logging.WARNING if event.kind in self.WARN_KINDS else logging.INFO
        _log.log(level, "flashckpt %s step=%d: %s", event.kind, event.step, event.reason)
        with self._lock:
            self._events.append(event)
            del self._events[: -self._limit]

    def snapshot(self) -> list[FlashEvent]:
        """A copy of the events kept, oldest first."""
        with self._lock:
            return list(self._events)

    def kinds(self) -> list[str]:
        """The kinds of the events kept, oldest first."""
        with self._lock:
            return [e.kind for e in self._events]
