"""SaverHost with a real Unix socket and real files in a private shm dir (no torch): ensure starts,
reuses and (on a resize) replaces a run's saver, bad requests change nothing, stop removes or keeps
memory, a job-end shutdown ends the run. Plus the pure decision table as a state machine."""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dlrover.common import ConfigError, ManualClock
from dlrover.flashckpt.channel import recv_message, send_message, unix_address
from dlrover.flashckpt.client import SaverClient
from dlrover.flashckpt.errors import FlashCkptError, SaverUnavailableError
from dlrover.flashckpt.host import (
    EnsureAction,
    HostRuns,
    SaverHost,
    SaverHostConfig,
    SaverRequest,
    host_socket_path,
    request_saver,
)
from dlrover.flashckpt.saver import Saver, SaverConfig, socket_path
from dlrover.flashckpt.segment import cleanup_stale, segment_path
from dlrover.flashckpt.stager import SealedNotice
from dlrover.flashckpt.storage import InMemoryStorage
from dlrover.flashckpt.storage.location import StorageLocation

WAIT_S = 60.0


def _wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def host(shm: Path) -> Iterator[SaverHost]:
    h = SaverHost(
        SaverHostConfig(str(host_socket_path(shm)), stop_timeout_s=WAIT_S, drain_timeout_s=5.0, max_runs=2),
        storage_factory=lambda _dir: InMemoryStorage(),
    )
    h.start()
    yield h
    h.stop(remove_memory=True)
    assert list(shm.iterdir()) == []  # nothing of the host or its runs is left


def _request(shm: Path, tmp_path: Path, **kw: Any) -> SaverRequest:
    fields: dict[str, Any] = {
        "job_id": "job",
        "run_id": "run",
        "world_size": 2,
        "storage_dir": str(tmp_path / "ckpt"),
        "shm_dir": str(shm),
    }
    fields.update(kw)
    return SaverRequest(**fields)


