"""Resource sampling: the fake, the real sampler's errors, and the optional GPU path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from dlrover.common import ConfigError, ManualClock
from dlrover.diagnosis import PsutilSampler, ResourceSample, StaticSampler, sample_gpus


def test_static_sampler_returns_prepared_samples() -> None:
    s = ResourceSample(1.0, 50.0, 10, host_memory_used_bytes=5, host_memory_total_bytes=10)
    fake = StaticSampler({7: s})
    assert fake.sample(7) is s
    assert s.host_memory_fraction == 0.5
    with pytest.raises(ProcessLookupError, match="42"):
        fake.sample(42)


def test_sampler_of_own_process_uses_the_injected_clock() -> None:
    clock = ManualClock(start=5.0)
    sample = PsutilSampler(clock, cpu_interval_s=0.2).sample(os.getpid())
    assert sample.time_s == pytest.approx(5.2)  # the CPU interval was slept on the manual clock
    assert sample.rss_bytes > 0


def test_sampler_reports_a_missing_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(ProcessLookupError, match=str(proc.pid)):
        PsutilSampler(ManualClock(), cpu_interval_s=0).sample(proc.pid)


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="nvidia-ml-py is installed here")
def test_gpu_sampling_without_nvidia_ml_py_says_why() -> None:
    gpus, note = sample_gpus()
    assert gpus == ()
    assert "nvidia-ml-py is not installed" in note
    sampler = PsutilSampler(ManualClock(), cpu_interval_s=0, include_gpus=True)
    assert sampler.sample(os.getpid()).gpus == ()
    assert "nvidia-ml-py" in sampler.last_gpu_note


def test_bad_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="cpu_interval_s"):
        PsutilSampler(ManualClock(), cpu_interval_s=-1)
    with pytest.raises(ConfigError, match="rss_bytes"):
        ResourceSample(0.0, 0.0, -1, host_memory_used_bytes=0, host_memory_total_bytes=0)
