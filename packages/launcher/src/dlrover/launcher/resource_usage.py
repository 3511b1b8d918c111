"""What a node's training uses, sampled for the agent's heartbeats without ever blocking.

`ProcessTreeSampler` measures the agent's process tree (the agent, its workers and whatever they
started). CPU time is measured between two successive samples, so a sample costs a walk of
``/proc`` and never a wait: the agent's loop, which also watches the workers, is not held up.
GPUs are sampled through nvidia-ml-py (`dlrover.diagnosis.sample_gpus`) only when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs in the pinned set

from dlrover.diagnosis import GpuSample, sample_gpus
from dlrover.launcher.control import ResourceUsage

__all__ = ["ProcessTreeSampler"]


class ProcessTreeSampler:
    """Samples the CPU and memory of a process and its descendants, and optionally the GPUs.

    Args:
        root_pid: the tree's root (the agent).
        include_gpus: also report GPU utilisation and memory.
        read_gpus: where GPU samples come from (tests replace it).
    """

    def __init__(
        self,
        root_pid: int,
        *,
        include_gpus: bool = False,
        read_gpus: Callable[[], tuple[tuple[GpuSample, ...], str]] = sample_gpus,
    ) -> None:
        self._root = psutil.Process(root_pid)
        self._include_gpus = include_gpus
        self._read_gpus = read_gpus
        # Kept between samples: a process's CPU percent is measured since its previous reading,
        # and a psutil.Process knows its own start time, so a reused pid is a new entry.
        self._known: dict[int, Any] = {}

    def sample(self) -> ResourceUsage:
        """The tree's CPU use since the previous sample (0 for processes new since then), its
        resident memory now, and the GPUs' use when asked."""
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        known: dict[int, Any] = {}
        cpu = 0.0
        rss = 0
        for proc in tree:
            previous = self._known.get(proc.pid)
            current = previous if previous is not None and previous == proc else proc
            try:
                cpu += float(current.cpu_percent(None))
                rss += int(current.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            known[proc.pid] = current
        self._known = known
        gpu_percent, gpu_memory = 0.0, 0
        if self._include_gpus:
            gpus, _ = self._read_gpus()
            if gpus:
                gpu_percent = sum(g.utilization_percent for g in gpus) / len(gpus)
                gpu_memory = sum(g.memory_used_bytes for g in gpus)
        return ResourceUsage(cpu_percent=cpu, memory_bytes=rss, gpu_percent=gpu_percent, gpu_memory_bytes=gpu_memory)