def _raw(host: SaverHost, msg: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(WAIT_S)
        with unix_address(host.socket_path) as address:
            s.connect(address)
        send_message(s, msg)
        reply = recv_message(s)
    assert reply is not None
    return reply


def _fake_segment(shm: Path, rank: int, job: str = "job", run: str = "run") -> Path:
    path = segment_path(shm, job, run, rank, 0)
    path.write_bytes(b"\0" * 64)
    return path


def test_sockets_are_0600_under_a_lax_umask_which_is_never_changed(
    shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The umask is process-wide: narrowing it for a bind would race with other threads' files and
    # be inherited by any process forked meanwhile (a worker the agent starts then).
    umask_calls: list[int] = []
    real_umask = os.umask
    previous = real_umask(0o000)  # a lax umask: without the chmod the sockets would be 0777
    try:
        monkeypatch.setattr(os, "umask", lambda mask: umask_calls.append(mask) or 0)
        h = SaverHost(SaverHostConfig(str(host_socket_path(shm)), stop_timeout_s=WAIT_S, drain_timeout_s=5.0))
        h.start()
        try:
            assert stat.S_IMODE(h.socket_path.stat().st_mode) == 0o600
            started = request_saver(h.socket_path, _request(shm, tmp_path))
            assert stat.S_IMODE(started.path.stat().st_mode) == 0o600
        finally:
            h.stop(remove_memory=True)
    finally:
        real_umask(previous)
    assert umask_calls == []


def test_ensure_starts_a_saver_then_reuses_it(host: SaverHost, shm: Path, tmp_path: Path) -> None:
    assert stat.S_IMODE(host.socket_path.stat().st_mode) == 0o600
    first = request_saver(host.socket_path, _request(shm, tmp_path))
    assert first.action == "started"
    assert first.path == socket_path(shm, "job", "run")
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert first.saver_pid == os.getpid()  # the saver runs in the host's process
    saver = host.saver("job", "run")
    again = request_saver(host.socket_path, _request(shm, tmp_path))
    assert (again.action, again.path) == ("reused", first.path)
    assert host.saver("job", "run") is saver
    client = SaverClient(first.path, 0, 2)  # the saver answers like a detached one
    try:
        assert client.saver_pid == os.getpid()
    finally:
        client.close()


def test_the_host_says_which_ranks_sealed_a_snapshot_since_a_time(shm: Path, tmp_path: Path) -> None:
    # The agent starts standbys for the next restart once its workers are training again.
    clock = ManualClock(start=100.0)
    host = SaverHost(
        SaverHostConfig(str(host_socket_path(shm)), stop_timeout_s=WAIT_S, drain_timeout_s=5.0),
        storage_factory=lambda _dir: InMemoryStorage(),
        clock=clock,
    )
    host.start()
    try:
        assert host.ranks_sealed_since(0.0) == frozenset()  # no run yet
        assert host.newest_step_sealed_by([0, 1]) is None
        hosted = request_saver(host.socket_path, _request(shm, tmp_path))
        clients = [SaverClient(hosted.path, rank, 2) for rank in (0, 1)]
        try:
            clients[1].notify_sealed(SealedNotice(rank=1, slot=0, seq=1, step=5))
            _wait_until(lambda: host.ranks_sealed_since(100.0) == {1})
            # The node's progress: the newest step every one of its ranks sealed.
            assert host.newest_step_sealed_by([1]) == 5
            assert host.newest_step_sealed_by([0, 1]) is None  # rank 0 sealed nothing yet
            clock.advance(10.0)
            assert host.ranks_sealed_since(105.0) == frozenset()  # sealed before that
            clients[0].notify_sealed(SealedNotice(rank=0, slot=0, seq=1, step=6))
            _wait_until(lambda: host.ranks_sealed_since(105.0) == {0})
            assert host.ranks_sealed_since(100.0) == {0, 1}
            assert host.newest_step_sealed_by([0, 1]) == 5
            assert host.newest_step_sealed_by([0]) == 6
            assert host.newest_step_sealed_by([]) is None
            assert not host.failure_persist_pending()  # nobody died
            clients[1].close()  # a process that left is not training
            _wait_until(lambda: host.ranks_sealed_since(100.0) == {0})
            assert host.newest_step_sealed_by([0, 1]) == 5  # progress made stays made
        finally:
            for client in clients:
                client.close()
    finally:
        host.stop(remove_memory=True)


def test_the_agent_releases_held_failure_persists(shm: Path, tmp_path: Path) -> None:
    # A worker died with a hold configured; the node's ranks then change, and the agent says so.
    host = SaverHost(
        SaverHostConfig(
            str(host_socket_path(shm)), stop_timeout_s=WAIT_S, drain_timeout_s=5.0, failure_persist_hold_s=3600.0
        ),
        storage_factory=lambda _dir: InMemoryStorage(),
    )
    host.start()
    try:
        request = _request(shm, tmp_path)
        hosted = request_saver(host.socket_path, request)
        saver = host.saver(request.job_id, request.run_id)
        assert saver is not None
        client = SaverClient(hosted.path, 0, 2)
        client._sock.shutdown(socket.SHUT_RDWR)  # the process died: no 'bye'
        client._reader.join(WAIT_S)
        client.close()
        _wait_until(lambda: "failure_persist_held" in saver.events.kinds())
        assert "failure_persist_released" not in saver.events.kinds()
        host.release_held_failures("this node's ranks changed")
        _wait_until(lambda: "failure_persist" in saver.events.kinds())  # it ran (nothing to persist here)
        released = [e for e in saver.events.snapshot() if e.kind == "failure_persist_released"]
        assert [e.reason for e in released] == ["this node's ranks changed"]
    finally:
        host.stop(remove_memory=True)


def test_a_resize_replaces_the_saver_and_keeps_the_memory(host: SaverHost, shm: Path, tmp_path: Path) -> None:
    request_saver(host.socket_path, _request(shm, tmp_path, world_size=2))
    old = host.saver("job", "run")
    assert old is not None
    client = SaverClient(old.socket_path, 1, 2)
    segments = [_fake_segment(shm, 0), _fake_segment(shm, 1)]
    try:
        shrunk = request_saver(host.socket_path, _request(shm, tmp_path, world_size=1))
        assert shrunk.action == "replaced"
        assert "world size 2 -> 1" in shrunk.reason
        new = host.saver("job", "run")
        assert new is not None
        assert new is not old
        assert new.config.world_size == 1
        assert all(p.exists() for p in segments)  # replacing never removes snapshots
        _wait_until(lambda: client.closed)  # the old saver's stagers learn it is gone
        grown = request_saver(host.socket_path, _request(shm, tmp_path, world_size=2, coordinator=False))
        assert grown.action == "replaced"
        final = host.saver("job", "run")
        assert final is not None
        assert (final.config.world_size, final.config.coordinator) == (2, False)
        SaverClient(grown.path, 0, 2).close()  # the new saver listens
    finally:
        client.close()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"type": "persist"}, "unknown message type 'persist'"),
        ({"world_size": None}, "needs ['world_size']"),
        ({"world_size": 0}, "world_size must be an integer >= 1, got 0"),
        ({"world_size": True}, "world_size must be an integer >= 1, got True"),
        ({"num_slots": 1}, "num_slots must be an integer >= 2, got 1"),
        ({"job_id": "../etc"}, "job id '../etc'"),
        ({"storage_dir": "relative/ckpt"}, "storage directory must be an absolute path, got 'relative/ckpt'"),
        ({"shm_dir": "/no/such/dir"}, "shm_dir '/no/such/dir' is not a directory"),
        ({"coordinator": "yes"}, "coordinator must be true or false, got 'yes'"),
        ({"storage_dir": "/elsewhere"}, "is served with storage_dir="),
        ({"storage_dir": "s3://"}, "names no bucket or path"),
        (
            {"storage_options": {"secret": "s3cr3t"}},
            "takes only the options ['direct_buffer_bytes', 'direct_io', 'writeback_window_bytes'], got ['secret']",
        ),
        ({"keep_last": 3}, "is served with keep_last=0; the request names 3"),
        ({"keep_every": 2}, "keep_every needs keep_last"),
        ({"job_id": "other"}, "already serves 2 runs"),
    ],
)
def test_bad_requests_get_errors_and_change_nothing(
    host: SaverHost, shm: Path, tmp_path: Path, change: dict[str, Any], match: str
) -> None:
    request_saver(host.socket_path, _request(shm, tmp_path))
    request_saver(host.socket_path, _request(shm, tmp_path, run_id="run2"))  # max_runs=2 reached
    before, saver = host.runs(), host.saver("job", "run")
    msg = _request(shm, tmp_path).to_message()
    for key, value in change.items():
        if value is None:
            del msg[key]
        else:
            msg[key] = value
    reply = _raw(host, msg)
    assert reply["type"] == "error"
    assert match in reply["reason"], reply
    assert host.runs() == before
    assert host.saver("job", "run") is saver
    with pytest.raises(SaverUnavailableError, match="refused"):
        request_saver(host.socket_path, _request(shm, tmp_path, storage_dir="/elsewhere"))


