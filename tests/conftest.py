"""Fixtures of the cross-package tests: processes they start, and `dlrover-run --standalone` with
one command line and one environment for every test that runs the launcher on one node."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest


@pytest.fixture(autouse=True, scope="session")
def _own_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Masters that run with an environment stripped of DLROVER_* variables keep their default profile store
    ($XDG_CACHE_HOME/dlrover) in this session's own directory, never the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(autouse=True)
def _own_profile_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's masters record and plan from a store of their own, never the user's ~/.cache one."""
    store = tmp_path_factory.mktemp("profiles") / "profiles.sqlite"
    monkeypatch.setenv("DLROVER_PROFILE_STORE", str(store))


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[str]]]:
    """A list to add started processes to; each one still running is killed with its session at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Masters a test starts (each in its own session); at the end each is stopped as a person stops a
    job (SIGTERM: it stops its agents), killed after 90 s, and anything it started that still runs is
    killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    descendants: list[psutil.Process] = []
    for proc in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            descendants += psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for child in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


@pytest.fixture
def dlrover_run(spawn: list[subprocess.Popen[str]]) -> Callable[..., subprocess.Popen[str]]:
    """`dlrover_run(run_dir, *args, log_dir=True)`: `dlrover-run --standalone --nproc-per-node=2` started
    in `run_dir` with `args`, its output piped, cleaned up with `spawn`."""
    return functools.partial(_start_dlrover_run, spawn)


def _start_dlrover_run(
    spawn: list[subprocess.Popen[str]], run_dir: Path, *args: str, log_dir: bool = True
) -> subprocess.Popen[str]:
    # Without `log_dir` no --log-dir is given, so the worker logs go to ./dlrover-logs in `run_dir`.
    cmd = [
        sys.executable, "-m", "dlrover.launcher.cli", "--standalone", "--nproc-per-node=2",
        *([f"--log-dir={run_dir / 'logs'}"] if log_dir else []),
        "--monitor-interval=0.05", "--heartbeat-interval=0.5", *args,
    ]  # fmt: skip
    env = {**os.environ, "DLROVER_LOG_LEVEL": "INFO"}
    env.pop("DLROVER_JOB_TOKEN", None)
    env.pop("DLROVER_JOB_TOKEN_FILE", None)
    proc = subprocess.Popen(
        cmd, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    spawn.append(proc)
    return proc
