"""Bounding the rate of a persist, so it never takes more than a set share of CPU or disk.

Writing a snapshot costs CPU (the copy into the page cache) and disk bandwidth, both of which the
training job may need. Unbounded, a persist finishes as fast as the disk allows (the throughput
goal); bounded, it spreads the same work over a longer time. `pace_delay` is the pure decision;
`Pacer` applies it with an injected clock.

The default cap, `default_persist_bandwidth_mb_s`, grows with the CPUs the saver may run on
(`PERSIST_MB_S_PER_CPU` each), as a host's memory bandwidth roughly does: on a small host, where a
persist at disk speed measured +3% to +8% on the steps of a memory-bound training loop beside it
(2 cores, 256 MB at about 2 GB/s), it takes a bounded share; on a GPU node (dozens of cores) it
is far above what its disks or network take, so it never holds a persist back there.
"""

from __future__ import annotations

import os

import attrs

from dlrover.common import Clock, ConfigError

__all__ = ["PERSIST_MB_S_PER_CPU", "Pacer", "default_persist_bandwidth_mb_s", "pace_delay"]

PERSIST_MB_S_PER_CPU = 512.0
"""The default persist rate cap per CPU the saver may run on, in MB/s (10^6 bytes)."""


def default_persist_bandwidth_mb_s(cpus: int | None = None) -> float:
    """The default persist rate cap: `PERSIST_MB_S_PER_CPU` for each of `cpus`.

    Args:
        cpus: CPUs to count (default: those this process may run on, which a cpuset or
            ``taskset`` narrows).

    Raises:
        ValueError: `cpus` is below 1.
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise ValueError(f"cpus must be an int >= 1, got {cpus!r}")
    return PERSIST_MB_S_PER_CPU * cpus


def pace_delay(bytes_done: int, elapsed_s: float, rate_bytes_s: float) -> tuple[float, str]:
    """How long to pause so that `bytes_done` bytes in `elapsed_s` seconds average `rate_bytes_s`.

    Args:
        bytes_done: bytes written since the start.
        elapsed_s: seconds since the start.
        rate_bytes_s: the cap in bytes per second; 0 means no cap.

    Returns:
        (seconds to pause, reason). Zero when the average is at or below the cap.

    Raises:
        ValueError: a negative argument (naming it).
    """
    if bytes_done < 0 or elapsed_s < 0 or rate_bytes_s < 0:
        raise ValueError(
            f"pace_delay needs non-negative arguments, got bytes_done={bytes_done!r}, "
            f"elapsed_s={elapsed_s!r}, rate_bytes_s={rate_bytes_s!r}"
        )
    if rate_bytes_s == 0:
        return 0.0, "no rate cap"
    due_s = bytes_done / rate_bytes_s
    if due_s <= elapsed_s:
        return 0.0, f"{bytes_done} bytes in {elapsed_s:.3f}s is within {rate_bytes_s:.0f} B/s"
    return due_s - elapsed_s, f"{bytes_done} bytes are due at {due_s:.3f}s at {rate_bytes_s:.0f} B/s"


@attrs.define
class Pacer:
    """Pauses a writer so its average rate stays at or below `rate_bytes_s` (0: never pauses).

    The average is taken from the pacer's construction: make one right before writing.

    Args:
        rate_bytes_s: the cap in bytes per second (0: none).
        clock: time source; `sleep` does the pausing.
    """

    rate_bytes_s: float
    clock: Clock
    _start: float = attrs.field(default=0.0, init=False)
    _done: int = attrs.field(default=0, init=False)
    paused_s: float = attrs.field(default=0.0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.rate_bytes_s < 0:
            raise ConfigError(f"rate_bytes_s must be >= 0 (0: no cap), got {self.rate_bytes_s!r}")
        self._start = self.clock.now()

    def wrote(self, nbytes: int) -> None:
        """Account `nbytes` just written, pausing as long as the cap requires."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
        self._done += nbytes
        delay, _ = pace_delay(self._done, self.clock.now() - self._start, self.rate_bytes_s)
        if delay > 0:
            self.paused_s += delay
            self.clock.sleep(delay)
