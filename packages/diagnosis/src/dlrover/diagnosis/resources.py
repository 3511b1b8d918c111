"""GPU samples from the live system through nvidia-ml-py, for the GPUs the job can see.

nvidia-ml-py (the ``gpu`` extra) is imported only when GPU sampling is asked for, and its absence
or a driver error yields no GPU samples plus a note, never an exception. (The agent measures its
process tree's CPU and memory itself: `dlrover.launcher.resource_usage`.)

NVML lists every GPU of the host, while a job on a shared host (a Slurm node split between jobs, a
bare-metal host shared by hand) sees only those ``CUDA_VISIBLE_DEVICES`` names: the others' memory
and load are another tenant's. `visible_gpus` picks the job's out of NVML's list the way the CUDA
driver reads the variable (see there). Ordinals are taken in NVML's order, the PCI bus order, which
is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; CUDA's default order puts faster devices first and
so differs only on a host of unlike GPUs. ``MIG-`` entries name parts of a GPU that NVML's
whole-device readings do not describe: they are not read, and the note says so. A device this
process may not open (a device cgroup hiding another tenant's GPUs) is left out, and the note says
so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dlrover.diagnosis.evidence import GpuSample

__all__ = ["VISIBLE_DEVICES_ENV", "sample_gpus", "visible_gpus"]

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def visible_gpus(uuids: Sequence[str], visible: str | None) -> tuple[list[int], str]:
    """The GPUs a job sees, as indices into NVML's list, in the job's order (its device 0 first).

    Read as the CUDA driver reads ``CUDA_VISIBLE_DEVICES``: the first entry says whether the list
    holds ordinals or UUIDs. Ordinals (blanks around them ignored) are read by their leading
    digits (``0abc`` is 0); UUIDs are ``GPU-`` and a unique prefix of the rest, as written. The list
    ends at the first entry that names no device (a negative ordinal, one out of range, an unknown
    or ambiguous UUID, an entry of the other kind); a device named twice leaves no device at all.

    Args:
        uuids: each NVML device's UUID (``GPU-...``), in NVML's order.
        visible: the job's ``CUDA_VISIBLE_DEVICES``; None (unset) sees every device.

    Returns:
        The indices, and a note naming what was not read (empty when every entry named a device).
    """
    if visible is None:
        return list(range(len(uuids))), ""
    said = f"{VISIBLE_DEVICES_ENV}={visible!r}"
    if visible.startswith("MIG-"):
        return [], f"{said}: MIG devices, which whole-GPU readings do not describe, are not read"
    by_uuid = visible.startswith("GPU-")
    chosen: list[int] = []
    for entry in visible.split(","):
        index, why = _uuid_named(entry, uuids) if by_uuid else _ordinal_named(entry, len(uuids))
        if index is None:
            rest = "" if not chosen else f" (read: {len(chosen)} device(s) before it)"
            return chosen, f"{said}: {why}; the entries from there on are not read{rest}"
        if index in chosen:
            return [], f"{said}: {entry.strip()!r} names a device named before, and CUDA then sees no device"
        chosen.append(index)
    return chosen, ""


_LEADING_INTEGER = re.compile(r"[+-]?\d+")


def _ordinal_named(entry: str, count: int) -> tuple[int | None, str]:
    match = _LEADING_INTEGER.match(entry.strip())
    if match is None:
        return None, f"{entry!r} is no device ordinal"
    ordinal = int(match.group())
    if 0 <= ordinal < count:
        return ordinal, ""
    return None, f"{entry!r} is no device ordinal of this host's {count} GPU(s)"


def _uuid_named(entry: str, uuids: Sequence[str]) -> tuple[int | None, str]:
    if not entry.startswith("GPU-") or entry == "GPU-":
        return None, f"{entry!r} is no GPU UUID"
    matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
    if len(matches) == 1:
        return matches[0], ""
    return None, f"{entry!r} names {'no GPU of this host' if not matches else 'several GPUs'}"


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
        handles = [_handle(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        # A handle NVML refused has no UUID to match (its ordinal is still counted).
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) if visible is not None and h is not None else "" for h in handles]
        chosen, note = visible_gpus(uuids, visible)
        samples = []
        hidden = []
        for position, index in enumerate(chosen):
            handle = handles[index]
            if handle is None:
                hidden.append(str(index))
                continue
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            samples.append(GpuSample(position, int(mem.used), int(mem.total), float(util.gpu)))
        if hidden:
            refused = f"NVML refused device(s) {', '.join(hidden)} to this process"
            note = f"{note}; {refused}" if note else refused
        return tuple(samples), note
    except Exception as exc:
        return (), f"NVML query failed: {exc}"
    finally:
        nvml.nvmlShutdown()


def _handle(nvml: Any, index: int) -> Any:
    """NVML's handle of device `index`, or None where this process may not open it (NVML counts
    devices a device cgroup hides from it, and refuses their handles)."""
    try:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError_NoPermission:
        return None


def _text(value: Any) -> str:
    # nvidia-ml-py returns str; releases before 11.5 returned bytes.
    return value.decode() if isinstance(value, bytes) else str(value)
