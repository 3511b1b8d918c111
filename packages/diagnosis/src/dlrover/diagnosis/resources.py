"""Resource samples from the live system: psutil for CPU and memory, nvidia-ml-py for GPUs.

`ResourceSampler` is the seam; `PsutilSampler` is the real one and `StaticSampler` the in-memory
fake. nvidia-ml-py (the ``gpu`` extra) is imported only when GPU sampling is asked for, and its
absence or a driver error yields no GPU samples plus a note, never an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs in the pinned set

from dlrover.common import Clock
from dlrover.diagnosis.evidence import GpuSample, ResourceSample

__all__ = ["PsutilSampler", "ResourceSampler", "StaticSampler", "sample_gpus"]


class ResourceSampler(Protocol):
    """Takes one resource sample of a process tree."""

    def sample(self, pid: int) -> ResourceSample:
        """Sample process `pid` and its children.

        Raises:
            ProcessLookupError: if `pid` does not exist.
        """
        ...


def sample_gpus() -> tuple[tuple[GpuSample, ...], str]:
    """Sample every visible GPU through nvidia-ml-py.

    Returns:
        The samples, and a note saying why there are none (empty when there are some).
    """
    try:
        import pynvml
    except ImportError:
        return (), "nvidia-ml-py is not installed (extra 'gpu')"
    nvml: Any = pynvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # no driver, no GPU: a fact to report, not an error
        return (), f"NVML unavailable: {exc}"
    try:
        samples = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            samples.append(GpuSample(index, int(mem.used), int(mem.total), float(util.gpu)))
        return tuple(samples), ""
    except Exception as exc:
        return (), f"NVML query failed: {exc}"
    finally:
        nvml.nvmlShutdown()


class PsutilSampler:
    """Samples a process tree's CPU and memory, the host's memory and optionally the GPUs.

    CPU percent is measured over `cpu_interval_s` (psutil blocks for that long), so keep it short.

    Args:
        clock: stamps the samples.
        cpu_interval_s: the CPU measurement interval (default 0.1 s).
        include_gpus: whether to query nvidia-ml-py.
    """

    def __init__(self, clock: Clock, *, cpu_interval_s: float = 0.1, include_gpus: bool = False) -> None:
        if not cpu_interval_s >= 0:
            raise ValueError(f"cpu_interval_s must be >= 0, got {cpu_interval_s!r}")
        self._clock = clock
        self._interval = cpu_interval_s
        self._gpus = include_gpus
        self.last_gpu_note = ""

    def sample(self, pid: int) -> ResourceSample:
        """Sample `pid` and its descendants.

        Raises:
            ProcessLookupError: if `pid` does not exist.
        """
        try:
            root = psutil.Process(pid)
            procs: Sequence[Any] = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess as exc:
            raise ProcessLookupError(f"no process with pid {pid}") from exc
        rss = 0
        cpu = 0.0
        alive = []
        for proc in procs:
            try:
                proc.cpu_percent(None)
                alive.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if self._interval > 0:
            self._clock.sleep(self._interval)
        for proc in alive:
            try:
                cpu += float(proc.cpu_percent(None))
                rss += int(proc.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        vm = psutil.virtual_memory()
        gpus: tuple[GpuSample, ...] = ()
        if self._gpus:
            gpus, self.last_gpu_note = sample_gpus()
        return ResourceSample(
            time_s=self._clock.now(),
            cpu_percent=cpu,
            rss_bytes=rss,
            host_memory_used_bytes=int(vm.total - vm.available),
            host_memory_total_bytes=int(vm.total),
            gpus=gpus,
        )


class StaticSampler:
    """A fake sampler that returns prepared samples per pid (for tests and dry runs).

    Args:
        samples: pid to the sample to return.
    """

    def __init__(self, samples: dict[int, ResourceSample]) -> None:
        self._samples = dict(samples)

    def sample(self, pid: int) -> ResourceSample:
        """The prepared sample of `pid`.

        Raises:
            ProcessLookupError: if none was prepared.
        """
        if pid not in self._samples:
            raise ProcessLookupError(f"no process with pid {pid}")
        return self._samples[pid]
