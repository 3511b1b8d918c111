"""What a PS job's tasks use, sampled from their processes: each parameter server's CPU for the hot-PS heuristic,
and each role's peak memory for the job's profile (what the next such job is sized from).

Sampled where the backend can show a task's process (the local backend: `pid(node_id)`); a platform's own metrics
(the Kubernetes metrics API) would feed the same series. A CPU sample is the CPU time the process used between two
looks over the wall time between them, in cores. A memory peak is the kernel's high-water mark of the process's
resident set (`VmHWM` in `/proc/<pid>/status`), so a spike between two looks is not missed; where there is no
such file, the resident set at the look.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs in the pinned set

from dlrover.autoscale import NodeState, PsCpuSeries, Resources, Role

__all__ = ["PsCpuSampler", "TaskMemoryPeaks"]

_KIB = 1024
_MIB = 1024 * 1024


class PsCpuSampler:
    """Per parameter-server node, the cores it used over time.

    Args:
        pid_of: the process of a node (None when it has none now).
        keep_s: how much history to keep (at least the heuristic's window).
        warmup_s: a node's samples from its first this many seconds are dropped: a server starting (TensorFlow's
            import, the chief creating variables) is busy in a way that says nothing about its load.
    """

    def __init__(self, pid_of: Callable[[int], int | None], keep_s: float, warmup_s: float = 0.0) -> None:
        self._pid_of = pid_of
        self._keep_s = keep_s
        self._warmup_s = warmup_s
        self._first_seen: dict[int, float] = {}
        self._last: dict[int, tuple[float, float]] = {}  # node -> (time, cpu seconds used so far)
        self._samples: dict[int, deque[tuple[float, float]]] = {}

    def pause(self) -> None:
        """The job is not training now: what was sampled no longer says how loaded the servers are when it trains,
        and the next sample starts a new interval instead of spanning this gap."""
        self._last.clear()
        self._samples.clear()
        self._first_seen.clear()

    def sample(self, nodes: Mapping[int, Resources | None], now: float) -> None:
        """Take one sample of each of `nodes` (node id -> its request); forget nodes no longer given."""
        for gone in (set(self._samples) | set(self._last)) - set(nodes):
            self._samples.pop(gone, None)
            self._last.pop(gone, None)
            self._first_seen.pop(gone, None)
        for node_id in nodes:
            pid = self._pid_of(node_id)
            if pid is None:
                continue
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            used = float(times.user + times.system)
            before = self._last.get(node_id)
            self._last[node_id] = (now, used)
            first = self._first_seen.setdefault(node_id, now)
            if before is None or now <= before[0] or now - first < self._warmup_s:
                continue
            series = self._samples.setdefault(node_id, deque())
            series.append((now, max(used - before[1], 0.0) / (now - before[0])))
            while series and series[0][0] < now - self._keep_s:
                series.popleft()

    def series(self, nodes: Mapping[int, Resources | None]) -> list[PsCpuSeries]:
        """The heuristic's input: one series per node with a CPU request and samples."""
        out = []
        for node_id, resources in nodes.items():
            samples = self._samples.get(node_id)
            if resources is None or not samples:
                continue
            out.append(PsCpuSeries(NodeState(node_id, Role.PS, resources), tuple(samples)))
        return out


def _peak_rss_bytes(pid: int) -> int | None:
    """The process's resident-set high-water mark, else its resident set now; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * _KIB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


class TaskMemoryPeaks:
    """The most memory any task of each role reached, over the whole job.

    Args:
        pid_of: the process of a node (None when it has none now).
    """

    def __init__(self, pid_of: Callable[[int], int | None]) -> None:
        self._pid_of = pid_of
        self._peaks: dict[Role, int] = {}

    def sample(self, nodes: Mapping[int, Role]) -> None:
        """Look at each of `nodes` (node id -> its role) once."""
        for node_id, role in nodes.items():
            pid = self._pid_of(node_id)
            peak = None if pid is None else _peak_rss_bytes(pid)
            if peak is not None and peak > self._peaks.get(role, 0):
                self._peaks[role] = peak

    def peak_mb(self, role: Role) -> float | None:
        """The most any task of `role` used, in MiB; None when none was seen."""
        peak = self._peaks.get(role)
        return None if peak is None else round(peak / _MIB, 1)
