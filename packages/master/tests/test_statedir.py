"""One master per state directory, and everything in it private to its owner."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlrover.common import ManualClock, RetryPolicy, RpcError, load_token
from dlrover.master import (
    LOCK_FILE_NAME,
    EventLog,
    EventLogInUseError,
    LifecycleConfig,
    LockHolder,
    MasterClient,
    MasterConfig,
    NodeRange,
    SqliteJournal,
    StateDirError,
    StateDirInUseError,
    StateDirLock,
    create_master,
)
from dlrover.master.cli import main
from dlrover.master.exits import EXIT_RETRY
from dlrover.master.scheduler.base import NodeSpec
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.master.scheduler.local import LocalScheduler

CLOCK = ManualClock(wall_start=1_800_000_000.0)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.05)


# ---------------------------------------------------------------- the lock itself


def test_the_lock_creates_a_private_directory_and_names_its_holder(tmp_path: Path) -> None:
    state = tmp_path / "a" / "state"
    with StateDirLock.acquire(state, job_name="job1", clock=CLOCK, host="h1", pid=4242) as lock:
        assert lock.held
        assert mode_of(state) == 0o700
        assert mode_of(lock.path) == 0o600
        holder = LockHolder.from_json(lock.path.read_text())
        assert holder == LockHolder(pid=4242, host="h1", job_name="job1", started_wall_time=1_800_000_000.0)
        assert sorted(p.name for p in state.iterdir()) == [LOCK_FILE_NAME]
    assert not lock.held


def test_a_second_lock_is_refused_naming_the_holder_and_changes_nothing(tmp_path: Path) -> None:
    with StateDirLock.acquire(tmp_path / "s", job_name="job1", clock=CLOCK, host="h1", pid=4242) as first:
        before = first.path.read_bytes()
        with pytest.raises(StateDirInUseError) as info:
            StateDirLock.acquire(tmp_path / "s", job_name="job2", clock=CLOCK, host="h2", pid=7)
        message = str(info.value)
        assert "pid 4242 on host h1" in message
        assert "job1" in message
        assert "2027-01-15" in message
        assert info.value.holder == first.holder
        assert first.path.read_bytes() == before
    # Released: the next one gets it.
    StateDirLock.acquire(tmp_path / "s", job_name="job2", clock=CLOCK).release()


def test_a_lock_dropped_without_release_is_released_when_collected(tmp_path: Path) -> None:
    def acquire_and_drop() -> None:
        StateDirLock.acquire(tmp_path / "s", job_name="dropped", clock=CLOCK)

    with pytest.warns(ResourceWarning):  # said, as any file left open is
        acquire_and_drop()
    gc.collect()
    StateDirLock.acquire(tmp_path / "s", job_name="next", clock=CLOCK).release()


def test_a_lock_file_left_by_a_dead_master_does_not_block(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    (state / LOCK_FILE_NAME).write_text(
        json.dumps({"pid": 1, "host": "gone", "job_name": "old", "started_wall_time": 0})
    )
    with StateDirLock.acquire(state, job_name="new", clock=CLOCK) as lock:
        assert LockHolder.from_json(lock.path.read_text()).job_name == "new"


def test_a_sigkilled_holder_releases_the_lock(tmp_path: Path) -> None:
    state = tmp_path / "s"
    code = (
        "import sys; from dlrover.common import SystemClock; from dlrover.master import StateDirLock\n"
        "lock = StateDirLock.acquire(sys.argv[1], job_name='child', clock=SystemClock())\n"
        "print('locked', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(state)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(StateDirInUseError, match=f"pid {child.pid} on host {re.escape(socket.gethostname())}"):
            StateDirLock.acquire(state, job_name="me", clock=CLOCK)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        StateDirLock.acquire(state, job_name="me", clock=CLOCK).release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.close()
        child.stdout.close()


def test_a_directory_open_to_others_is_refused_and_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    state.chmod(0o755)
    with pytest.raises(StateDirError, match=r"mode 0755.*chmod 700"):
        StateDirLock.acquire(state, job_name="j", clock=CLOCK)
    assert mode_of(state) == 0o755
    assert list(state.iterdir()) == []


def test_a_file_is_not_a_state_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StateDirError, match="not a directory"):
        StateDirLock.acquire(tmp_path / "f", job_name="j", clock=CLOCK)


def test_the_event_log_takes_one_writer(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"seq": 1}\n{"torn')
    path.chmod(0o644)
    first = EventLog(path)
    try:
        assert mode_of(path) == 0o600
        assert path.read_text() == '{"seq": 1}\n'  # the torn tail is cut by the holder
        path.write_text('{"seq": 1}\n{"torn again')
        with pytest.raises(EventLogInUseError, match="another master"):
            EventLog(path)
        assert path.read_text() == '{"seq": 1}\n{"torn again'  # the refused one cut nothing
    finally:
        first.close()


# ---------------------------------------------------------------- create_master


def _config(state: Path, **kw: object) -> MasterConfig:
    return MasterConfig(
        job_name="locked",
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 2), node_start_timeout_s=None),
        backend="external",
        state_dir=str(state),
        tick_interval_s=3600.0,
        **kw,  # type: ignore[arg-type]
    )


def test_create_master_on_a_held_directory_reads_and_writes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "s"
    with StateDirLock.acquire(state, job_name="other", clock=CLOCK, host="h9", pid=99):
        with pytest.raises(StateDirInUseError, match="pid 99 on host h9"):
            create_master(_config(state), scheduler=ExternalScheduler())
        assert sorted(p.name for p in state.iterdir()) == [LOCK_FILE_NAME]  # no token, secret, journal, log


def test_a_runtime_holds_the_lock_until_it_stops(tmp_path: Path) -> None:
    state = tmp_path / "s"
    runtime = create_master(_config(state), scheduler=ExternalScheduler(), clock=CLOCK)
    try:
        with pytest.raises(StateDirInUseError, match=f"pid {os.getpid()}"):
            create_master(_config(state), scheduler=ExternalScheduler())
        runtime.start()
        with pytest.raises(StateDirInUseError):
            create_master(_config(state), scheduler=ExternalScheduler())
    finally:
        runtime.stop()
    again = create_master(_config(state), scheduler=ExternalScheduler())
    again.stop()


def test_a_refused_configuration_releases_the_lock(tmp_path: Path) -> None:
    state = tmp_path / "s"
    with pytest.raises(Exception, match="agent_command"):
        create_master(MasterConfig(state_dir=str(state), backend="local"))
    create_master(_config(state), scheduler=ExternalScheduler()).stop()


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_every_file_the_master_writes_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    state = tmp_path / "s"
    with _umask(0o022):  # the usual umask, which would make SQLite's own files 0644
        runtime = create_master(_config(state), scheduler=ExternalScheduler(), clock=CLOCK)
        try:
            runtime.start()
            runtime.master.register(0, "agent-0", "host-0")  # journal commits: the WAL and its index exist
            names = {p.name for p in state.iterdir()}
            assert {"master.db", "master.db-wal", "master.db-shm", "events.jsonl", "token", "node-secret"} <= names
            assert LOCK_FILE_NAME in names
            for path in state.iterdir():
                assert mode_of(path) == 0o600, f"{path.name} is {mode_of(path):04o}"
            assert mode_of(state) == 0o700
        finally:
            runtime.stop()


def test_a_journal_an_older_master_left_0644_is_narrowed(tmp_path: Path) -> None:
    with _umask(0o022):
        db = sqlite3.connect(tmp_path / "master.db")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x)")
        db.commit()
        wal = tmp_path / "master.db-wal"
        assert mode_of(tmp_path / "master.db") == 0o644
        assert mode_of(wal) == 0o644
        journal = SqliteJournal(tmp_path)
        try:
            assert mode_of(tmp_path / "master.db") == 0o600
            assert mode_of(wal) == 0o600
        finally:
            journal.close()
            db.close()


def test_local_agents_logs_are_private(tmp_path: Path) -> None:
    with _umask(0o022):
        scheduler = LocalScheduler([sys.executable, "-c", "print('hello')"], log_dir=tmp_path / "logs")
        try:
            scheduler.launch(NodeSpec(job_name="j", node_id=3, rank=0))
            log = tmp_path / "logs" / "node-3.log"
            wait_for(lambda: log.exists() and "hello" in log.read_text(), what="the agent's output")
            assert mode_of(log) == 0o600
            assert mode_of(tmp_path / "logs") == 0o700
        finally:
            scheduler.close()


def test_the_cli_refuses_a_state_directory_open_to_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s"
    state.mkdir()
    state.chmod(0o750)
    assert main(["--backend", "external", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert "mode 0750" in err
    assert "chmod 700" in err
    assert list(state.iterdir()) == []


# ---------------------------------------------------------------- real dlrover-master processes


EXTERNAL = ["--backend", "external", "--nnodes", "1:2", "--heartbeat-timeout-s", "30", "--heartbeat-interval-s", "1",
            "--node-start-timeout-s", "0", "--log-level", "WARNING"]  # fmt: skip


def _master_process(state: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dlrover.master.cli", "--state-dir", str(state), *EXTERNAL, *extra],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _listening(proc: subprocess.Popen[bytes], log: Path, start: int) -> str:
    found: list[str] = []

    def ready() -> bool:
        text = log.read_text(errors="replace")[start:]
        found.extend(re.findall(r"listening on (\S+)", text))
        assert proc.poll() is None, f"the master exited early: {text}"
        return bool(found)

    wait_for(ready, what="the master listening")
    return found[-1]


def _fingerprint(state: Path) -> dict[str, tuple[str, int, int]]:
    """Every file in the directory: its hash, its mtime (ns) and its size."""
    result = {}
    for path in sorted(state.rglob("*")):
        if path.is_file():
            info = path.stat()
            result[str(path.relative_to(state))] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                info.st_mtime_ns,
                info.st_size,
            )
    return result


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_a_second_master_on_a_live_state_dir_exits_naming_the_holder_and_changes_no_byte(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = tmp_path / "first.log"
    first = _master_process(state, log)
    procs = [first]
    try:
        address = _listening(first, log, 0)
        token = load_token(token_file=state / "token")
        policy = RetryPolicy(call_timeout_s=20.0, total_timeout_s=60.0, max_attempts=20)
        with MasterClient(address, token, policy=policy) as client:
            client.register("agent-0", "host-0")  # the journal and the event log have content
        # Frozen, the first master cannot change its own files while the second one tries.
        os.killpg(first.pid, signal.SIGSTOP)
        before = _fingerprint(state)
        assert {"master.db", "events.jsonl", "token", "node-secret", LOCK_FILE_NAME} <= set(before)
        for extra in (["--port", "0"], ["--port", address.rsplit(":", 1)[1]]):
            second_log = tmp_path / f"second-{extra[1]}.log"
            second = _master_process(state, second_log, *extra)
            procs.append(second)
            assert second.wait(timeout=60) == EXIT_RETRY  # could not start now: retry later
            said = second_log.read_text()
            assert f"in use by pid {first.pid} on host {socket.gethostname()}" in said, said
            assert "listening" not in said
            assert _fingerprint(state) == before
        os.killpg(first.pid, signal.SIGCONT)
        with MasterClient(address, token, policy=policy) as client:
            assert client.job_status().job_name == "dlrover-job"  # the first master still serves
        # A refused call shows in the master's own log, with the caller's address.
        intruder = MasterClient(address, "w" * 43, policy=RetryPolicy(max_attempts=1))
        with intruder, pytest.raises(RpcError, match="wrong job token"):
            intruder.job_status()
        wait_for(
            lambda: (
                re.search(r"refused a call to \S+GetJobStatus from ipv4:127\.0\.0\.1:\d+: bad_token", log.read_text())
                is not None
            ),
            what="the refusal in the master's log",
        )

        # SIGKILLed, it leaves its lock file behind; the kernel released the lock itself.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        restart_log = tmp_path / "restart.log"
        restarted = _master_process(state, restart_log)
        procs.append(restarted)
        address = _listening(restarted, restart_log, 0)
        holder = LockHolder.from_json((state / LOCK_FILE_NAME).read_text())
        assert holder.pid == restarted.pid
        with MasterClient(address, token, policy=policy) as client:
            status = client.job_status()
            assert [n.name for n in status.nodes if n.name] == ["agent-0"]  # resumed from the journal
        events = [json.loads(line) for line in (state / "events.jsonl").read_text().splitlines()]
        assert [e["kind"] for e in events].count("master_restart") == 1  # the restart, not the refused ones
    finally:
        for proc in procs:
            _stop(proc)
