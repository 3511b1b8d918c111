"""A detached saver no stager ever connects to exits on its own and removes what it created."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    shm = tmp_path / "shm"
    shm.mkdir()
    cmd = [sys.executable, "-m", "dlrover.flashckpt.saver_main", "--job", "j", "--run", "r"]
    cmd += ["--storage-dir", str(tmp_path / "ckpt"), "--shm-dir", str(shm), "--nice", "0", *extra]
    # Before the fix it never exits: the bound turns that into a failure instead of a hang.
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def test_a_saver_nobody_connects_to_exits_and_cleans_up(tmp_path: Path) -> None:
    done = _run(tmp_path, "--idle-exit-s", "0.5")  # the first-connection bound defaults to it
    assert done.returncode == 0, done.stderr
    assert "no stager connected within 0.5s" in done.stderr
    assert list((tmp_path / "shm").iterdir()) == []  # no socket, no owner record left


def test_a_bad_first_connect_timeout_is_refused(tmp_path: Path) -> None:
    done = _run(tmp_path, "--first-connect-timeout-s", "0")
    assert done.returncode == 2
    assert "--first-connect-timeout-s must be a positive number of seconds, got 0.0" in done.stderr
    assert list((tmp_path / "shm").iterdir()) == []


def test_the_failure_join_window_is_configurable_and_checked(tmp_path: Path) -> None:
    done = _run(tmp_path, "--failure-join-s", "-1")
    assert done.returncode == 2
    assert "--failure-join-s must be a non-negative number of seconds, got -1.0" in done.stderr
    off = tmp_path / "off"
    off.mkdir()
    done = _run(off, "--failure-join-s", "0", "--idle-exit-s", "0.5")  # 0 turns joining off
    assert done.returncode == 0, done.stderr


def test_a_bad_persist_rate_is_refused_with_a_message(tmp_path: Path) -> None:
    done = _run(tmp_path, "--persist-bandwidth-mb-s", "-5")
    assert done.returncode == 2
    assert "bad saver settings" in done.stderr
    assert "persist_bandwidth_mb_s" in done.stderr
    assert "Traceback" not in done.stderr
    assert list((tmp_path / "shm").iterdir()) == []
