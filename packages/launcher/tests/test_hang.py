from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from dlrover.launcher.agent import Agent, AgentConfig
from dlrover.launcher.fake_control import FakeControlPlane
from dlrover.launcher.hang import HangWatch, read_cpu_seconds


def test_a_worker_without_cpu_progress_for_the_timeout_is_hung() -> None:
    watch = HangWatch(timeout_s=10.0, min_cpu_s=0.05)
    assert watch.observe({0: 1.0, 1: 1.0}, now=0.0) == []
    assert watch.observe({0: 1.5, 1: 1.01}, now=5.0) == []
    assert watch.observe({0: 2.0, 1: 1.02}, now=9.9) == []
    assert watch.observe({0: 2.5, 1: 1.03}, now=10.0) == [1]
    assert watch.stalled_for(1, 10.0) == 10.0


def test_progress_resets_the_window_and_exited_workers_are_ignored() -> None:
    watch = HangWatch(timeout_s=2.0)
    watch.observe({0: 0.0, 1: 0.0}, now=0.0)
    assert watch.observe({0: 1.0, 1: 0.0}, now=1.9) == []
    assert watch.observe({0: 1.0}, now=3.0) == []  # rank 1 exited: not reported as hung
    assert watch.observe({0: 1.0}, now=3.9) == [0]


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        HangWatch(timeout_s=0)


def test_cpu_time_of_a_live_and_a_missing_process() -> None:
    mine = read_cpu_seconds(os.getpid())
    assert mine is not None
    assert mine >= 0
    assert read_cpu_seconds(2**22 + 12345) is None


WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    if attempt == 0:
        while True:  # a healthy, busy worker
            sum(range(100000))
    """
)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_stopped_worker_is_found_hung_reported_and_restarted(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    control = FakeControlPlane()
    config = AgentConfig(
        worker_argv=(sys.executable, str(script)),
        nproc_per_node=2,
        max_restarts=1,
        monitor_interval_s=0.1,
        shutdown_grace_s=5.0,
        hang_timeout_s=3.0,
    )
    result = Agent(config, control).run()
    assert result.exit_code == 0, result.reason
    assert result.restarts == 1
    (report,) = control.failures
    assert report.hang
    assert report.local_rank == 1
    assert "no CPU progress" in report.evidence
