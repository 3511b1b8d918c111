from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dlrover.common import DLRoverError
from dlrover.launcher import WorkerGroup, WorkerSpec

PY = sys.executable


def _spec(rank: int, code: str, tmp_path: Path | None = None, **kwargs: object) -> WorkerSpec:
    log_dir = tmp_path / str(rank) if tmp_path is not None else None
    return WorkerSpec(
        local_rank=rank, argv=(PY, "-c", textwrap.dedent(code)), env=dict(os.environ), log_dir=log_dir, **kwargs
    )  # type: ignore[arg-type]


def _wait_until(condition: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.integration
def test_exit_codes_signals_and_stderr_tail_are_reported(tmp_path: Path) -> None:
    group = WorkerGroup(
        [
            _spec(0, "print('fine')", tmp_path, redirect=3),
            _spec(
                1,
                "import sys; print('ImportError: no module named x', file=sys.stderr); sys.exit(3)",
                tmp_path,
                redirect=3,
            ),
            _spec(2, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", tmp_path, redirect=3),
        ]
    )
    group.start()
    _wait_until(lambda: not group.running())
    exits = group.stop(grace_s=1.0)
    assert exits[0].succeeded
    assert exits[1].exit_code == 3
    assert "ImportError" in exits[1].stderr_tail
    assert exits[2].signal_name == "SIGKILL"
    assert exits[2].exit_code == 128 + signal.SIGKILL
    assert (tmp_path / "0" / "stdout.log").read_text() == "fine\n"
    assert "ImportError" in (tmp_path / "1" / "stderr.log").read_text()


@pytest.mark.integration
def test_stderr_tail_is_bounded(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(20000): print('line', i, file=sys.stderr)\n"
    group = WorkerGroup([_spec(0, code, tmp_path, redirect=3)], stderr_tail_bytes=1024)
    group.start()
    _wait_until(lambda: not group.running())
    tail = group.stop(grace_s=1.0)[0].stderr_tail
    assert len(tail) <= 1024 + 32
    assert tail.endswith("line 19999\n")


_SLEEPER = "import time; time.sleep(600)"


@pytest.mark.integration
def test_a_worker_seen_exiting_with_a_failure_is_failing_before_it_is_reaped(tmp_path: Path) -> None:
    # The kernel frees a dying worker's memory before it can be reaped; what /proc shows during
    # that teardown (`exiting_status`) is played here by a stand-in, for workers that still run.
    # Rank 2, the one "exiting", ignores SIGTERM as a process in its teardown does.
    ready = tmp_path / "ignoring-sigterm"
    dying = f"""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(ready)!r}, "w").close()
        time.sleep(600)
    """
    exiting: dict[int, int] = {}
    group = WorkerGroup([_spec(0, _SLEEPER), _spec(1, _SLEEPER), _spec(2, dying)], read_exiting_status=exiting.get)
    group.start()
    try:
        _wait_until(ready.exists)
        assert group.poll() == {}
        assert group.failing == ()
        exiting[group.pids[1]] = 0  # exiting cleanly: nothing to act on early
        exiting[group.pids[2]] = signal.SIGKILL  # wait status of a SIGKILL
        assert group.poll() == {}
        assert group.failing == (2,)
        assert not group.terminated
        group.terminate()
        assert group.terminated
        _wait_until(lambda: set(group.poll()) == {0, 1})  # the others end; rank 2 "still exiting"
        assert group.failing[0] == 2
        assert set(group.failing) == {0, 1, 2}
        assert group.poll()[0].signal_name == "SIGTERM"
        os.kill(group.pids[2], signal.SIGKILL)
        _wait_until(lambda: 2 in group.poll())
        assert group.poll()[2].signal_name == "SIGKILL"
        assert group.failing[0] == 2
    finally:
        group.stop(grace_s=1.0)


@pytest.mark.integration
def test_a_failing_worker_never_reaped_is_reported_with_the_status_it_was_seen_exiting_with() -> None:
    group = WorkerGroup([_spec(0, _SLEEPER)], read_exiting_status=lambda pid: 3 << 8, reap_timeout_s=0.0)
    group.start()
    try:
        exits = group.poll()
        assert exits[0].exit_code == 3
        assert exits[0].signal_name is None
        assert group.failing == (0,)
    finally:
        group.stop(grace_s=1.0)


@pytest.mark.integration
def test_real_failures_are_failing_in_the_order_seen_and_a_success_is_not() -> None:
    group = WorkerGroup([_spec(0, _SLEEPER), _spec(1, "pass"), _spec(2, "import sys; sys.exit(5)"), _spec(3, _SLEEPER)])
    group.start()
    try:
        _wait_until(lambda: {1, 2} <= set(group.poll()))
        assert group.failing == (2,)
        os.kill(group.pids[0], signal.SIGKILL)
        _wait_until(lambda: 0 in group.poll())
        assert group.failing == (2, 0)
    finally:
        group.stop(grace_s=1.0)
    assert group.failing == (2, 0, 3)


@pytest.mark.integration
def test_stop_terminates_workers_and_their_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)
    """
    group = WorkerGroup([_spec(0, code)])
    group.start()
    _wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    grandchild = int(pid_file.read_text())
    worker = group.pids[0]
    exits = group.stop(grace_s=5.0)
    assert exits[0].signal_name in ("SIGTERM", "SIGKILL")
    _wait_until(lambda: not _alive(grandchild) and not _alive(worker))


@pytest.mark.integration
def test_a_capped_worker_log_keeps_the_newest_output_and_a_line_without_end_is_read_in_pieces(
    tmp_path: Path,
) -> None:
    code = """
        import sys
        for i in range(2000):
            print(f"progress line {i:04d}", file=sys.stderr)
        sys.stderr.write("x" * 200_000)  # a progress bar that never ends its line
        sys.stderr.write("\\nlast words\\n")
    """
    group = WorkerGroup([_spec(0, code, tmp_path, redirect=3, log_max_bytes=10_000)])
    group.start()
    _wait_until(lambda: not group.running())
    exits = group.stop(grace_s=0.0)
    assert exits[0].exit_code == 0
    log, older = tmp_path / "0" / "stderr.log", tmp_path / "0" / "stderr.log.1"
    assert log.read_text().endswith("last words\n")
    assert older.exists()
    # The endless line was read in pieces of at most 64 KiB (a piece over the cap fills a file alone).
    kept = log.read_text() + older.read_text()
    assert max(len(line) for line in kept.split("\n")) <= 64 * 1024
    assert log.stat().st_size <= 10_000 + 64 * 1024 + 200
    assert "progress line 0000" not in kept  # the oldest output was dropped
    assert exits[0].stderr_tail.endswith("last words\n")


@pytest.mark.integration
def test_stop_says_which_workers_ignored_the_signal_and_were_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ready = tmp_path / "ready"
    stubborn = f"""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(ready)!r}, "w").close()
        time.sleep(600)
    """
    env = {**os.environ, "RANK": "7"}
    group = WorkerGroup(
        [
            WorkerSpec(local_rank=0, argv=(PY, "-c", textwrap.dedent(stubborn)), env=env),
            _spec(1, "import time; time.sleep(600)"),
        ]
    )
    group.start()
    _wait_until(ready.exists)
    pids = group.pids
    with caplog.at_level(logging.WARNING, logger="dlrover.launcher.workers"):
        exits = group.stop(grace_s=0.5)
    assert (exits[0].signal_name, exits[1].signal_name) == ("SIGKILL", "SIGTERM")
    killed = [r.getMessage() for r in caplog.records if "SIGKILL" in r.getMessage()]
    assert killed == [
        f"local rank 0 (rank 7, pid {pids[0]}) did not exit within the 0.5 s grace period after SIGTERM: "
        "sending SIGKILL"
    ]


@pytest.mark.integration
def test_a_worker_leads_its_own_process_group_in_the_agents_session(tmp_path: Path) -> None:
    # Its own group: stopping it reaches its children. The agent's session (Python >= 3.11): the
    # autogroup scheduler then ranks the agent's low-priority persist thread below the workers.
    ids_file = tmp_path / "ids"
    code = f"""
        import os, time
        open({str(ids_file)!r} + ".tmp", "w").write(f"{{os.getpgid(0)}} {{os.getsid(0)}}")
        os.rename({str(ids_file)!r} + ".tmp", {str(ids_file)!r})
        time.sleep(600)
    """
    group = WorkerGroup([_spec(0, code)])
    group.start()
    try:
        _wait_until(ids_file.exists)
        pgid, sid = (int(n) for n in ids_file.read_text().split())
        assert pgid == group.pids[0]
        if sys.version_info >= (3, 11):
            assert sid == os.getsid(0)
        else:
            assert sid == group.pids[0]
    finally:
        group.stop(grace_s=5.0)


@pytest.mark.integration
def test_workers_die_with_a_killed_agent(tmp_path: Path) -> None:
    """SIGKILL of the agent takes its workers with it (parent-death signal)."""
    pid_file = tmp_path / "worker.pid"
    agent = textwrap.dedent(
        f"""
        import os, sys, time
        from dlrover.launcher import WorkerGroup, WorkerSpec
        code = "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
        group = WorkerGroup([WorkerSpec(local_rank=0, argv=(sys.executable, "-c", code), env=dict(os.environ))])
        group.start()
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([PY, "-c", agent])
    try:
        _wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
        worker = int(pid_file.read_text())
        assert _alive(worker)
        proc.kill()
        proc.wait(timeout=30)
        _wait_until(lambda: not _alive(worker))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_empty_group_is_refused() -> None:
    with pytest.raises(DLRoverError, match="at least one worker"):
        WorkerGroup([])


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_wait_returns_when_a_worker_exits_not_when_the_interval_ends() -> None:
    # An hour-long interval: only the worker's exit can end the wait (the test's timeout fails it
    # otherwise), whether the worker is gone before the wait starts or while it waits.
    group = WorkerGroup([_spec(0, "import sys; sys.exit(7)"), _spec(1, _SLEEPER)])
    group.start()
    try:
        group.wait(3600.0)
        _wait_until(lambda: 0 in group.poll())
        assert group.poll()[0].exit_code == 7
        assert 1 not in group.poll()
        group.wait(0.05)  # the recorded exit no longer wakes it: this wait ends with its interval
    finally:
        group.stop(grace_s=1.0)
    assert group._pidfds == {}  # every exit recorded, every pidfd closed


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_wait_returns_when_its_wake_descriptor_turns_readable() -> None:
    group = WorkerGroup([_spec(0, _SLEEPER)])
    read_fd, write_fd = os.pipe()
    group.start()
    try:
        os.write(write_fd, b"x")
        group.wait(3600.0, wake_fd=read_fd)
        assert group.poll() == {}
    finally:
        group.stop(grace_s=1.0)
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.integration
def test_teed_lines_matching_a_filter_are_also_appended_to_the_attempts_filtered_log(tmp_path: Path) -> None:
    code = """
        import sys
        for word in ("apple pie", "bread", "orange, juice", "cherry"):
            print(word)
            print("err " + word, file=sys.stderr)
    """
    filters = (("apple", "orange,"), ("cherry",))
    group = WorkerGroup(
        [
            _spec(0, code, tmp_path, tee=3, prefix="[r0]:", duplicate_filters=filters, show=False),
            _spec(1, code, tmp_path, tee=2, prefix="[r1]:", duplicate_filters=filters, show=False),  # stderr only
        ]
    )
    group.start()
    _wait_until(lambda: not group.running())
    group.stop(grace_s=1.0)
    # One file per stream for the attempt (the folder above the workers' own), lines prefixed.
    assert sorted((tmp_path / "filtered_stdout.log").read_text().splitlines()) == [
        "[r0]:apple pie",
        "[r0]:orange, juice",
    ]
    assert sorted((tmp_path / "filtered_stderr.log").read_text().splitlines()) == ["[r0]:err cherry", "[r1]:err cherry"]
    assert (tmp_path / "1" / "stdout.log").read_text().count("\n") == 4  # the logs themselves are whole
