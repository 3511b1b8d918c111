"""Times as the Kubernetes API server writes them (RFC 3339, e.g. ``2026-01-01T00:00:00Z``)."""

from __future__ import annotations

import datetime

__all__ = ["epoch_seconds"]


def epoch_seconds(stamp: object) -> float | None:
    """An RFC 3339 time as epoch seconds (a time without an offset is UTC); None when absent or not one."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        when = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()
