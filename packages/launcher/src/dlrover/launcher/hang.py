"""Finding hung workers without help from the training script.

A worker that makes progress burns CPU; one that is stopped (SIGSTOP), deadlocked, or blocked in
a collective whose peer is gone burns almost none. The agent samples each worker's CPU time and
calls a worker hung when it has not grown by `min_cpu_s` for `timeout_s`. This needs nothing
from the script, so any torchrun script gains hang detection. The timeout (``--hang-timeout``,
180 s by default, 0 turns it off) must exceed the longest stretch a healthy worker spends idle:
a rank waiting at a gloo barrier while rank 0 preprocesses a dataset for ten minutes is idle
too, and would be restarted. What it cannot see: a worker that hangs while it spins, as a rank
does inside an NCCL collective whose peer is gone (its CPU time grows). For workers that report
their steps, the agent's step watch (`dlrover.launcher.step_watch`, ``--hang-step-factor``) finds
those within max(k x the median training time between their step marks, a floor); otherwise they
are ended by the collective's own timeout (``init_process_group(timeout=...)``, NCCL's watchdog).

`HangWatch` is pure: readings and `now` come in as arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from dlrover.common.process import proc_stat_fields

__all__ = ["HangWatch", "read_cpu_seconds"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@attrs.define
class _Track:
    cpu_s: float
    since: float


class HangWatch:
    """Tracks each worker's CPU time and reports those that stopped advancing.

    Args:
        timeout_s: how long a worker may go without CPU progress.
        min_cpu_s: the CPU time that counts as progress (ignores a sleeping thread's crumbs).
    """

    def __init__(self, timeout_s: float, min_cpu_s: float = 0.05) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self._timeout_s = timeout_s
        self._min_cpu_s = min_cpu_s
        self._tracks: dict[int, _Track] = {}

    def observe(self, cpu_seconds: Mapping[int, float], now: float) -> list[int]:
        """Record readings (local rank -> CPU seconds) and return the ranks that are hung."""
        for rank, cpu in cpu_seconds.items():
            track = self._tracks.get(rank)
            if track is None or cpu - track.cpu_s >= self._min_cpu_s or cpu < track.cpu_s:
                self._tracks[rank] = _Track(cpu, now)
        return sorted(r for r, t in self._tracks.items() if r in cpu_seconds and now - t.since >= self._timeout_s)

    def stalled_for(self, rank: int, now: float) -> float:
        """Seconds since `rank` last made CPU progress."""
        track = self._tracks.get(rank)
        return now - track.since if track is not None else 0.0


def read_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a process and its reaped children, or None if it is gone."""
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) < 15:
        return None
    # Fields after the command: state is [0]; utime, stime, cutime, cstime are [11]..[14].
    try:
        ticks = sum(int(x) for x in fields[11:15])
    except ValueError:
        return None
    return ticks / _CLOCK_TICKS
