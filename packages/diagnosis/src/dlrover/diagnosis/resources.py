"""GPU samples from the live system through nvidia-ml-py, for the GPUs the job can see.

nvidia-ml-py (the ``gpu`` extra) is imported only when GPU sampling is asked for, and its absence
or a driver error yields no GPU samples plus a note, never an exception. (The agent measures its
process tree's CPU and memory itself: `dlrover.launcher.resource_usage`.)

NVML lists every GPU of the host, while a job on a shared host (a Slurm node split between jobs, a
bare-metal host shared by hand) sees only those ``CUDA_VISIBLE_DEVICES`` names: the others' memory
and load are another tenant's. `visible_gpus` picks the job's out of NVML's list the way the CUDA
runtime reads the variable: entries separated by commas, each a device ordinal or a ``GPU-`` UUID
(a unique prefix is enough), read until the first entry that names no device (``-1``, an ordinal
out of range, an unknown or ambiguous UUID, a device named twice). Ordinals are taken in NVML's
order, the PCI bus order, which is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; CUDA's default
order puts faster devices first and so differs only on a host of unlike GPUs. ``MIG-`` entries name
parts of a GPU that NVML's whole-device readings do not describe: they are read as no device, and
the note says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dlrover.diagnosis.evidence import GpuSample

__all__ = ["VISIBLE_DEVICES_ENV", "sample_gpus", "visible_gpus"]

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def visible_gpus(uuids: Sequence[str], visible: str | None) -> tuple[list[int], str]:
    """The GPUs a job sees, as indices into NVML's list, in the job's order (its device 0 first).

    Args:
        uuids: each NVML device's UUID (``GPU-...``), in NVML's order.
        visible: the job's ``CUDA_VISIBLE_DEVICES``; None (unset) sees every device.

    Returns:
        The indices, and a note naming what was not read (empty when every entry named a device).
    """
    if visible is None:
        return list(range(len(uuids))), ""
    chosen: list[int] = []
    for raw in visible.split(","):
        entry = raw.strip()
        index, why = _device_named(entry, uuids)
        if index is None or index in chosen:
            why = why or f"device {entry!r} is named twice"
            rest = "" if not chosen else f" (read: {len(chosen)} device(s) before it)"
            return chosen, f"{VISIBLE_DEVICES_ENV}={visible!r}: {why}; the entries from there on are not read{rest}"
        chosen.append(index)
    return chosen, ""


def _device_named(entry: str, uuids: Sequence[str]) -> tuple[int | None, str]:
    if entry.lstrip("+-").isdigit():
        ordinal = int(entry)
        if 0 <= ordinal < len(uuids):
            return ordinal, ""
        return None, f"{entry!r} is no device ordinal of this host's {len(uuids)} GPU(s)"
    if entry[:4].upper() == "MIG-":
        return None, f"{entry!r} is a MIG device, which whole-GPU readings do not describe"
    if entry[:4].upper() == "GPU-":
        matches = [i for i, uuid in enumerate(uuids) if uuid.lower().startswith(entry.lower())]
        if len(matches) == 1:
            return matches[0], ""
        return None, f"{entry!r} names {'no GPU of this host' if not matches else 'several GPUs'}"
    return None, f"{entry!r} is neither a device ordinal nor a GPU UUID"


def sample_gpus(environ: Mapping[str, str] | None = None) -> tuple[tuple[GpuSample, ...], str]:
    """Sample the GPUs the job sees (every GPU of the host where ``CUDA_VISIBLE_DEVICES`` is unset).

    Args:
        environ: where ``CUDA_VISIBLE_DEVICES`` is read (default: this process's environment).

    Returns:
        The samples, each indexed as the job numbers its devices (``cuda:0`` first), and a note
        saying why there are none or what was left out (empty when nothing was).
    """
    visible = (os.environ if environ is None else environ).get(VISIBLE_DEVICES_ENV)
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
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles] if visible is not None else [""] * len(handles)
        chosen, note = visible_gpus(uuids, visible)
        samples = []
        for position, index in enumerate(chosen):
            mem = nvml.nvmlDeviceGetMemoryInfo(handles[index])
            util = nvml.nvmlDeviceGetUtilizationRates(handles[index])
            samples.append(GpuSample(position, int(mem.used), int(mem.total), float(util.gpu)))
        return tuple(samples), note
    except Exception as exc:
        return (), f"NVML query failed: {exc}"
    finally:
        nvml.nvmlShutdown()


def _text(value: Any) -> str:
    # nvidia-ml-py returns str; releases before 11.5 returned bytes.
    return value.decode() if isinstance(value, bytes) else str(value)
