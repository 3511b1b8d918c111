"""Time series of one metric of one node, validated where they enter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dlrover.autoscale._validate import check_metric

__all__ = ["validate_series", "window", "as_series"]


def as_series(items: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """attrs converter: any iterable of (time_s, value) pairs as a tuple."""
    return tuple(items)


def validate_series(name: str, samples: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Check each (time_s, value) pair and return them sorted by time.

    Raises:
        InvalidMetricError: if a time or value is missing, NaN or negative.
    """
    out = []
    for i, pair in enumerate(samples):
        t, v = pair
        out.append((check_metric(f"{name}[{i}] time_s", t), check_metric(f"{name}[{i}] value", v)))
    return tuple(sorted(out))


def window(samples: Sequence[tuple[float, float]], now_s: float, length_s: float) -> list[float] | None:
    """The values in [now_s - length_s, now_s], or None when the series does not cover the whole window.

    Covering means a sample at or before the window's start: without one we cannot say a condition held for the
    whole window, only that it held since we started looking.
    """
    start = now_s - length_s
    if not samples or samples[0][0] > start:
        return None
    # The last sample at or before the start stands for the state at the start.
    before = [v for t, v in samples if t <= start]
    inside = [v for t, v in samples if start < t <= now_s]
    return [before[-1], *inside]
