"""How long a failure counts against a budget.

A job that trains for weeks on thousands of nodes meets a failure every few hours (Llama 3 405B:
419 in 54 days on 16,384 GPUs). Budgets counted over the job's whole life stop such a job for two
failures weeks apart that have nothing to do with each other; budgets counted over a trailing
window still stop a job that fails again and again, which is what a budget is for.

A budget keeps the times of its uses (wall seconds, so they mean the same after a master restart).
A use whose time is unknown (``None``: taken before the budget kept times, read from an older
journal) counts for ever. Only the newest uses can matter against a limit, so a budget keeps no
more of them than its limit asks (`BudgetWindow.add`): its size never grows with the job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from dlrover.common import ConfigError

__all__ = ["BudgetWindow", "UseTimes", "use_times_from_json"]

UseTimes = tuple["float | None", ...]
"""When each use of a budget was taken (wall seconds; None: unknown), oldest first."""


def _window_seconds(_: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"a budget window must be None (the whole job) or a number of seconds > 0, got {value!r}")


@attrs.frozen
class BudgetWindow:
    """The trailing window a budget's uses count in.

    Attributes:
        seconds: a use counts for this long after it was taken; None: for the whole job.
    """

    seconds: float | None = attrs.field(default=None, validator=_window_seconds)

    def count(self, times: Sequence[float | None], now: float | None) -> int:
        """How many of `times` count at `now` (wall seconds): all of them without a window or
        without a time to compare with, else those taken within the window, and every use whose
        time is unknown."""
        if self.seconds is None or now is None:
            return len(times)
        since = now - self.seconds
        return sum(1 for t in times if t is None or t > since)

    @staticmethod
    def add(times: Sequence[float | None], now: float | None, keep: int) -> UseTimes:
        """`times` with one more use, taken at `now`, of which the `keep` that count longest are
        kept, oldest first: a budget of `keep` uses reads no other. Those are the newest, and
        those of unknown time (they count for ever); so a wall clock set back (a master restarted
        on another host) drops the uses that expire first, not those recorded first."""
        kept = sorted((*times, now), key=_expires)
        return tuple(kept[max(len(kept) - max(keep, 0), 0) :])

    def per(self) -> str:
        """The window in words for a budget's message: ``" per 24h"``, ``" per 90s"``; empty for
        the whole job."""
        if self.seconds is None:
            return ""
        if self.seconds % 3600 == 0:
            return f" per {self.seconds / 3600:g}h"
        if self.seconds % 60 == 0:
            return f" per {self.seconds / 60:g}min"
        return f" per {self.seconds:g}s"


def _expires(t: float | None) -> float:
    return math.inf if t is None else t


def use_times_from_json(value: object) -> UseTimes:
    """The use times `BudgetWindow.add` kept, read back from JSON (a list of numbers and nulls).

    Raises:
        ValueError: `value` is not such a list.
    """
    if not isinstance(value, list):
        raise ValueError(f"use times must be a list, got {value!r}"[:300])
    for t in value:
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
            raise ValueError(f"a use time must be a finite number or null, got {t!r}")
    return tuple(None if t is None else float(t) for t in value)
