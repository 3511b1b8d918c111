"""The hard-timeout plugin, in pytest runs of its own: a test no SIGALRM can reach is stopped with
every thread's stack; a test within its limit is not, nor is the one after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_SRC = Path(__file__).resolve().parents[1] / "src"

_STUCK = """
import signal, time
import pytest

@pytest.mark.timeout(1)
def test_stuck_where_no_signal_reaches():
    # As a thread waiting on the GIL would: pytest-timeout's SIGALRM never runs its handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)
"""

_WITHIN = """
import time
import pytest

@pytest.mark.timeout(1)
def test_quick():
    pass

def test_longer_than_the_quick_ones_hard_limit():
    # Unarmed (no limit here): a timer test_quick left armed would end the run.
    time.sleep(4)
"""

_STUCK_AFTER_A_FAILURE = """
import signal, time
import pytest

@pytest.fixture
def stuck_teardown():
    yield
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)

@pytest.mark.timeout(1)
def test_fails_then_sticks_in_its_teardown(stuck_teardown):
    # pytest's faulthandler plugin cancels the timer when a test fails; the teardown is armed again.
    assert False
"""


def _pytest(tmp_path: Path, source: str, grace: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_case.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(_SRC), "DLROVER_TEST_HARD_TIMEOUT_GRACE_S": grace}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "dlrover_testsupport.hard_timeout",
         "-o", "timeout_method=signal", "--rootdir", str(tmp_path), "-c", os.devnull, "test_case.py"],
        check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.timeout(150)
def test_a_test_no_signal_reaches_is_stopped_with_every_threads_stack(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _STUCK, grace="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Timeout (" in done.stderr
    assert "test_stuck_where_no_signal_reaches" in done.stderr  # the stuck frame, named


@pytest.mark.timeout(150)
def test_a_teardown_stuck_after_a_failure_is_stopped_too(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _STUCK_AFTER_A_FAILURE, grace="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Timeout (" in done.stderr
    assert "stuck_teardown" in done.stderr


@pytest.mark.timeout(150)
def test_a_test_within_its_limit_is_not_stopped_nor_is_the_next(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _WITHIN, grace="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert "Timeout (" not in done.stderr


@pytest.mark.timeout(150)
def test_a_grace_that_is_not_a_number_is_refused_by_name(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _WITHIN, grace="soon")
    assert done.returncode != 0
    assert "DLROVER_TEST_HARD_TIMEOUT_GRACE_S must be a number of seconds, got 'soon'" in done.stdout + done.stderr
