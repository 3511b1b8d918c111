"""GPU sampling (the optional path) and the resource sample's validation."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from dlrover.common import ConfigError
from dlrover.diagnosis import ResourceSample, sample_gpus, visible_gpus


def test_a_resource_sample_knows_its_host_memory_fraction() -> None:
    s = ResourceSample(1.0, 50.0, 10, host_memory_used_bytes=5, host_memory_total_bytes=10)
    assert s.host_memory_fraction == 0.5


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="nvidia-ml-py is installed here")
def test_gpu_sampling_without_nvidia_ml_py_says_why() -> None:
    gpus, note = sample_gpus()
    assert gpus == ()
    assert "nvidia-ml-py is not installed" in note


def test_bad_values_are_rejected() -> None:
    with pytest.raises(ConfigError, match="rss_bytes"):
        ResourceSample(0.0, 0.0, -1, host_memory_used_bytes=0, host_memory_total_bytes=0)


UUIDS = ["GPU-1a2b3c4d-0000", "GPU-1a2b9999-0000", "GPU-77aa0000-0000", "GPU-88bb0000-0000"]


@pytest.mark.parametrize(
    ("visible", "chosen", "note"),
    [
        (None, [0, 1, 2, 3], ""),
        ("2,0", [2, 0], ""),
        (" 3 , 1 ", [3, 1], ""),
        ("0abc,2", [0, 2], ""),  # an ordinal is read by its leading digits
        ("GPU-77aa,GPU-1a2b3", [2, 0], ""),
        ("1,-1,2", [1], "'-1' is no device ordinal of this host's 4 GPU(s)"),
        ("0,7,1", [0], "'7' is no device ordinal of this host's 4 GPU(s)"),
        ("1,x", [1], "'x' is no device ordinal"),
        ("1,GPU-77aa", [1], "'GPU-77aa' is no device ordinal"),  # the first entry says the kind
        ("GPU-77aa,1", [2], "'1' is no GPU UUID"),
        ("GPU-1a2b", [], "names several GPUs"),
        ("GPU-ffff", [], "names no GPU of this host"),
        ("GPU-", [], "'GPU-' is no GPU UUID"),
        ("gpu-88bb", [], "'gpu-88bb' is no device ordinal"),  # the prefix as written
        (" GPU-88bb", [], "' GPU-88bb' is no device ordinal"),
        ("1,1", [], "names a device named before, and CUDA then sees no device"),
        ("2,0,2", [], "CUDA then sees no device"),
        ("GPU-77aa,GPU-77aa0", [], "CUDA then sees no device"),
        ("MIG-5e6f/1/0", [], "MIG devices"),
        ("", [], "'' is no device ordinal"),
    ],
)
def test_the_visible_gpus_are_read_as_the_cuda_runtime_reads_them(
    visible: str | None, chosen: list[int], note: str
) -> None:
    got, why = visible_gpus(UUIDS, visible)
    assert got == chosen
    assert (note in why) if note else why == ""


class _FakeNvml(types.ModuleType):
    """nvidia-ml-py's calls the sampler makes, over a host of four GPUs, each busy by its index."""

    class NVMLError_NoPermission(Exception):
        pass

    def __init__(self, refused: tuple[int, ...] = ()) -> None:
        super().__init__("pynvml")
        self.open = 0
        self.refused = refused

    def nvmlInit(self) -> None:
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.refused:
            raise self.NVMLError_NoPermission(index)
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return UUIDS[handle].encode()

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=(handle + 1) << 30, total=80 << 30)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=10.0 * (handle + 1))


def test_only_the_gpus_the_job_sees_are_sampled_numbered_as_the_job_numbers_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus, note = sample_gpus({"CUDA_VISIBLE_DEVICES": "GPU-88bb,GPU-1a2b9"})
    assert note == ""
    assert [(g.index, g.memory_used_bytes >> 30, g.utilization_percent) for g in gpus] == [(0, 4, 40.0), (1, 2, 20.0)]
    assert len(sample_gpus({})[0]) == 4  # unset: every GPU of the host
    gpus, note = sample_gpus({"CUDA_VISIBLE_DEVICES": "3,9"})
    assert [g.memory_used_bytes >> 30 for g in gpus] == [4]
    assert "'9' is no device ordinal" in note
    assert nvml.open == 0  # NVML shut down after every reading


def test_a_gpu_this_process_may_not_open_is_left_out_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device cgroup that hides another tenant's GPU: NVML counts it and refuses its handle."""
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(refused=(0,)))
    gpus, note = sample_gpus({})
    assert [g.memory_used_bytes >> 30 for g in gpus] == [2, 3, 4]
    assert "NVML refused device(s) 0 to this process" in note
    gpus, note = sample_gpus({"CUDA_VISIBLE_DEVICES": "GPU-77aa"})
    assert [g.memory_used_bytes >> 30 for g in gpus] == [3]
    assert note == ""
