"""Where worker logs go without --log-dir, their size cap, their clean-up, and the failure line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dlrover.common import ConfigError
from dlrover.launcher import WorkerExit
from dlrover.launcher.worker_logs import (
    DEFAULT_LOG_DIR_NAME,
    LogCleanup,
    default_log_root,
    failure_line,
    remove_run_logs,
)
from dlrover.launcher.workers import CappedLogFile


def test_the_default_root_is_dlrover_logs_in_the_working_directory(tmp_path: Path) -> None:
    root, problems = default_log_root(tmp_path, {"HOME": str(tmp_path / "home")})
    assert root == tmp_path / DEFAULT_LOG_DIR_NAME
    assert root.is_dir()
    assert problems == []
    assert not (tmp_path / "home").exists()


def test_an_unwritable_working_directory_falls_back_to_the_xdg_state_dir(tmp_path: Path) -> None:
    (tmp_path / DEFAULT_LOG_DIR_NAME).write_text("a file, not a directory")
    state = tmp_path / "state"
    root, problems = default_log_root(tmp_path, {"XDG_STATE_HOME": str(state), "HOME": "/nonexistent"})
    assert root == state / "dlrover" / "logs"
    assert root.is_dir()
    assert len(problems) == 1
    assert str(tmp_path / DEFAULT_LOG_DIR_NAME) in problems[0]
    # XDG_STATE_HOME unset (or relative, which the XDG spec says to ignore): ~/.local/state.
    home = tmp_path / "home"
    root, _ = default_log_root(tmp_path, {"XDG_STATE_HOME": "relative", "HOME": str(home)})
    assert root == home / ".local" / "state" / "dlrover" / "logs"


def test_no_writable_root_says_why_for_each(tmp_path: Path) -> None:
    (tmp_path / DEFAULT_LOG_DIR_NAME).write_text("a file")
    (tmp_path / "blocked").write_text("a file")
    root, problems = default_log_root(tmp_path, {"XDG_STATE_HOME": str(tmp_path / "blocked" / "state")})
    assert root is None
    assert len(problems) == 2
    assert all(p.startswith("cannot make ") for p in problems)


def test_cleanup_policies() -> None:
    assert LogCleanup.parse("on_success") is LogCleanup.ON_SUCCESS
    assert [LogCleanup.parse(v).removes(True) for v in ("never", "on-success", "always")] == [False, True, True]
    assert [LogCleanup.parse(v).removes(False) for v in ("never", "on-success", "always")] == [False, False, True]
    with pytest.raises(ConfigError, match="'weekly'"):
        LogCleanup.parse("weekly")


def test_removing_a_run_folder_leaves_the_others_and_the_root_only_when_empty(tmp_path: Path) -> None:
    root = tmp_path / DEFAULT_LOG_DIR_NAME
    first, second = root / "run_a", root / "run_b"
    for run in (first, second):
        (run / "attempt_0" / "0").mkdir(parents=True)
        (run / "attempt_0" / "0" / "stderr.log").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (first / "link").symlink_to(outside)  # never followed
    assert remove_run_logs(first, root)
    assert not first.exists()
    assert second.exists()
    assert outside.exists()
    assert remove_run_logs(second, root)
    assert not root.exists()  # the default root this run made, now empty
    given = tmp_path / "given"
    (given / "run_c").mkdir(parents=True)
    assert remove_run_logs(given / "run_c")
    assert given.exists()  # a --log-dir stays


def test_a_capped_log_rotates_and_keeps_the_newest_output(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "stderr.log"
    log = CappedLogFile(path, max_bytes=100)
    with caplog.at_level(logging.WARNING):
        for i in range(30):
            log.write(f"line {i:02d} of output\n".encode())  # 19 bytes each
    log.close()
    older = tmp_path / "stderr.log.1"
    assert path.stat().st_size <= 100 + 200  # its note and at most the cap of output
    current, previous = path.read_text().splitlines(), older.read_text().splitlines()
    assert current[-1] == "line 29 of output"  # the end of the output, where a traceback is, is kept
    assert current[0].startswith("[dlrover-run: this file reached its cap of 100 bytes (--log-max-mb)")
    assert "stderr.log.1" in current[0]
    output = [line for line in (*previous, *current) if line.startswith("line ")]
    assert output == [f"line {i:02d} of output" for i in range(int(output[0][5:7]), 30)]  # contiguous
    assert "line 00 of output" not in output  # the oldest is dropped
    # Said once, at the first rotation.
    assert len([r for r in caplog.records if "reached its cap" in r.getMessage()]) == 1


def test_an_uncapped_log_and_a_line_longer_than_the_cap(tmp_path: Path) -> None:
    log = CappedLogFile(tmp_path / "a.log")
    for _ in range(100):
        log.write(b"x" * 1000 + b"\n")
    log.close()
    assert (tmp_path / "a.log").stat().st_size == 100 * 1001
    log = CappedLogFile(tmp_path / "b.log", max_bytes=10)
    log.write(b"y" * 50 + b"\n")  # a first line over the cap is written whole
    log.close()
    assert (tmp_path / "b.log").read_bytes() == b"y" * 50 + b"\n"


def test_the_failure_line_names_the_exception_and_where_the_whole_output_is(tmp_path: Path) -> None:
    tail = (
        "loading data\nTraceback (most recent call last):\n"
        '  File "/job/train.py", line 3, in <module>\n    step()\nValueError: bad batch\n'
        "[W destroy_process_group() was not called]\n"
    )
    failed = WorkerExit(1, 4242, 1, None, tail, log_dir=tmp_path / "attempt_0" / "1")
    assert failure_line(failed, "5") == (
        f"local rank 1 (rank 5, pid 4242) failed with exit code 1: ValueError: bad batch; its whole output: "
        f"{tmp_path / 'attempt_0' / '1' / 'stderr.log'}"
    )
    killed = WorkerExit(0, 7, 137, "SIGKILL", "")
    assert failure_line(killed) == "local rank 0 (rank ?, pid 7) failed with signal SIGKILL"
