"""`ProcessTreeSampler`: CPU between samples and memory of a real process tree, GPUs from a fake."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

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
        mine = psutil.Process().memory_info()
        assert tree.memory_bytes >= mine.rss - mine.shared + (60 << 20)  # anonymous memory, as sampled
    finally:
        child.kill()
        child.wait()


def test_a_tree_the_system_hides_is_sampled_as_far_as_it_can_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc partly hidden (hidepid, sandboxes): psutil raises AccessDenied listing children.
    def hidden(self: object, recursive: bool = False) -> list[object]:
        raise psutil.AccessDenied(pid=1)

    sampler = ProcessTreeSampler(os.getpid())
    monkeypatch.setattr(psutil.Process, "children", hidden)
    usage = sampler.sample()  # this process alone, and no exception
    assert usage.memory_bytes > 0


def _first_gpu_reading(sampler: ProcessTreeSampler) -> tuple[float, int]:
    """Sample until the background GPU reading has arrived (bounded by the test's timeout)."""
    while True:
        usage = sampler.sample()
        if usage.gpu_memory_bytes:
            return usage.gpu_percent, usage.gpu_memory_bytes
        time.sleep(0.01)


def test_gpus_are_read_in_the_background_then_averaged_and_summed() -> None:
    gpus = (GpuSample(0, 1 << 30, 80 << 30, 50.0), GpuSample(1, 3 << 30, 80 << 30, 100.0))
    sampler = ProcessTreeSampler(os.getpid(), include_gpus=True, read_gpus=lambda: (gpus, ""), gpu_interval_s=0.05)
    try:
        assert _first_gpu_reading(sampler) == (75.0, 4 << 30)
    finally:
        sampler.close()
    sampler.close()  # idempotent


@pytest.mark.parametrize("fault", ["none visible", "raises"])
def test_no_gpu_reading_gives_zeros_never_an_error(fault: str) -> None:
    calls: list[int] = []

    def read() -> tuple[tuple[GpuSample, ...], str]:
        calls.append(1)
        if fault == "raises":
            raise RuntimeError("driver fault")
        return (), "no NVML"

    sampler = ProcessTreeSampler(os.getpid(), include_gpus=True, read_gpus=read, gpu_interval_s=0.01)
    try:
        while len(calls) < 3:  # the reader has run, and run again after a fault
            usage = sampler.sample()
            assert (usage.gpu_percent, usage.gpu_memory_bytes) == (0.0, 0)
            time.sleep(0.01)
    finally:
        sampler.close()
