"""PsCpuSampler: the cores a parameter server's process uses, from its CPU times, with start-up and pauses left out."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from dlrover.autoscale import Resources
from dlrover.master.psjob.ps_load import PsCpuSampler

pytestmark = pytest.mark.timeout(60)


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _wait_for_more_cpu(pid: int, than: float) -> None:
    """Until the process has used 50 ms of CPU more than `than` (however slowly this host runs it)."""
    while _cpu(pid) < than + 0.05:
        time.sleep(0.02)


def test_a_busy_server_shows_its_cores_and_start_up_is_left_out() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        request = {7: Resources(cpu=1, memory_mb=0)}
        clock = iter([0.0, 1.0, 2.0, 3.0])
        sampler = PsCpuSampler(lambda node: busy.pid if node == 7 else None, keep_s=100.0, warmup_s=1.5)
        for _ in range(4):
            # Read after the sampler's own read: the next sample spans at least 50 ms of the spinner's CPU.
            _wait_for_more_cpu(busy.pid, _cpu(busy.pid))
            sampler.sample(request, next(clock))
        (series,) = sampler.series(request)
        times = [t for t, _cores in series.samples]
        assert times == [2.0, 3.0], "samples of the first 1.5 s are start-up"
        assert all(cores > 0 for _t, cores in series.samples)
        sampler.pause()
        sampler.sample(request, 10.0)
        assert sampler.series(request) == [], "a pause forgets the samples, and no interval spans it"
        assert sampler.series({8: None}) == [], "a node without a CPU request, or without samples, has no series"
    finally:
        busy.kill()
        busy.wait()
