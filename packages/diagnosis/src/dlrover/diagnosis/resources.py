"""GPU samples from the live system through nvidia-ml-py.

nvidia-ml-py (the ``gpu`` extra) is imported only when GPU sampling is asked for, and its absence
or a driver error yields no GPU samples plus a note, never an exception. (The agent measures its
process tree's CPU and memory itself: `dlrover.launcher.resource_usage`.)
"""

from __future__ import annotations

from typing import Any

from dlrover.diagnosis.evidence import GpuSample

__all__ = ["sample_gpus"]


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
