"""Settings shared by every test suite in the repository.

Hypothesis profiles: `ci` (more examples, no deadline, derandomized so CI is repeatable) and
`dev` (fewer examples for quick runs). `HYPOTHESIS_PROFILE` picks one; `CI=true` implies `ci`.
Deadlines are off in both: tests never assert on wall time, and this machine has 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def _live_children(pid: int) -> list[tuple[int, str]]:
    """Direct children of `pid` that are still running (zombies excluded), from /proc."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[0] != "Z" and int(fields[1]) == pid:
            found.append((int(entry), cmdline))
    return found


# Where DLRover and torch's elastic launcher leave things a test could leak: shared memory
# (checkpoint segments, saver sockets and owner records) and temp dirs (tokens, logs, staging).
_LEAK_PATTERNS = (("/dev/shm", "dlrover-*"), (None, "dlrover-*"), (None, "torchelastic_*"))  # noqa: S108 (only read)
_present_at_start: set[str] = set()


def _leakable() -> set[str]:
    import glob
    import tempfile

    found: set[str] = set()
    for where, pattern in _LEAK_PATTERNS:
        found.update(glob.glob(os.path.join(where or tempfile.gettempdir(), pattern)))
    return found


def _owner_alive(path: str) -> bool | None:
    """Whether the process that owns `path` runs: from a shared-memory run's owner record, or an
    `owned_temp_dir` name; None when the name says nothing about its owner.

    Other runs on the host (a developer's second test run, a real job) share /dev/shm and, outside
    nox, the temp dir: what a live process owns is never called this run's leak.
    """
    import re

    name = os.path.basename(path)
    try:
        from dlrover.common import DLRoverError, ProcessIdentity
    except ImportError:
        return None
    owner: tuple[int, int | None] | None = None
    run = re.fullmatch(r"dlrover-fc\.([^.]+)\.([^.]+)\..+", name)
    owned = re.fullmatch(r"dlrover-[a-z]+-([0-9]{1,10})-([0-9]{1,20})-[0-9]{1,20}-[^/]+", name)
    if run is not None and os.path.dirname(path) == "/dev/shm":  # noqa: S108 (only read)
        record = os.path.join("/dev/shm", f"dlrover-fc.{run.group(1)}.{run.group(2)}.owner")  # noqa: S108
        try:
            with open(record) as f:
                doc = json.load(f)
            owner = (int(doc["pid"]), doc.get("start_ticks"))
        except (OSError, ValueError, KeyError, TypeError):
            return False  # no readable owner record: nobody can clean it up but a sweep
    elif owned is not None:
        owner = (int(owned.group(1)), int(owned.group(2)))
    if owner is None:
        return None
    if owner[0] == os.getpid():
        return False  # this test process owns it and is about to exit: a leak all the same
    try:
        return ProcessIdentity(owner[0], owner[1]).alive()
    except DLRoverError:
        return False


# Set for the session and inherited by every process a test starts (unless a test hands one a
# fresh environment), so one that outlives its parent, re-parented to init, is still found. A
# process detached on purpose (a flashckpt detached saver) counts too: tests wait for theirs.
_SESSION_MARKER = "PYTEST_DLROVER_SESSION"


def _marked_processes(marker: str) -> list[tuple[int, str]]:
    """Running processes (zombies excluded) other than this one whose environment holds `marker`."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[-1].split()[0]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:  # gone meanwhile, or another user's
            continue
        if state != "Z":
            found.append((int(entry), cmdline))
    return found


def _left_running() -> list[tuple[int, str]]:
    marker = f"{_SESSION_MARKER}={os.environ.get(_SESSION_MARKER, '')}"
    return sorted(set(_live_children(os.getpid())) | set(_marked_processes(marker)))


def pytest_sessionstart(session: object) -> None:
    """Note what is already there, so only what the tests leave is called a leak; mark this
    session's processes."""
    import uuid

    _present_at_start.update(_leakable())
    os.environ[_SESSION_MARKER] = uuid.uuid4().hex


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    """Fail the run if any test left a process (a child, or an orphan of this session), shared
    memory or a temp dir behind.

    Leftover processes are killed and files whose owner is gone removed, so CI is not held up and
    later runs start clean.
    """
    import shutil
    import signal
    import time

    deadline = time.monotonic() + 5.0
    leftovers = _left_running()
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.1)
        leftovers = _left_running()
    if leftovers:
        print("\nprocesses left behind by the tests (a leak):")
        for pid, cmdline in leftovers:
            print(f"  {pid}: {cmdline[:200]}")
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        session.exitstatus = 1  # type: ignore[attr-defined]
    owners = {path: _owner_alive(path) for path in sorted(_leakable() - _present_at_start)}
    left = [path for path, alive in owners.items() if not alive]
    if left:
        print("\nfiles left behind by the tests (a leak):")
        for path in left:
            if owners[path] is None:  # no owner to judge by: maybe another run's, so kept
                print(f"  {path} (kept)")
                continue
            print(f"  {path} (its owner is gone: removed)")
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        session.exitstatus = 1  # type: ignore[attr-defined]
