"""What a node's training uses, sampled for the agent's heartbeats without holding up its loop.

`ProcessTreeSampler` measures the agent's process tree (the agent, its workers, their children
and any standby workers). CPU time is measured between two successive samples, so a sample costs
a walk of ``/proc`` and never a wait. Memory is each process's anonymous resident memory (RSS less
its shared and file-backed pages): shared memory, such as flash-checkpoint buffers mapped by every
worker and by the saver, and library pages would otherwise be counted once per process.

GPUs are read through nvidia-ml-py (`dlrover.diagnosis.sample_gpus`) on a background thread,
since initialising NVML can take long; a sample carries the newest reading. Only the GPUs the job
sees are read (``CUDA_VISIBLE_DEVICES``, as the agent's workers inherit it): on a shared host the
others are another tenant's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs in the pinned set

from dlrover.diagnosis import GpuSample, sample_gpus
from dlrover.launcher.control import ResourceUsage

__all__ = ["ProcessTreeSampler"]

_log = logging.getLogger(__name__)

GpuReader = Callable[[], tuple[tuple[GpuSample, ...], str]]


class _GpuPoller:
    """Reads the GPUs every `interval_s` on a daemon thread; `latest` is the newest reading."""

    def __init__(self, read: GpuReader, interval_s: float) -> None:
        self._read = read
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._latest: tuple[GpuSample, ...] = ()
        self._thread = threading.Thread(target=self._run, name="dlrover-gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        noted = ""
        while True:
            try:
                gpus, note = self._read()
            except Exception as exc:  # a driver fault must not end the sampling, nor training
                gpus, note = (), f"GPU sampling failed: {exc}"
            with self._lock:
                self._latest = gpus
            if note and note != noted:
                _log.info("%s: %s", "GPU samples left out" if gpus else "no GPU samples", note)
            noted = note
            if self._stop.wait(self._interval_s):
                return

    @property
    def latest(self) -> tuple[GpuSample, ...]:
        with self._lock:
            return self._latest

    def close(self, timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(timeout_s)


class ProcessTreeSampler:
    """Samples the CPU and memory of a process and its descendants, and optionally the GPUs.

    Args:
        root_pid: the tree's root (the agent).
        include_gpus: also report GPU utilisation and memory (read on a background thread,
            started by the first sample and stopped by `close`).
        read_gpus: where GPU readings come from (tests replace it).
        gpu_interval_s: how often the GPUs are read.
    """

    def __init__(
        self,
        root_pid: int,
        *,
        include_gpus: bool = False,
        read_gpus: GpuReader = sample_gpus,
        gpu_interval_s: float = 5.0,
    ) -> None:
        if not gpu_interval_s > 0:
            raise ValueError(f"gpu_interval_s must be positive, got {gpu_interval_s!r}")
        self._root = psutil.Process(root_pid)
        self._include_gpus = include_gpus
        self._read_gpus = read_gpus
        self._gpu_interval_s = gpu_interval_s
        self._gpus: _GpuPoller | None = None
        # Kept between samples: a process's CPU percent is measured since its previous reading,
        # and a psutil.Process knows its own start time, so a reused pid is a new entry.
        self._known: dict[int, Any] = {}

    def sample(self) -> ResourceUsage:
        """The tree's CPU use since the previous sample (0 for processes new since then), its
        anonymous resident memory now, and the newest GPU reading when asked. Never raises for
        what the system refuses to show: a process it cannot read is left out."""
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except (psutil.Error, OSError):  # gone, or /proc partly hidden (hidepid, sandboxes)
            tree = [self._root]
        known: dict[int, Any] = {}
        cpu = 0.0
        memory = 0
        for proc in tree:
            previous = self._known.get(proc.pid)
            current = previous if previous is not None and previous == proc else proc
            try:
                cpu += float(current.cpu_percent(None))
                info = current.memory_info()
                memory += max(int(info.rss) - int(getattr(info, "shared", 0)), 0)
            except (psutil.Error, OSError):
                continue
            known[proc.pid] = current
        self._known = known
        gpu_percent, gpu_memory = 0.0, 0
        if self._include_gpus:
            if self._gpus is None:
                self._gpus = _GpuPoller(self._read_gpus, self._gpu_interval_s)
            gpus = self._gpus.latest
            if gpus:
                gpu_percent = sum(g.utilization_percent for g in gpus) / len(gpus)
                gpu_memory = sum(g.memory_used_bytes for g in gpus)
        return ResourceUsage(cpu_percent=cpu, memory_bytes=memory, gpu_percent=gpu_percent, gpu_memory_bytes=gpu_memory)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the GPU reading thread, if any (idempotent)."""
        if self._gpus is not None:
            self._gpus.close(timeout_s)
            self._gpus = None
