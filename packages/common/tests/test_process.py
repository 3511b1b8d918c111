"""Process identities read from /proc (dlrover.common.process), checked against real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from dlrover.common import (
    ConfigError,
    ProcessIdentity,
    exiting_status,
    pid_namespace,
    proc_stat_fields,
    process_start_ticks,
    processes_mentioning,
)

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc"),
]

WAIT_S = 30.0
# Blocks until stdin closes; renames itself first when given a name (/proc/self/comm, 15 bytes).
_BLOCKER = (
    "import sys\n"
    "if len(sys.argv) > 1 and sys.argv[1]:\n"
    "    open('/proc/self/comm', 'w').write(sys.argv[1])\n"
    "print('ready', flush=True)\n"
    "if len(sys.argv) > 2:\n"  # 'exit-on-line': a line 'exit N' ends it with status N
    "    sys.exit(int(sys.stdin.readline().split()[1]))\n"
    "sys.stdin.read()\n"
)


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {WAIT_S} s")
        time.sleep(0.01)


@pytest.fixture
def blocker() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts children that run until their stdin closes; reaps them all at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BLOCKER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        started.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=WAIT_S)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _state(pid: int) -> str | None:
    fields = proc_stat_fields(pid)
    return fields[0] if fields else None


def test_this_process_has_a_start_time_and_is_alive() -> None:
    me = ProcessIdentity.current()
    assert me is not None
    assert me.pid == os.getpid()
    assert me.start_ticks == process_start_ticks(os.getpid())
    assert me.alive()
    assert ProcessIdentity.of(os.getpid()) == me


def test_a_reaped_process_is_gone_and_its_identity_is_dead(blocker: Callable[..., subprocess.Popen[str]]) -> None:
    proc = blocker()
    identity = ProcessIdentity.of(proc.pid)
    assert identity is not None
    assert identity.alive()
    proc.communicate("", timeout=WAIT_S)  # closes stdin: it exits, and is reaped
    assert process_start_ticks(proc.pid) is None or ProcessIdentity.of(proc.pid) != identity  # pid maybe reused
    assert not identity.alive()


def test_a_zombie_still_has_its_start_time_but_is_not_alive(blocker: Callable[..., subprocess.Popen[str]]) -> None:
    proc = blocker()
    identity = ProcessIdentity.of(proc.pid)
    assert identity is not None
    assert proc.stdin is not None
    proc.stdin.close()  # it exits; not reaped until wait()
    _wait_for(lambda: _state(proc.pid) == "Z", "child became a zombie")
    assert process_start_ticks(proc.pid) == identity.start_ticks
    assert not identity.alive()
    proc.wait(timeout=WAIT_S)


def test_processes_mentioning_finds_live_children_by_argument_but_not_zombies_or_itself(
    blocker: Callable[..., subprocess.Popen[str]],
) -> None:
    token = f"mention-{os.getpid()}-{time.monotonic_ns()}"
    first, second = blocker(token), blocker(token + "x")
    assert sorted(processes_mentioning(token)) == sorted([first.pid, second.pid])
    assert processes_mentioning(token + "x") == [second.pid]
    assert processes_mentioning("no-such-" + token) == []
    assert os.getpid() not in processes_mentioning(sys.executable)  # the caller never counts itself
    assert first.stdin is not None
    first.stdin.close()  # exits; a zombie until reaped
    _wait_for(lambda: _state(first.pid) == "Z", "child became a zombie")
    assert processes_mentioning(token) == [second.pid]
    first.wait(timeout=WAIT_S)


def test_the_same_pid_with_another_start_time_is_another_process() -> None:
    me = ProcessIdentity.current()
    assert me is not None
    assert not ProcessIdentity(me.pid, me.start_ticks + 1).alive()


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(
    blocker: Callable[..., subprocess.Popen[str]],
) -> None:
    proc = blocker(") ( 1 2 ) (x")  # what a naive split on the first ')' or on spaces gets wrong
    with open(f"/proc/{proc.pid}/comm") as f:
        assert f.read().rstrip("\n") == ") ( 1 2 ) (x"
    fields = proc_stat_fields(proc.pid)
    mine = proc_stat_fields(os.getpid())
    assert fields is not None
    assert mine is not None
    assert len(fields) == len(mine)
    assert fields[0] in "RSD"  # the state, not a piece of the name
    assert int(fields[1]) == os.getpid()  # the parent pid comes right after the state
    identity = ProcessIdentity.of(proc.pid)
    assert identity is not None
    assert identity.alive()


def _exited_unreaped(proc: subprocess.Popen[str]) -> None:
    """Block until `proc` has exited, leaving it a zombie: its exit status stays readable."""
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


@pytest.mark.parametrize(
    ("how", "status"),
    [(signal.SIGKILL, signal.SIGKILL), (signal.SIGTERM, signal.SIGTERM), (3, 3 << 8), (0, 0)],
    ids=["sigkill", "sigterm", "exit-3", "exit-0"],
)
def test_an_exiting_process_shows_its_wait_status_before_it_is_reaped(
    blocker: Callable[..., subprocess.Popen[str]], how: int, status: int
) -> None:
    proc = blocker("", "exit-on-line")
    assert exiting_status(proc.pid) is None  # running
    if isinstance(how, signal.Signals):
        os.kill(proc.pid, how)
    else:
        assert proc.stdin is not None
        proc.stdin.write(f"exit {how}\n")
        proc.stdin.flush()
    _exited_unreaped(proc)
    assert exiting_status(proc.pid) == status
    proc.wait()
    assert os.waitstatus_to_exitcode(status) == proc.returncode
    assert exiting_status(proc.pid) is None  # reaped: gone


def test_a_running_process_and_a_missing_one_are_not_exiting() -> None:
    assert exiting_status(os.getpid()) is None
    assert exiting_status(2**22 + 12345) is None


def test_no_such_process_gives_none() -> None:
    missing = 2**22 + 12345  # above the largest pid Linux hands out (pid_max <= 2**22)
    assert proc_stat_fields(missing) is None
    assert process_start_ticks(missing) is None
    assert ProcessIdentity.of(missing) is None
    assert not ProcessIdentity(missing, 1).alive()


@pytest.mark.parametrize(("pid", "ticks"), [(0, 1), (-1, 1), (1, -1), (1.5, 1), (True, 1), (1, "1")])
def test_a_bad_identity_is_refused_naming_the_value(pid: object, ticks: object) -> None:
    with pytest.raises(ConfigError, match=r"must be a (positive|non-negative) integer, got"):
        ProcessIdentity(pid, ticks)  # type: ignore[arg-type]


def test_the_pid_namespace_is_this_process_s_and_shared_with_children() -> None:
    namespace = pid_namespace()
    assert namespace is not None
    assert namespace > 0
    out = subprocess.run(
        [sys.executable, "-c", "from dlrover.common import pid_namespace; print(pid_namespace())"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    )
    assert int(out.stdout) == namespace


def test_the_process_and_temp_dir_helpers_do_not_import_grpc_or_protobuf() -> None:
    # Flash checkpoint segments use them in training processes, which restart on a failure.
    from dlrover.common.lazy import modules_loaded_by

    statement = "from dlrover.common import ProcessIdentity, owned_temp_dir, process_start_ticks, remove_dead_owners"
    assert modules_loaded_by(statement) == []
