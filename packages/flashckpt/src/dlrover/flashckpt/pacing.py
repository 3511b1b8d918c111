"""Bounding the rate of a persist, so it never takes more than a set share of CPU or disk.

Writing a snapshot costs CPU, memory bandwidth and disk bandwidth, all of which the training job
may need. Unbounded, a persist finishes as fast as the disk allows (the throughput
goal); bounded, it spreads the same work over a longer time. `pace_delay` is the pure decision;
`Pacer` applies it with an injected clock.

The default cap, `default_persist_bandwidth_mb_s`, grows with the CPUs the saver may use
(`PERSIST_MB_S_PER_CPU` each: its affinity mask, bounded by its cgroup's CPU quota), as a host's
memory bandwidth roughly does. On a small host it takes a bounded share: beside a memory-bound
training loop on 2 cores, steps measured +5.8% while a 256 MB persist ran at disk speed (1.7
GB/s), +5.0% at 1 GB/s and +2.6% at 512 MB/s (O_DIRECT writes, medians of 24 rounds), and
+0.9% / +0.3% (agent-hosted / detached saver, 16 rounds) at 512 MB/s, the default there, with
the default page-cache writes. On a GPU node (dozens of cores) it is above what the disks or
network take, so it holds nothing back.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import attrs

from dlrover.common import PROC_SELF_CGROUP, Clock, ConfigError, own_memberships

__all__ = [
    "PERSIST_MB_S_PER_CPU",
    "Pacer",
    "cpu_quota",
    "default_persist_bandwidth_mb_s",
    "pace_delay",
    "persist_bandwidth_or_default",
    "usable_cpus",
]

PERSIST_MB_S_PER_CPU = 256.0
"""The default persist rate cap per CPU the saver may use, in MB/s (10^6 bytes)."""

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """CPUs' worth of time this process's cgroup may use (``cpu.max``, or cgroup v1's CFS quota),
    the tightest along its path; None where there is no limit or no cgroup to read.

    A container limited to 2 CPUs on a 96-core host has 96 CPUs in its affinity mask and 2 here.
    """
    limits: list[float] = []
    for member in own_memberships(proc_cgroup):
        files: list[tuple[Path, Path | None]]
        if member.unified:  # cgroup v2: <root>/<path>/cpu.max, "max 100000" or "200000 100000"
            files = [(d / "cpu.max", None) for d in member.directories(cgroup_root)]
        elif member.has("cpu"):  # cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us
            mounts = (cgroup_root / n for n in (",".join(member.controllers), "cpu,cpuacct", "cpu"))
            base = next((m for m in mounts if m.is_dir()), None)
            if base is None:
                continue
            files = [(d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us") for d in member.directories(base)]
        else:
            continue
        for quota_file, period_file in files:
            limit = _read_limit(quota_file, period_file)
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def _read_limit(quota_file: Path, period_file: Path | None) -> float | None:
    try:
        if period_file is None:
            quota, _, period = quota_file.read_text().strip().partition(" ")
        else:
            quota, period = quota_file.read_text().strip(), period_file.read_text().strip()
        if quota in ("max", "-1"):
            return None
        q, p = float(quota), float(period)
    except (OSError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask (a cpuset, ``taskset``), bounded by its
    cgroup's CPU quota rounded up; at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def default_persist_bandwidth_mb_s(cpus: int | None = None) -> float:
    """The default persist rate cap: `PERSIST_MB_S_PER_CPU` for each of `cpus`.

    Args:
        cpus: CPUs to count (default: `usable_cpus`).

    Raises:
        ValueError: `cpus` is below 1.
    """
    if cpus is None:
        cpus = usable_cpus()
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise ValueError(f"cpus must be an int >= 1, got {cpus!r}")
    return PERSIST_MB_S_PER_CPU * cpus


def persist_bandwidth_or_default(mb_s: float | None) -> float:
    """`mb_s`, or `default_persist_bandwidth_mb_s` where it is None (a setting left at "auto")."""
    return default_persist_bandwidth_mb_s() if mb_s is None else mb_s


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
