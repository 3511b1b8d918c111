"""`ProcessTreeSampler`: CPU between samples and memory of a real process tree, GPUs from a fake."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from dlrover.diagnosis import GpuSample
from dlrover.launcher.resource_usage import ProcessTreeSampler

pytestmark = pytest.mark.timeout(60)

# Holds 64 MiB, then on each line from the test burns at least 0.2 s of its own CPU time.
BURNER = textwrap.dedent(
    """
    import sys, time
    held = bytearray(64 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1  # resident, not just reserved
    print("ready", flush=True)
    for _ in sys.stdin:
        start = time.process_time()
        while time.process_time() - start < 0.2:
            pass
        print("burned", flush=True)
    """
)


def test_cpu_is_measured_between_samples_and_memory_covers_the_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        own = ProcessTreeSampler(child.pid)
        first = own.sample()  # new to the sampler: its CPU counts from here
        assert first.memory_bytes >= 64 << 20
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "burned"
        second = own.sample()
        assert second.cpu_percent > 0.0
        assert (second.gpu_percent, second.gpu_memory_bytes) == (0.0, 0)
        # The tree of this test process holds the child: its memory is counted with ours.
        tree = ProcessTreeSampler(os.getpid()).sample()
        assert tree.memory_bytes >= psutil.Process().memory_info().rss + (60 << 20)
    finally:
        child.kill()
        child.wait()
    # A child gone since the last sample is simply not counted.
    assert ProcessTreeSampler(os.getpid()).sample().memory_bytes < tree.memory_bytes


def test_gpus_are_averaged_and_summed_when_asked() -> None:
    gpus = (GpuSample(0, 1 << 30, 80 << 30, 50.0), GpuSample(1, 3 << 30, 80 << 30, 100.0))
    sampler = ProcessTreeSampler(os.getpid(), include_gpus=True, read_gpus=lambda: (gpus, ""))
    usage = sampler.sample()
    assert (usage.gpu_percent, usage.gpu_memory_bytes) == (75.0, 4 << 30)
    # No GPU visible (no driver, no nvidia-ml-py): zeros, never an error.
    none = ProcessTreeSampler(os.getpid(), include_gpus=True, read_gpus=lambda: ((), "no NVML"))
    assert (none.sample().gpu_percent, none.sample().gpu_memory_bytes) == (0.0, 0)
