"""GPU sampling (the optional path) and the resource sample's validation."""

from __future__ import annotations

import importlib.util

import pytest

from dlrover.common import ConfigError
from dlrover.diagnosis import ResourceSample, sample_gpus


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
