"""Settings shared by every test suite in the repository.

Hypothesis profiles: `ci` (more examples, no deadline, derandomized so CI is repeatable) and
`dev` (fewer examples for quick runs). `HYPOTHESIS_PROFILE` picks one; `CI=true` implies `ci`.
Deadlines are off in both: tests never assert on wall time, and this machine has 2 cores.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Generator, Iterator

import pytest
from hypothesis import HealthCheck, settings

# Every test's pytest-timeout limit is also enforced from outside Python (see the plugin).
pytest_plugins = ["dlrover_testsupport.hard_timeout"]

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


# Where DLRover and torch's elastic launcher leave things a test could leak: shared memory
# (checkpoint segments, saver sockets and owner records) and temp dirs (tokens, logs, staging).
_LEAK_PATTERNS = (
    ("/dev/shm", "dlrover-*"),  # noqa: S108 (only read)
    (None, "dlrover-*"),
    (None, "torchelastic_*"),
    # dlrover-run's default worker log root, had a test run one in the repository without --log-dir.
    (os.path.dirname(os.path.abspath(__file__)), "dlrover-logs"),
)
_present_at_start: set[str] = set()


def _leakable() -> set[str]:
    import glob
    import tempfile

    found: set[str] = set()
    for where, pattern in _LEAK_PATTERNS:
        found.update(glob.glob(os.path.join(where or tempfile.gettempdir(), pattern)))
    return found


Owner = tuple[int, int | None]  # pid and start ticks (None: the process had gone when recorded)
_NO_OWNER_RECORD: Owner = (0, None)


def _owner(path: str) -> Owner | None:
    """The process that owns `path`, from a shared-memory run's owner record or an `owned_temp_dir`
    name; `_NO_OWNER_RECORD` for a run's file whose record cannot be read (nobody can clean it up
    but a sweep); None when the name says nothing about its owner."""
    import re

    name = os.path.basename(path)
    run = re.fullmatch(r"dlrover-fc\.([^.]+)\.([^.]+)\..+", name)
    owned = re.fullmatch(r"dlrover-[a-z]+-([0-9]{1,10})-([0-9]{1,20})-[0-9]{1,20}-[^/]+", name)
    if run is not None and os.path.dirname(path) == "/dev/shm":  # noqa: S108 (only read)
        record = os.path.join("/dev/shm", f"dlrover-fc.{run.group(1)}.{run.group(2)}.owner")  # noqa: S108
        try:
            with open(record) as f:
                doc = json.load(f)
            return int(doc["pid"]), doc.get("start_ticks")
        except (OSError, ValueError, KeyError, TypeError):
            return _NO_OWNER_RECORD
    if owned is not None:
        return int(owned.group(1)), int(owned.group(2))
    return None


def _owner_alive(path: str, owner: Owner | None) -> bool | None:
    """Whether `owner` (`_owner(path)`) runs; None when nothing says who owns `path`.

    Other runs on the host (a developer's second test run, a real job) share /dev/shm and, outside
    nox, the temp dir: what a live process owns is never called this run's leak.
    """
    try:
        from dlrover.common import DLRoverError, ProcessIdentity
    except ImportError:
        return None
    if owner is None:
        return None
    if owner[0] in (os.getpid(), _NO_OWNER_RECORD[0]):
        # This test process owns it and is about to exit, or nobody does: a leak all the same.
        return False
    try:
        return ProcessIdentity(owner[0], owner[1]).alive()
    except DLRoverError:
        return False


# Set for the session and inherited by every process a test starts (unless a test hands one a
# fresh environment), so one that outlives its parent, re-parented to init, is still found. A
# process detached on purpose (a flashckpt detached saver) counts too: tests wait for theirs.
_SESSION_MARKER = "PYTEST_DLROVER_SESSION"
# A process whose environment holds this belongs to a module- or session-scoped fixture that
# checks at its own teardown that its processes are gone (the Ray test cluster: nodes a test adds,
# pooled workers): the per-test check leaves it to that fixture; the session's check still counts it.
_HELD_MARKER = b"PYTEST_DLROVER_HELD_BY_FIXTURE=1"
# This session's processes that carry `_HELD_MARKER`, as of the last scan.
_held_now: set[int] = set()


@functools.cache
def _ancestors() -> frozenset[int]:
    """This process's parents up to init (a `timeout ... pytest` wrapper is not another run)."""
    found: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[-1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return frozenset(found)


def _scan_processes() -> tuple[list[tuple[int, int, str]], bool]:
    """This session's running processes other than this one (zombies excluded): children of this
    process, those whose environment holds this session's marker, and their descendants, as (pid,
    start ticks, cmdline); and whether another test run is going on beside this one (a process with
    another session's marker, or another pytest: its own process never shows the marker it set).

    A process's environment as /proc shows it can be overwritten: one that sets its process title
    (Ray's agents do) writes over the start of it, and which variables are lost depends on their
    order. So a child is ours, and held by a fixture, when its parent is, whatever its own
    environment still shows.
    """
    me = os.getpid()
    mine = f"{_SESSION_MARKER}={os.environ.get(_SESSION_MARKER, '')}".encode()
    prefix = f"{_SESSION_MARKER}=".encode()
    # pid -> (parent pid, start ticks, own marker, another session's marker, held marker, cmdline)
    seen: dict[int, tuple[int, int, bool, bool, bool, bytes]] = {}
    _held_now.clear()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [], False
    for entry in entries:
        if not entry.isdigit() or int(entry) in _ancestors():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[-1].split()
            if fields[0] == "Z":
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as env_file:
                    environ = env_file.read().split(b"\0")
            except OSError:  # another user's process
                environ = []
            markers = [v for v in environ if v.startswith(prefix)]
            with open(f"/proc/{entry}/cmdline", "rb") as cmd_file:
                cmdline = cmd_file.read().replace(b"\0", b" ")
            seen[int(entry)] = (
                int(fields[1]),
                int(fields[19]),
                mine in markers,
                any(v != mine for v in markers),
                _HELD_MARKER in environ,
                cmdline,
            )
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    verdicts: dict[int, tuple[bool, bool]] = {}

    def ours_and_held(pid: int) -> tuple[bool, bool]:
        """Whether `pid` is this session's, and whether a fixture holds it."""
        if pid not in verdicts:
            verdicts[pid] = (False, False)  # a pid cycle (reuse between reads) ends here
            ppid, _, own, foreign, held_marker, _ = seen[pid]
            parent = ours_and_held(ppid) if ppid in seen else (False, False)
            is_ours = own or ppid == me or (not foreign and parent[0])
            verdicts[pid] = (is_ours, is_ours and (held_marker or parent[1]))
        return verdicts[pid]

    ours: list[tuple[int, int, str]] = []
    others = False
    for pid, (_, ticks, _, foreign, _, raw_cmdline) in seen.items():
        is_ours, held = ours_and_held(pid)
        if is_ours:
            if held:
                _held_now.add(pid)
            ours.append((pid, ticks, raw_cmdline.decode("utf-8", "replace").strip()))
        elif foreign or b"pytest" in raw_cmdline:
            others = True
    return ours, others


# Every process of this session a check has seen, by (pid, start ticks): a file whose owner is
# gone is this session's leak when its owner was one of them.
_seen_ours: set[tuple[int, int]] = set()


def _left_running() -> tuple[list[tuple[int, str]], bool]:
    """This session's running processes as (pid, cmdline), noted in `_seen_ours`; and whether
    another session runs beside this one."""
    ours, others = _scan_processes()
    _seen_ours.update((pid, ticks) for pid, ticks, _ in ours)
    return sorted((pid, cmdline) for pid, _, cmdline in ours), others


def _ours(owner: Owner | None) -> bool:
    """Whether this session made the file `owner` owns: this process, or one a check saw running."""
    if owner is None or owner == _NO_OWNER_RECORD:
        return False
    if owner[0] == os.getpid():
        return True
    if owner[1] is None:
        return any(pid == owner[0] for pid, _ in _seen_ours)
    return (owner[0], owner[1]) in _seen_ours


# How long what a test started may take to finish exiting and cleaning up after itself: polled,
# so a clean test costs one look. A detached saver told to shut down first finishes the persists
# it has queued, and a Python process with torch loaded takes seconds to exit on 2 busy cores.
_GRACE_S = 30.0
_POLL_S = 0.05
# Files a test's own check reported and kept (no owner to judge by), so the session's check does
# not report them again.
_reported: set[str] = set()
# Processes and files a module-, class- or session-scoped fixture made while it was set up: they
# outlive the test that first asked for the fixture, so no single test is to blame for them.
_held_by_wider_fixtures: set[int | str] = set()


def _pids() -> set[int]:
    return {pid for pid, _ in _left_running()[0]}


def _leaks_since(
    pids_before: set[int], ignored: set[int | str], others: bool, spare_held: bool = False
) -> tuple[list[tuple[int, str]], dict[str, bool | None]]:
    """Processes still running and files whose owner is gone (or unknown), apart from those there
    before or ignored, once whatever is still exiting is done or the grace is over.

    While another session runs beside this one (`others`, or seen now), a file whose owner is gone
    or unknown counts only if its owner was this session's: the other session's may be waiting
    for a later step of its own test.

    A file is called dead only after two looks in a row: another run writes its owner record
    beside its files, and for a moment there is none. With `spare_held`, processes marked as held
    by a wider fixture (`_HELD_MARKER`) are that fixture's to check.
    """
    import time

    deadline = time.monotonic() + _GRACE_S
    dead_before: set[str] = set()
    while True:
        running, now_others = _left_running()
        others = others or now_others
        procs = [
            p
            for p in running
            if p[0] not in pids_before and p[0] not in ignored and not (spare_held and p[0] in _held_now)
        ]
        owners = {path: _owner(path) for path in sorted(_leakable() - ignored)}
        alive = {path: _owner_alive(path, owner) for path, owner in owners.items()}
        dead = {path for path, a in alive.items() if not a and (not others or _ours(owners[path]))}
        files = {path: alive[path] for path in dead & dead_before}
        if (not procs and len(files) == len(dead)) or time.monotonic() >= deadline:
            return procs, files
        dead_before = dead
        time.sleep(_POLL_S)


def _end_processes(procs: list[tuple[int, str]]) -> list[str]:
    """SIGKILL leftover processes of this session, by pid, and wait (bounded) until they are gone,
    so the files they owned can be judged; returns the report lines."""
    import signal
    import time

    lines = []
    for pid, cmdline in procs:
        lines.append(f"  {pid}: {cmdline[:200]}")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    pids = {pid for pid, _ in procs}
    deadline = time.monotonic() + _GRACE_S
    while pids & _pids() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return lines


def _remove_files(files: dict[str, bool | None]) -> list[str]:
    """Remove leaked files whose owner is gone; returns the report lines.

    One with no owner to judge by may be another run's, so it is kept (and reported once).
    """
    import shutil

    lines = []
    for path, alive in sorted(files.items()):
        if alive is None:
            lines.append(f"  {path} (kept)")
            _reported.add(path)
            continue
        lines.append(f"  {path} (its owner is gone: removed)")
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return lines


def _clean_up(pids_before: set[int], ignored: set[int | str], others: bool, spare_held: bool = False) -> list[str]:
    """End and remove what leaked since a snapshot (`_leaks_since`); returns the report, empty when
    nothing did."""
    ignored = ignored | _reported
    procs, files = _leaks_since(pids_before, ignored, others, spare_held)
    report = []
    if procs:
        report += ["processes left behind (a leak):", *_end_processes(procs)]
        # The files the ended processes owned are ownerless now: judge them again.
        _, files = _leaks_since(pids_before, ignored, others, spare_held)
    if files:
        report += ["files left behind (a leak):", *_remove_files(files)]
    return report


def pytest_sessionstart(session: object) -> None:
    """Note what is already there, so only what the tests leave is called a leak; mark this
    session's processes."""
    import uuid

    _present_at_start.update(_leakable())
    os.environ[_SESSION_MARKER] = uuid.uuid4().hex


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    """Note what a wider-scoped fixture makes while it is set up (see `_held_by_wider_fixtures`)."""
    if fixturedef.scope == "function":
        return (yield)
    pids, files = _pids(), _leakable()
    try:
        return (yield)
    finally:
        made = (_pids() - pids) | (_leakable() - files)
        _held_by_wider_fixtures.update(made)
        # Registered after the fixture's own teardown, so it runs first: once the fixture is gone,
        # a reused pid or name is judged afresh.
        fixturedef.addfinalizer(lambda: _held_by_wider_fixtures.difference_update(made))


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    """Fail the test that left a process, shared memory or a temp dir behind, at its teardown.

    An autouse fixture of the root conftest is set up after wider-scoped fixtures and before the
    test's other fixtures, and torn down after them: what their teardown leaves is the test's. A
    leak is ended and removed at once, so the tests after it start clean.
    """
    running, others = _left_running()
    pids = {pid for pid, _ in running}
    files: set[int | str] = set(_leakable())
    yield
    report = _clean_up(pids, files | _held_by_wider_fixtures, others, spare_held=True)
    if report:
        pytest.fail("\n".join(report), pytrace=False)


@pytest.fixture(autouse=True)
def _dlrover_logging_restored() -> Iterator[None]:
    """Undo what a command run in-process did to the `dlrover` logger.

    `configure_logging` (every CLI's `main`) writes the package's logs to the `sys.stderr` of the
    moment, which under pytest is the test's capture, closed at its end: left in place, every
    later test's logs would go to a closed stream ("I/O operation on closed file") rather than
    to pytest.
    """
    import logging

    logger = logging.getLogger("dlrover")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    """Fail the run if anything left a process (a child, or an orphan of this session), shared
    memory or a temp dir behind: the backstop of `_no_leaks`, for what wider-scoped fixtures and
    hooks leave.

    Leftover processes are killed and files whose owner is gone removed, so CI is not held up and
    later runs start clean.
    """
    # While another test run on this host is live, only what this session made is judged: its
    # files are not ours to report or remove.
    _, others = _left_running()
    report = _clean_up(set(), set(_present_at_start), others=others)
    if report:
        print("\nleft behind by the tests, found at the end of the session:\n" + "\n".join(report))
        session.exitstatus = 1  # type: ignore[attr-defined]