def test_a_bad_frame_is_answered_and_the_host_keeps_serving(host: SaverHost, shm: Path, tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(WAIT_S)
        with unix_address(host.socket_path) as address:
            s.connect(address)
        s.sendall(struct.pack(">I", 5) + b"{bad}")
        reply = recv_message(s)
    assert reply is not None
    assert reply["type"] == "error"
    assert "not JSON" in reply["reason"]
    assert request_saver(host.socket_path, _request(shm, tmp_path)).action == "started"


def test_unusable_storage_is_refused_before_a_running_saver_is_touched(shm: Path, tmp_path: Path) -> None:
    def storage(location: StorageLocation) -> InMemoryStorage:
        if "bad" in location.url:
            raise OSError(f"permission denied: {location.url}")
        return InMemoryStorage()

    host = SaverHost(SaverHostConfig(str(shm / "host.sock"), stop_timeout_s=WAIT_S), storage_factory=storage)
    host.start()
    try:
        request_saver(host.socket_path, _request(shm, tmp_path, storage_dir="/ok"))
        saver = host.saver("job", "run")
        with pytest.raises(SaverUnavailableError, match="storage '/bad' is unusable"):
            request_saver(host.socket_path, _request(shm, tmp_path, run_id="r2", storage_dir="/bad"))
        assert set(host.runs()) == {("job", "run")}
        assert host.saver("job", "run") is saver
    finally:
        host.stop(remove_memory=True)
    assert list(shm.iterdir()) == []


@pytest.mark.parametrize("remove_memory", [True, False])
def test_stop_removes_or_keeps_the_memory(shm: Path, tmp_path: Path, remove_memory: bool) -> None:
    host = SaverHost(
        SaverHostConfig(str(host_socket_path(shm)), stop_timeout_s=WAIT_S), storage_factory=lambda _d: InMemoryStorage()
    )
    host.start()
    request_saver(host.socket_path, _request(shm, tmp_path))
    segment = _fake_segment(shm, 0)
    host.stop(remove_memory=remove_memory)
    left = sorted(p.name for p in shm.iterdir())
    if remove_memory:
        assert left == []
    else:
        # The snapshot and its owner record stay; the host's and the saver's sockets go.
        assert left == sorted([segment.name, "dlrover-fc.job.run.owner"])
    with pytest.raises(SaverUnavailableError, match=str(host.socket_path)):
        request_saver(host.socket_path, _request(shm, tmp_path))


def test_a_job_end_shutdown_stops_the_run_and_removes_its_memory(host: SaverHost, shm: Path, tmp_path: Path) -> None:
    hosted = request_saver(host.socket_path, _request(shm, tmp_path))
    _fake_segment(shm, 0)
    SaverClient(hosted.path, 0, 2).close(shutdown_saver=True)
    _wait_until(lambda: host.runs() == {})
    assert sorted(p.name for p in shm.iterdir() if "job.run" in p.name) == []
    # A later request starts a fresh saver.
    assert request_saver(host.socket_path, _request(shm, tmp_path)).action == "started"


def test_an_unreachable_host_fails_naming_its_socket(tmp_path: Path) -> None:
    missing = tmp_path / "no-host.sock"
    with pytest.raises(SaverUnavailableError, match=str(missing)):
        request_saver(missing, _request(tmp_path, tmp_path), timeout_s=5)


def test_a_host_socket_named_like_a_run_survives_stale_cleanup_while_the_host_runs(shm: Path) -> None:
    host = SaverHost(SaverHostConfig(str(host_socket_path(shm))))
    host.start()
    try:
        assert cleanup_stale(shm) == []
        assert host.socket_path.exists()
    finally:
        host.stop(remove_memory=True)
    assert list(shm.iterdir()) == []


def test_the_persist_thread_runs_at_a_lower_priority(shm: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    saver = Saver(SaverConfig(job_id="nice", run_id="r", shm_dir=str(shm), worker_nice=5), InMemoryStorage())
    saver.start()
    try:
        worker = next(t for t in threading.enumerate() if t.name == "flashckpt-saver-worker" and t.is_alive())
        assert worker.native_id is not None
        tid = worker.native_id
        _wait_until(lambda: os.getpriority(os.PRIO_PROCESS, tid) == min(19, base + 5))
        assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the rest of the process is untouched
    finally:
        saver.stop(remove_memory=True)


def test_configs_reject_nonsense(shm: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="socket_path must be absolute"):
        SaverHostConfig("relative.sock")
    with pytest.raises(ConfigError, match="not in an existing directory"):
        SaverHostConfig(str(tmp_path / "missing" / "h.sock"))
    with pytest.raises(ConfigError, match="persist_nice must be at most 19"):
        SaverHostConfig(str(shm / "h.sock"), persist_nice=20)
    with pytest.raises(ConfigError, match="stop_timeout_s"):
        SaverHostConfig(str(shm / "h.sock"), stop_timeout_s=0)
    with pytest.raises(ConfigError, match="worker_nice must be at most 19"):
        SaverConfig(job_id="j", run_id="r", worker_nice=25)
    with pytest.raises(ConfigError, match="max_runs"):
        HostRuns(0)
    with pytest.raises(FlashCkptError, match="storage directory must be an absolute path"):
        _request(shm, tmp_path, storage_dir="ckpt")


# -- the decision table ----------------------------------------------------------------------------

SHM_DIRS = ["/tmp", "/"]  # existing directories; decisions never write there


@st.composite
def requests(draw: st.DrawFn) -> SaverRequest:
    return SaverRequest(
        job_id=draw(st.sampled_from(["a", "b"])),
        run_id=draw(st.sampled_from(["r", "s"])),
        world_size=draw(st.integers(1, 3)),
        storage_dir=draw(st.sampled_from(["/c1", "/c2"])),
        coordinator=draw(st.booleans()),
        shm_dir=draw(st.sampled_from(SHM_DIRS)),
        num_slots=draw(st.sampled_from([2, 3])),
    )


class HostRunsMachine(RuleBasedStateMachine):
    """HostRuns against a dict model: one saver per run, refusals change nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = HostRuns(max_runs=3)
        self.model: dict[tuple[str, str], SaverRequest] = {}

    @rule(request=requests())
    def ensure(self, request: SaverRequest) -> None:
        before = self.runs.runs()
        decision = self.runs.decide(request)
        assert self.runs.runs() == before  # deciding alone changes nothing
        current = self.model.get(request.key)
        if current is None:
            expected = EnsureAction.START if len(self.model) < 3 else EnsureAction.REFUSE
        elif (current.storage_dir, current.shm_dir, current.num_slots) != (
            request.storage_dir,
            request.shm_dir,
            request.num_slots,
        ):
            expected = EnsureAction.REFUSE
        elif (current.world_size, current.coordinator) != (request.world_size, request.coordinator):
            expected = EnsureAction.REPLACE
        else:
            expected = EnsureAction.REUSE
        assert decision.action is expected, decision.reason
        assert decision.reason
        self.runs.apply(request, decision)
        if expected is not EnsureAction.REFUSE:
            self.model[request.key] = request

    @rule(job=st.sampled_from(["a", "b"]), run=st.sampled_from(["r", "s"]))
    def forget(self, job: str, run: str) -> None:
        assert self.runs.forget((job, run)) == self.model.pop((job, run), None)

    @invariant()
    def matches_the_model(self) -> None:
        assert self.runs.runs() == self.model
        assert len(self.model) <= 3


TestHostRunsMachine = HostRunsMachine.TestCase
TestHostRunsMachine.settings = settings(stateful_step_count=20, deadline=None)


def test_sockets_in_a_directory_deeper_than_sun_path_still_work(tmp_path: Path) -> None:
    # sockaddr_un holds 107 bytes of path; CI temp dirs and container shm mounts can be deeper.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    h = SaverHost(
        SaverHostConfig(str(host_socket_path(deep)), stop_timeout_s=WAIT_S, drain_timeout_s=5.0),
        storage_factory=lambda _dir: InMemoryStorage(),
    )
    assert len(str(h.socket_path)) > 107
    h.start()
    try:
        answer = request_saver(h.socket_path, _request(deep, tmp_path))
        assert len(str(answer.path)) > 107
        client = SaverClient(answer.path, 0, 2)
        try:
            assert client.saver_pid == os.getpid()
        finally:
            client.close()
    finally:
        h.stop(remove_memory=True)
    assert list(deep.iterdir()) == []


def test_a_starting_host_removes_the_files_of_dead_hosts_only(shm: Path) -> None:
    from dlrover.common import pid_scope
    from dlrover.flashckpt.segment import owner_path, write_owner

    def files_of(job: str, run: str, pid: int, **extra: object) -> list[Path]:
        write_owner(shm, job, run, pid=pid, extra=extra)
        sock = shm / f"dlrover-fc.{job}.{run}.sock"
        sock.write_bytes(b"")  # a socket file left by its dead or living host
        return [sock, owner_path(shm, job, run)]

    host = {"kind": "saver-host", "pid_scope": pid_scope()}
    dead = files_of("host999999", "deadbeef", 999999, **host)  # a SIGKILLed agent's host
    living = files_of(f"host{os.getpid()}", "cafe", os.getpid(), **host)
    # Another container's live agent sharing /dev/shm: its pid means nothing here.
    elsewhere = files_of("host999998", "feed", 999998, kind="saver-host", pid_scope=12345)
    # A job that happens to be named like a host: its saver's socket is not a host's.
    named_so = files_of("host7", "r", 999999)
    write_owner(shm, "job", "run", pid=999999)  # a dead job's memory: its restarted workers may load it
    segment = _fake_segment(shm, 0, "job", "run")
    h = SaverHost(SaverHostConfig(str(host_socket_path(shm)), stop_timeout_s=WAIT_S, drain_timeout_s=5.0))
    h.start()
    try:
        assert not any(path.exists() for path in dead)
        assert all(path.exists() for path in living + elsewhere + named_so)
        assert segment.exists()
        assert owner_path(shm, "job", "run").exists()
        assert any(e.kind == "stale_host_removed" for e in h.events.snapshot())
    finally:
        h.stop(remove_memory=True)


def test_remove_departed_ranks_unlinks_other_ranks_slots_in_the_hosts_own_dir_only(
    host: SaverHost, shm: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    request_saver(host.socket_path, _request(shm, tmp_path, world_size=1))
    request_saver(host.socket_path, _request(elsewhere, tmp_path, run_id="other", world_size=1))
    for directory, run in ((shm, "run"), (elsewhere, "other")):
        for rank in (0, 1, 5):
            for slot in (0, 1):
                segment_path(directory, "job", run, rank, slot).write_bytes(b"x")
    removed = host.remove_departed_ranks([0])
    assert sorted(p.name for p in removed) == [
        f"dlrover-fc.job.run.r{rank}.s{slot}" for rank in (1, 5) for slot in (0, 1)
    ]
    assert all(segment_path(shm, "job", "run", 0, slot).exists() for slot in (0, 1))
    # A directory others may share (a script's own shm_dir) is left alone.
    assert len(list(elsewhere.glob("dlrover-fc.job.other.r*"))) == 6
    assert any(e.kind == "departed_ranks_removed" for e in host.events.snapshot())
    assert host.remove_departed_ranks([0]) == []
    for path in elsewhere.glob("dlrover-fc.job.other.r*"):
        path.unlink()
