"""Real processes: a SIGSTOP'd worker is found hung, a slowed worker is found straggling, stacks are dumped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover.common import SystemClock
from dlrover.diagnosis import (
    HangConfig,
    HangDetector,
    StepReport,
    StragglerConfig,
    StragglerDetector,
    request_stack_dump,
)

WORKER = textwrap.dedent(
    """
    import sys, time
    path, step_s = sys.argv[1], float(sys.argv[2])
    step = 0
    with open(path, "a") as f:
        while True:
            time.sleep(step_s)
            step += 1
            f.write(f"{step}\\n")
            f.flush()
    """
)

DUMP_TARGET = textwrap.dedent(
    """
    import sys, time
    from dlrover.diagnosis import install_stack_dump_handler

    def deep_wait_for_collective():
        # Say "ready" from inside, so every dump taken after it shows this frame.
        print("ready", flush=True)
        while True:
            time.sleep(0.05)

    with install_stack_dump_handler(sys.argv[1]):
        deep_wait_for_collective()
    """
)

DEADLINE_S = 60.0


class Progress:
    """Reads the step numbers a worker appends to its file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.step = 0

    def poll(self) -> int | None:
        """The newest complete step written since the last poll, or None."""
        if not self.path.exists():
            return None
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return None
        self.offset += end + 1
        self.step = int(data[:end].split(b"\n")[-1])
        return self.step


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(script: str, *args: str, stdout: int | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=stdout, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=30)


def _feed(detector: HangDetector | StragglerDetector, progress: dict[int, Progress], clock: SystemClock) -> None:
    for rank, p in progress.items():
        step = p.poll()
        if step is not None:
            detector.observe(StepReport(rank, step, clock.now()))


def _wait(cond: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_sigstopped_worker_is_found_hung(tmp_path: Path, spawn: object) -> None:
    clock = SystemClock()
    progress = {r: Progress(tmp_path / f"rank{r}.steps") for r in (0, 1)}
    procs = {r: spawn(WORKER, str(progress[r].path), "0.05") for r in (0, 1)}  # type: ignore[operator]
    det = HangDetector(HangConfig(k=5.0, floor_s=2.0, warmup_steps=1, first_steps_allowance_s=60.0))
    det.start((0, 1), clock.now())

    def warmed_up() -> bool:
        _feed(det, progress, clock)
        return all(p.step >= 10 for p in progress.values())

    _wait(warmed_up, "both workers to make 10 steps")
    os.kill(procs[1].pid, signal.SIGSTOP)
    stopped_at_step = progress[1].poll() or progress[1].step
    rank0_at_stop = progress[0].step
    reports = []

    def hung() -> bool:
        _feed(det, progress, clock)
        report = det.check(clock.now())
        reports.append(report)
        return 1 in report.stalled_ranks

    _wait(hung, "the hang detector to flag the stopped rank")
    report = reports[-1]
    assert report.hung
    assert "no step progress from rank(s)" in report.reason
    assert progress[1].step == stopped_at_step  # the stopped process really made no progress
    assert progress[0].step > rank0_at_stop  # while the other one kept going


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_slowed_worker_is_found_straggling(tmp_path: Path, spawn: object) -> None:
    clock = SystemClock()
    step_s = {0: "0.03", 1: "0.03", 2: "0.3"}
    progress = {r: Progress(tmp_path / f"rank{r}.steps") for r in step_s}
    for r, s in step_s.items():
        spawn(WORKER, str(progress[r].path), s)  # type: ignore[operator]
    det = StragglerDetector(StragglerConfig(k=2.0, window_steps=20, min_samples=5, warmup_steps=1))
    reports = []

    def found() -> bool:
        _feed(det, progress, clock)
        report = det.check(clock.now())
        reports.append(report)
        return 2 in report.stragglers

    _wait(found, "the straggler detector to flag the slowed rank")
    times = dict(reports[-1].step_time_s)
    # Measured from the real process (it sleeps 0.3 s a step), observed by polling: allow the
    # polling jitter, but it must be far above the fast ranks' 0.03 s.
    assert times[2] >= 0.2
    assert "rank 2" in reports[-1].reason


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_faulthandler_stack_dump_of_a_live_process(tmp_path: Path, spawn: object) -> None:
    dump = tmp_path / "stacks.txt"
    proc = spawn(DUMP_TARGET, str(dump), stdout=subprocess.PIPE)  # type: ignore[operator]
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    result = request_stack_dump(proc.pid, dump_path=dump, use_py_spy=False, timeout_s=30.0)
    assert result.ok, result.reason
    assert result.method == "faulthandler"
    assert "deep_wait_for_collective" in result.text
    # A second dump returns only the new stacks.
    again = request_stack_dump(proc.pid, dump_path=dump, use_py_spy=False, timeout_s=30.0)
    assert again.ok
    assert again.text.count("deep_wait_for_collective") >= 1
    assert len(again.text) < len(dump.read_text())
    assert proc.poll() is None  # dumping does not disturb the process


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_stack_dump_refuses_an_unregistered_process_and_reports_a_stopped_one(tmp_path: Path, spawn: object) -> None:
    proc = spawn(WORKER, str(tmp_path / "p.steps"), "0.05")  # type: ignore[operator]
    result = request_stack_dump(proc.pid, dump_path=tmp_path / "missing.txt", use_py_spy=False)
    assert not result.ok
    assert "did not install the stack-dump handler" in result.reason
    assert proc.poll() is None  # not killed by an unhandled SIGUSR1

    dump = tmp_path / "stacks.txt"
    target = spawn(DUMP_TARGET, str(dump), stdout=subprocess.PIPE)  # type: ignore[operator]
    assert target.stdout is not None
    assert target.stdout.readline().strip() == "ready"
    os.kill(target.pid, signal.SIGSTOP)
    stopped = request_stack_dump(target.pid, dump_path=dump, use_py_spy=False, timeout_s=1.0)
    assert not stopped.ok
    assert "SIGSTOP" in stopped.reason
    os.kill(target.pid, signal.SIGCONT)
