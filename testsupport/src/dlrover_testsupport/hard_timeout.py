"""A pytest plugin: a test that outlives its pytest-timeout limit by a grace is stopped from outside Python.

pytest-timeout's ``signal`` method raises in the main thread from a SIGALRM handler, which only runs
when that thread gets back to the interpreter. A native deadlock (a thread waiting for the GIL
while another holds it and waits for it in turn, as a gloo thread and a DDP model freed after its
process group once did) never gets there: the run hangs until CI's own limit, with no word of
where. This plugin arms `faulthandler.dump_traceback_later` for each test at its limit plus a
grace: faulthandler's watchdog is a C thread that needs no GIL, so it prints every thread's stack
and ends the process (exit status 1) whatever the interpreter is stuck in.

The grace (``DLROVER_TEST_HARD_TIMEOUT_GRACE_S``, 120 s by default) leaves pytest-timeout the first
word: it fails the test and the run goes on; the hard stop only ends a run that nothing else can.
The grace also bounds the teardown of a test that pytest-timeout failed (its alarm fires once),
such as a Ray cluster's shutdown, hence two minutes.
The limit is the test's ``@pytest.mark.timeout(N)``, else ``--timeout``, else the ``timeout`` ini
value; a test without one (0) is not armed.
"""

from __future__ import annotations

import faulthandler
import math
import os
import sys
import time
from collections.abc import Generator

import pytest

__all__ = ["GRACE_ENV", "DEFAULT_GRACE_S", "hard_limit_s"]

GRACE_ENV = "DLROVER_TEST_HARD_TIMEOUT_GRACE_S"
DEFAULT_GRACE_S = 120.0


def _grace_s() -> float:
    raw = os.environ.get(GRACE_ENV, "")
    if not raw:
        return DEFAULT_GRACE_S
    try:
        grace = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{GRACE_ENV} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(grace) or grace < 0:
        raise pytest.UsageError(f"{GRACE_ENV} must be a finite number of seconds of at least 0, got {raw!r}")
    return grace


def _timeout_s(item: pytest.Item) -> float:
    # pytest-timeout's order: the marker, --timeout, PYTEST_TIMEOUT, the ini value.
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    env = os.environ.get("PYTEST_TIMEOUT", "")
    if env:
        return float(env)
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:  # no pytest-timeout: no ini value of that name
        return 0.0


def _debugging(config: pytest.Config) -> bool:
    """A person is stepping through the run: pytest-timeout stands aside then, and so does this."""
    if config.getoption("usepdb", False) or config.getoption("trace", False):
        return True
    try:
        from pytest_timeout import is_debugging  # type: ignore[import-untyped]
    except ImportError:
        return False
    return bool(is_debugging())


def hard_limit_s(item: pytest.Item) -> float | None:
    """When `item` is stopped from outside Python, in seconds from its start; None: never."""
    limit = _timeout_s(item)
    return limit + item.config.stash.get(_grace, DEFAULT_GRACE_S) if limit > 0 else None


_stderr_fd = pytest.StashKey[int]()
_grace = pytest.StashKey[float]()
_deadline = pytest.StashKey[float]()  # on an armed item: time.monotonic() when the run is ended


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_grace] = _grace_s()  # a bad value stops the run before any test
    # A descriptor of the terminal's stderr taken before any test runs: while a test runs, pytest's
    # capture points fd 2 at a file that dies unread with the process.
    config.stash[_stderr_fd] = os.dup(sys.__stderr__.fileno() if sys.__stderr__ is not None else 2)


def pytest_unconfigure(config: pytest.Config) -> None:
    fd = config.stash.get(_stderr_fd, None)
    if fd is not None:
        os.close(fd)
        del config.stash[_stderr_fd]


def _arm(item: pytest.Item) -> None:
    deadline = item.stash.get(_deadline, None)
    fd = item.config.stash.get(_stderr_fd, None)
    if deadline is not None and fd is not None:
        faulthandler.dump_traceback_later(max(deadline - time.monotonic(), 0.001), exit=True, file=fd)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    limit = hard_limit_s(item)
    if limit is not None and not _debugging(item.config):
        item.stash[_deadline] = time.monotonic() + limit
        _arm(item)
    try:
        return (yield)
    finally:
        if item.stash.get(_deadline, None) is not None:
            del item.stash[_deadline]
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # A failed setup or call cancels the timer: pytest's faulthandler plugin cancels it in
    # pytest_exception_interact, whoever armed it. The teardown is bounded again, to the same end.
    if not _debugging(item.config):
        _arm(item)
