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
        ("GPU-77aa,GPU-1a2b3", [2, 0], ""),
        ("gpu-88BB", [3], ""),
        ("1,-1,2", [1], "'-1' is no device ordinal"),
        ("0,7,1", [0], "'7' is no device ordinal of this host's 4 GPU(s)"),
        ("GPU-1a2b", [], "names several GPUs"),
        ("GPU-ffff", [], "names no GPU of this host"),
        ("1,1", [1], "device '1' is named twice"),
        ("2,GPU-77aa", [2], "named twice"),
        ("MIG-5e6f/1/0", [], "a MIG device"),
        ("", [], "neither a device ordinal nor a GPU UUID"),
    ],
)
def test_the_visible_gpus_are_read_as_the_cuda_runtime_reads_them(
    visible: str | None, chosen: list[int], note: str
) -> None:
    got, why = visible_gpus(UUIDS, visible)
    assert got == chosen
    assert (note in why) if note else why == ""
    if note:
        assert "the entries from there on are not read" in why


class _FakeNvml(types.ModuleType):
    """nvidia-ml-py's calls the sampler makes, over a host of four GPUs, each busy by its index."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.open = 0

    def nvmlInit(self) -> None:
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
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
    gpus, note = sample_gpus({"CUDA_VISIBLE_DEVICES": "GPU-88bb,1"})
    assert note == ""
    assert [(g.index, g.memory_used_bytes >> 30, g.utilization_percent) for g in gpus] == [(0, 4, 40.0), (1, 2, 20.0)]
    assert len(sample_gpus({})[0]) == 4  # unset: every GPU of the host
    gpus, note = sample_gpus({"CUDA_VISIBLE_DEVICES": "3,9"})
    assert [g.memory_used_bytes >> 30 for g in gpus] == [4]
    assert "'9' is no device ordinal" in note
    assert nvml.open == 0  # NVML shut down after every reading
