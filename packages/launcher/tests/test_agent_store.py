"""Node rank 0's agent hosts each round's torch.distributed store, as torchrun's agent does.

Unit tests drive the agent with `FakeControlPlane` and a recording `FakeStoreHost` (workers are
tiny scripts that import nothing heavy); integration tests run gloo workers against a real
`TorchStoreHost`, and the real gRPC control plane against a real master.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from dlrover.common import DLRoverError
from dlrover.diagnosis import ActionKind
from dlrover.launcher.agent import Agent, AgentConfig, AgentResult
from dlrover.launcher.control import Progress, RoundAssignment
from dlrover.launcher.env import PER_ROUND_ENV_VARS, WorkerIdentity, worker_env
from dlrover.launcher.fake_control import FakeControlPlane
from dlrover.launcher.grpc_control import GrpcControlPlane, decode_store_address, encode_store_address
from dlrover.launcher.store_host import FakeStoreHost, TorchStoreHost

pytestmark = pytest.mark.timeout(120)

# Writes its environment to <out>/rank<R>_attempt<A>_pid<P>.json, then acts as `mode` says.
RECORDING_WORKER = textwrap.dedent(
    """
    import glob, json, os, sys, time
    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    keys = ["MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"]
    record = os.path.join(out, f"rank{rank}_attempt{attempt}_pid{os.getpid()}.json")
    with open(record + ".tmp", "w") as f:  # renamed whole: a reader never sees half a record
        json.dump({k: os.environ.get(k) for k in keys}, f)
    os.replace(record + ".tmp", record)
    if mode == "fail_first" and attempt == 0 and rank == 1:
        # Fail only once rank 0 has recorded itself: the agent stops it at once after this exit,
        # and a rank 0 slow to start would otherwise be stopped before it wrote anything.
        deadline = time.monotonic() + 60
        while not glob.glob(os.path.join(out, "rank0_attempt0_pid*.json")) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(7)
    if mode == "sleep":
        time.sleep(600)
    """
)


def _agent(
    tmp_path: Path,
    mode: str,
    control: FakeControlPlane,
    store_host: FakeStoreHost | TorchStoreHost | None,
    script: str = RECORDING_WORKER,
    **kwargs: object,
) -> Agent:
    path = tmp_path / "worker.py"
    path.write_text(script)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    config: dict[str, object] = {
        "worker_argv": (sys.executable, str(path), str(out), mode),
        "nproc_per_node": 2,
        "max_restarts": 2,
        "run_id": "job-store",
        "monitor_interval_s": 0.05,
        "shutdown_grace_s": 5.0,
        "host_checkpoint_saver": False,
    }
    config.update(kwargs)
    return Agent(AgentConfig(**config), control, store_host=store_host)  # type: ignore[arg-type]


def _records(tmp_path: Path) -> dict[str, dict[str, object]]:
    """By "rank<R>_attempt<A>": the worker's recorded environment plus its "pid"."""
    records = {}
    for path in (tmp_path / "out").glob("*.json"):
        name, _, pid = path.stem.rpartition("_pid")
        records[name] = {**json.loads(path.read_text()), "pid": int(pid)}
    return records


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _WorkersStoppedCheck:
    """A `FakeStoreHost.on_close` hook: every worker that started so far has exited (and was reaped)."""

    def __init__(self, tmp_path: Path) -> None:
        self._tmp_path = tmp_path
        self.checked: list[int] = []  # workers seen stopped, per close
        self.running_at_close: list[int] = []

    def __call__(self) -> None:
        pids = [int(record["pid"]) for record in _records(self._tmp_path).values()]  # type: ignore[call-overload]
        self.running_at_close += [pid for pid in pids if _alive(pid)]
        self.checked.append(len(pids))


def _wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


# --- the worker environment and the published address -------------------------------------------


def _identity() -> WorkerIdentity:
    return WorkerIdentity(
        rank=0, local_rank=0, world_size=1, local_world_size=1, group_rank=0, group_world_size=1, role_rank=0,
        role_world_size=1,
    )  # fmt: skip


def test_worker_env_says_whether_the_agent_hosts_the_store_as_torch_reads_it() -> None:
    kwargs = {"master_addr": "h", "master_port": 1, "run_id": "r", "restart_count": 0, "max_restarts": 0}
    hosted = worker_env({}, _identity(), agent_store=True, **kwargs)  # type: ignore[arg-type]
    assert hosted["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # torch compares with str(True)
    assert worker_env({}, _identity(), **kwargs)["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # type: ignore[arg-type]
    # A user's own value never survives: it must match how this round's store is hosted.
    user = worker_env({"TORCHELASTIC_USE_AGENT_STORE": "True"}, _identity(), **kwargs)  # type: ignore[arg-type]
    assert user["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    # It depends on the round, so a standby does not import under a stand-in value.
    assert "TORCHELASTIC_USE_AGENT_STORE" in PER_ROUND_ENV_VARS


def test_the_published_store_address_round_trips() -> None:
    assert decode_store_address(encode_store_address("10.0.0.7", 29400, True)) == ("10.0.0.7", 29400, True)
    assert decode_store_address(encode_store_address("::1", 1, False)) == ("::1", 1, False)


@pytest.mark.parametrize(
    "value",
    [
        b"10.0.0.7:29400",
        b"\xff",
        b"[]",
        b'{"host": "h", "port": 1}',
        b'{"host": "", "port": 1, "agent_store": true}',
        b'{"host": "h", "port": 0, "agent_store": true}',
        b'{"host": "h", "port": 70000, "agent_store": true}',
        b'{"host": "h", "port": true, "agent_store": true}',
        b'{"host": "h", "port": "1", "agent_store": true}',
        b'{"host": "h", "port": 1, "agent_store": "yes"}',
    ],
)
def test_a_malformed_store_address_is_a_clear_error_quoting_it(value: bytes) -> None:
    with pytest.raises(DLRoverError, match="malformed store address") as info:
        decode_store_address(value)
    assert repr(value) in str(info.value)


def test_the_fake_control_plane_publishes_only_after_the_store_opened() -> None:
    control = FakeControlPlane()
    published_when_opened: list[int] = []

    def open_store(host: str) -> int:
        published_when_opened.append(len(control.rounds))
        return 4242

    assignment = control.next_round(10.0, open_store=open_store)
    assert published_when_opened == [0]
    assert assignment == RoundAssignment(
        1, 0, 1, "127.0.0.1", 4242, agent_store=True, first_worker_rank=0, worker_world_size=1
    )
    assert control.rounds == [assignment]
    assert control.next_round(10.0).agent_store is False


# --- the agent with a recording fake store host -----------------------------------------------------


def test_one_fresh_store_per_round_opened_before_the_workers_and_closed_after_they_stopped(tmp_path: Path) -> None:
    stopped = _WorkersStoppedCheck(tmp_path)
    store = FakeStoreHost(first_port=41000, on_close=stopped)
    control = FakeControlPlane()
    result = _agent(tmp_path, "fail_first", control, store).run()
    assert result.exit_code == 0, result.reason
    assert result.restarts == 1
    # Two rounds (the failure restart is a new round), a store each, never two open at once.
    opens_and_closes = [call for call in store.calls if call != ("close", "")]
    assert opens_and_closes == [
        ("prepare", ""),
        ("open", "127.0.0.1:41000"),
        ("close", "127.0.0.1:41000"),
        ("open", "127.0.0.1:41001"),
        ("close", "127.0.0.1:41001"),
    ]
    assert not store.is_open
    # Each round was published with the store its agent opened, and its workers were told so.
    assert [(r.master_port, r.agent_store) for r in control.rounds] == [(41000, True), (41001, True)]
    records = _records(tmp_path)
    assert set(records) == {"rank0_attempt0", "rank1_attempt0", "rank0_attempt1", "rank1_attempt1"}
    for name, record in records.items():
        assert record["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert record["MASTER_ADDR"] == "127.0.0.1"
        assert record["MASTER_PORT"] == ("41000" if name.endswith("attempt0") else "41001")
    # Every store was closed only once the workers of its round had all exited.
    assert stopped.checked == [2, 4]
    assert stopped.running_at_close == []


def test_the_store_is_closed_after_the_workers_when_the_agent_is_stopped(tmp_path: Path) -> None:
    stopped = _WorkersStoppedCheck(tmp_path)
    store = FakeStoreHost(on_close=stopped)
    agent = _agent(tmp_path, "sleep", FakeControlPlane(), store, shutdown_grace_s=1.0)
    outcome: list[AgentResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()))
    thread.start()
    try:
        _wait_for(lambda: len(_records(tmp_path)) == 2)
        assert store.is_open
    finally:
        agent.request_stop("test over")
        thread.join(60)
    assert not thread.is_alive()
    assert outcome[0].exit_code == 143
    assert not store.is_open
    assert stopped.checked == [2]
    assert stopped.running_at_close == []


class _ExplodingHeartbeat(FakeControlPlane):
    """A control plane whose second heartbeat, once `ready()`, raises what the agent does not handle."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        super().__init__()
        self._ready = ready
        self.beats = 0

    def heartbeat(self, progress: Progress) -> Sequence[tuple[ActionKind, str]]:
        self.beats += 1
        if self.beats >= 2:
            _wait_for(self._ready)
            raise RuntimeError("a bug in the control plane")
        return []


def test_an_unexpected_exception_still_stops_the_workers_then_closes_the_store(tmp_path: Path) -> None:
    stopped = _WorkersStoppedCheck(tmp_path)
    store = FakeStoreHost(on_close=stopped)
    # The exception comes once both workers recorded themselves, so both are running then.
    control = _ExplodingHeartbeat(lambda: len(_records(tmp_path)) == 2)
    agent = _agent(tmp_path, "sleep", control, store, shutdown_grace_s=1.0, heartbeat_interval_s=0.05)
    with pytest.raises(RuntimeError, match="a bug in the control plane"):
        agent.run()
    assert not store.is_open
    assert stopped.checked == [2]
    assert stopped.running_at_close == []


class _PublishFails(FakeControlPlane):
    """Opens the store (rank 0), then fails to publish its address."""

    def next_round(
        self,
        timeout_s: float,
        should_stop: Callable[[], bool] = lambda: False,
        open_store: Callable[[str], int] | None = None,
    ) -> RoundAssignment:
        assert open_store is not None
        open_store("127.0.0.1")
        raise DLRoverError("the master is unreachable (scripted)")


def test_a_store_opened_for_a_round_that_never_completes_is_closed(tmp_path: Path) -> None:
    store = FakeStoreHost()
    with pytest.raises(DLRoverError, match="unreachable"):
        _agent(tmp_path, "fail_first", _PublishFails(), store).run()
    assert len(store.opened) == 1
    assert not store.is_open
    assert _records(tmp_path) == {}


def test_a_store_that_cannot_open_starts_no_workers(tmp_path: Path) -> None:
    store = FakeStoreHost(fail_open=True)
    control = FakeControlPlane()
    with pytest.raises(DLRoverError, match="scripted failure"):
        _agent(tmp_path, "fail_first", control, store).run()
    assert control.rounds == []  # nothing was published
    assert _records(tmp_path) == {}


def test_without_a_store_host_worker_rank_0_hosts_the_store(tmp_path: Path) -> None:
    control = FakeControlPlane()
    result = _agent(tmp_path, "ok", control, None).run()
    assert result.exit_code == 0, result.reason
    assert [r.agent_store for r in control.rounds] == [False]
    assert {r["TORCHELASTIC_USE_AGENT_STORE"] for r in _records(tmp_path).values()} == {"False"}


# --- the exit barrier: node rank 0 keeps the store open for the nodes still training -------------


def _run_in_thread(agent: Agent) -> tuple[threading.Thread, list[AgentResult]]:
    outcome: list[AgentResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()))
    thread.start()
    return thread, outcome


def test_node_rank_0_keeps_the_store_open_until_every_node_of_the_round_finished(tmp_path: Path) -> None:
    peer_done = threading.Event()
    asked: list[int] = []

    def peers_finished(assignment: RoundAssignment) -> int:
        asked.append(assignment.round)
        return 1 if peer_done.is_set() else 0

    store = FakeStoreHost()
    control = FakeControlPlane(group_world_size=2, peers_finished=peers_finished)
    thread, outcome = _run_in_thread(_agent(tmp_path, "ok", control, store))
    try:
        # Its own workers succeeded and it said so; the peer has not finished: the store stays.
        _wait_for(lambda: control.successes == 1 and len(asked) >= 3)
        assert store.is_open
        assert thread.is_alive()
    finally:
        peer_done.set()
        thread.join(60)
    assert not thread.is_alive()
    assert outcome[0].exit_code == 0, outcome[0].reason
    assert not store.is_open
    assert set(asked) == {1}  # the round its store served
    assert control.succeeded_rounds == [1]


def test_the_exit_barrier_gives_up_after_its_timeout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FakeStoreHost()
    control = FakeControlPlane(group_world_size=2, peers_finished=lambda _: 0)
    with caplog.at_level("WARNING", logger="dlrover.launcher.agent"):
        result = _agent(tmp_path, "ok", control, store, exit_barrier_timeout_s=0.3).run()
    assert result.exit_code == 0, result.reason
    assert not store.is_open
    assert "node rank(s) [1] of round 1 did not finish within the exit barrier timeout" in caplog.text


def test_the_exit_barrier_ends_when_the_round_ends_another_way(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A peer that failed rejoins (or left, or expired): the others' next round gets its own store.
    succeeded = threading.Event()
    store = FakeStoreHost()
    control = FakeControlPlane(
        group_world_size=2,
        peers_finished=lambda _: 0,
        nodes_waiting=lambda: 1 if succeeded.is_set() else 0,
    )
    original = control.report_success

    def report_success(assignment: RoundAssignment) -> None:
        original(assignment)
        succeeded.set()

    control.report_success = report_success  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="dlrover.launcher.agent"):
        # Only the round's end can end this wait: the timeout is an hour (the test's is shorter).
        result = _agent(tmp_path, "ok", control, store, exit_barrier_timeout_s=3600.0).run()
    assert result.exit_code == 0, result.reason
    assert not store.is_open
    assert "round 1 ended before node rank(s) [1] finished" in caplog.text
    # The barrier's polls take one short attempt each: a stop or its deadline never waits out retries.
    assert control.waiting_polls[-1] is True


def test_a_stop_ends_the_exit_barrier_at_once(tmp_path: Path) -> None:
    store = FakeStoreHost()
    control = FakeControlPlane(group_world_size=2, peers_finished=lambda _: 0)
    agent = _agent(tmp_path, "ok", control, store)
    thread, outcome = _run_in_thread(agent)
    try:
        _wait_for(lambda: control.successes == 1)
        assert thread.is_alive()
    finally:
        agent.request_stop("test over")
        thread.join(60)
    assert not thread.is_alive()
    assert outcome[0].exit_code == 0  # the node's work is done; only the wait was cut short
    assert not store.is_open


class _FlakyFinishedRanks(FakeControlPlane):
    """`finished_ranks` fails as an unreachable master would, `failures` times, then the peer is done."""

    def __init__(self, failures: int) -> None:
        super().__init__(group_world_size=2, peers_finished=lambda _: 1)
        self.failures_left = failures

    def finished_ranks(self, assignment: RoundAssignment) -> frozenset[int]:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise DLRoverError("the master is unreachable (scripted)")
        return super().finished_ranks(assignment)


def test_the_exit_barrier_waits_out_an_unreachable_master(tmp_path: Path) -> None:
    store = FakeStoreHost()
    control = _FlakyFinishedRanks(failures=3)
    result = _agent(tmp_path, "ok", control, store).run()
    assert result.exit_code == 0, result.reason
    assert control.failures_left == 0
    assert not store.is_open


@pytest.mark.parametrize("rank_0", [False, True])
def test_only_the_agent_hosting_the_store_waits(tmp_path: Path, rank_0: bool) -> None:
    class _Rank1(FakeControlPlane):
        def next_round(
            self,
            timeout_s: float,
            should_stop: Callable[[], bool] = lambda: False,
            open_store: Callable[[str], int] | None = None,
        ) -> RoundAssignment:
            # Node rank 1 opens no store: it connects to rank 0's.
            assignment = RoundAssignment(1, 1, 2, "127.0.0.1", 40999, agent_store=True)
            self.rounds.append(assignment)
            return assignment

    peers = FakeControlPlane if rank_0 else _Rank1
    store = FakeStoreHost()
    control = peers(group_world_size=2, peers_finished=lambda _: 0)
    # Node rank 0 would wait the whole (hour-long) timeout: it is stopped once it reported.
    agent = _agent(tmp_path, "ok", control, store, exit_barrier_timeout_s=3600.0)
    thread, outcome = _run_in_thread(agent)
    try:
        _wait_for(lambda: control.successes == 1)
        if rank_0:
            assert thread.is_alive()
        else:
            thread.join(60)
            assert not thread.is_alive()
    finally:
        agent.request_stop("test over")
        thread.join(60)
    assert outcome[0].exit_code == 0
    assert store.opened == (["127.0.0.1:40000"] if rank_0 else [])


# --- real stores, real gloo workers ----------------------------------------------------------------

# Rank 1 connects to the store and sets a key before rank 0 does anything with torch.distributed;
# rank 0 waits (bounded) for rank 1's word that it did. Only a store that listens before the
# workers start lets rank 1 get that far: when worker rank 0 hosts it (in init_process_group),
# nobody listens while rank 0 waits, and both give up.
HANDSHAKE_WORKER = textwrap.dedent(
    """
    import datetime, glob, json, os, sys, time
    import torch, torch.distributed as dist
    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    record = {"MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": os.environ["TORCHELASTIC_USE_AGENT_STORE"]}
    connected = os.path.join(out, f"rank1_connected_attempt{attempt}")
    if rank == 1:
        client = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=30))
        record["previous_round_key"] = client.check([f"attempt{attempt - 1}"])
        client.set(f"attempt{attempt}", "set by rank 1")
        open(connected, "w").close()
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(connected):
            if time.monotonic() > deadline:
                sys.exit("rank 1 never connected to the store")
            time.sleep(0.05)
        client = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=30))
        record["rank1_key"] = client.get(f"attempt{attempt}").decode()
        record["previous_round_key"] = client.check([f"attempt{attempt - 1}"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    record["sum"] = t.item()
    dist.destroy_process_group()
    path = os.path.join(out, f"rank{rank}_attempt{attempt}_pid{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:  # renamed whole: a reader never sees half a record
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    if mode == "fail_first" and attempt == 0 and rank == 1:
        # Fail only once rank 0 has recorded itself: the agent stops it at once after this exit.
        deadline = time.monotonic() + 60
        while not glob.glob(os.path.join(out, "rank0_attempt0_pid*.json")) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(7)
    """
)


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            return False
    except ConnectionRefusedError:
        return True


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_gloo_workers_use_the_agents_store_fresh_each_round_and_closed_at_exit(tmp_path: Path) -> None:
    control = FakeControlPlane()
    agent = _agent(tmp_path, "fail_first", control, TorchStoreHost(), script=HANDSHAKE_WORKER)
    result = agent.run()
    assert result.exit_code == 0, result.reason
    assert result.restarts == 1
    records = _records(tmp_path)
    assert set(records) == {"rank0_attempt0", "rank1_attempt0", "rank0_attempt1", "rank1_attempt1"}
    for attempt in (0, 1):
        first, second = records[f"rank0_attempt{attempt}"], records[f"rank1_attempt{attempt}"]
        assert first["TORCHELASTIC_USE_AGENT_STORE"] == second["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert first["rank1_key"] == "set by rank 1"  # one store, shared by both clients
        assert first["sum"] == second["sum"] == 3.0  # and init_process_group works on it
        # The restart round's store holds none of the previous round's keys.
        assert first["previous_round_key"] is second["previous_round_key"] is False
    assert [r.agent_store for r in control.rounds] == [True, True]
    # Every round's store stopped listening: the second when its round ended, the first before.
    for round_ in control.rounds:
        assert _refused(round_.master_port), f"port {round_.master_port} still accepts connections"


@pytest.fixture
def two_node_master() -> Iterator[object]:
    from dlrover.master import MasterConfig, create_master
    from dlrover.master.config import LifecycleConfig, NodeRange

    config = MasterConfig(
        backend="external",
        lifecycle=LifecycleConfig(nodes=NodeRange(2, 2), heartbeat_timeout_s=30.0, node_start_timeout_s=None),
        heartbeat_interval_s=0.2,
        tick_interval_s=0.1,
        rendezvous_last_call_s=0.1,
    )
    with create_master(config) as runtime:
        yield runtime


def _two_node_planes(runtime: object) -> list[GrpcControlPlane]:
    """One gRPC control plane per "node" of the two-node master, both on this host."""
    from dlrover.master import MasterRuntime

    assert isinstance(runtime, MasterRuntime)
    return [
        GrpcControlPlane(
            runtime.address,
            runtime.token,
            node_name=f"node-{i}",
            host="localhost",
            local_addr="127.0.0.1",
            min_nodes=2,
            max_nodes=2,
        )
        for i in range(2)
    ]


@pytest.mark.integration
def test_node_rank_0_publishes_the_store_only_once_it_is_open(two_node_master: object) -> None:
    from dlrover.launcher.grpc_control import store_address_key
    from dlrover.master import MasterRuntime

    assert isinstance(two_node_master, MasterRuntime)
    planes = _two_node_planes(two_node_master)
    # What the other node could read under each round's key when node rank 0 opened its store.
    seen_at_open: list[dict[int, bytes | None]] = []

    def open_store(host: str) -> int:
        assert host == "127.0.0.1"
        numbers = range(5)
        values = planes[1].kv_get([store_address_key(n) for n in numbers])
        seen_at_open.append(dict(zip(numbers, values, strict=True)))
        return 43210

    try:
        for plane in planes:
            plane.register(1)
        rounds: dict[int, RoundAssignment] = {}
        errors: list[BaseException] = []

        def join(i: int) -> None:
            try:
                rounds[i] = planes[i].next_round(60.0, open_store=open_store)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert not errors, errors
        assert {(r.master_addr, r.master_port, r.agent_store) for r in rounds.values()} == {("127.0.0.1", 43210, True)}
        assert sorted(r.group_rank for r in rounds.values()) == [0, 1]
        number = rounds[0].round
        assert number in seen_at_open[0]
        # Only node rank 0 opened a store, and nothing was published for the round before it did.
        assert len(seen_at_open) == 1
        assert seen_at_open[0][number] is None
        (published,) = planes[1].kv_get([store_address_key(number)])
        assert published is not None
        assert decode_store_address(published) == ("127.0.0.1", 43210, True)
    finally:
        for plane in planes:
            plane.close()


class _TwoAgents:
    """Two agents as two "nodes" of one master, each running on its own thread."""

    def __init__(self, agents: list[Agent], stores: list[TorchStoreHost]) -> None:
        self.agents, self.stores = agents, stores
        self.results: dict[int, AgentResult] = {}
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(len(agents))]

    def _run(self, i: int) -> None:
        try:
            self.results[i] = self.agents[i].run()
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)


@contextlib.contextmanager
def _two_agents(runtime: object, worker_argv: tuple[str, ...], run_id: str) -> Iterator[_TwoAgents]:
    """Start one agent per "node" of the two-node master; stop them and close their planes after.

    Each agent runs on its own long-lived thread (workers die with the thread that started them)
    with its own store host; only the one that gets node rank 0 opens one.
    """
    planes = _two_node_planes(runtime)
    config = AgentConfig(
        worker_argv=worker_argv,
        nproc_per_node=1,
        run_id=run_id,
        monitor_interval_s=0.05,
        shutdown_grace_s=5.0,
        host_checkpoint_saver=False,
    )
    stores = [TorchStoreHost(), TorchStoreHost()]
    two = _TwoAgents([Agent(config, planes[i], store_host=stores[i]) for i in range(2)], stores)
    try:
        for thread in two.threads:
            thread.start()
        yield two
    finally:
        for agent in two.agents:
            agent.request_stop("test over")
        for thread in two.threads:
            thread.join(60)
        for plane in planes:
            plane.close()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_two_nodes_train_on_the_store_node_rank_0s_agent_hosts(tmp_path: Path, two_node_master: object) -> None:
    from dlrover.master import MasterRuntime

    assert isinstance(two_node_master, MasterRuntime)
    script = tmp_path / "worker.py"
    script.write_text(HANDSHAKE_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    with _two_agents(two_node_master, (sys.executable, str(script), str(out), "ok"), "two-nodes") as two:
        for thread in two.threads:
            thread.join(200)
    errors, results, stores = two.errors, two.results, two.stores
    assert not errors, errors
    assert [results[i].exit_code for i in range(2)] == [0, 0], results  # type: ignore[attr-defined]
    records = _records(tmp_path)
    assert set(records) == {"rank0_attempt0", "rank1_attempt0"}
    first, second = records["rank0_attempt0"], records["rank1_attempt0"]
    assert first["TORCHELASTIC_USE_AGENT_STORE"] == second["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert first["MASTER_PORT"] == second["MASTER_PORT"]
    assert first["rank1_key"] == "set by rank 1"
    assert first["sum"] == second["sum"] == 3.0
    assert all(store.address is None for store in stores)
    assert _refused(int(first["MASTER_PORT"]))  # type: ignore[call-overload]


# Both ranks train; rank 1 then waits for the test's word and only then uses the store, as a
# node that finishes later (a last evaluation, a save, NCCL's watchdog) does.
LATE_STORE_WORKER = textwrap.dedent(
    """
    import datetime, json, os, sys, time
    import torch, torch.distributed as dist
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    if rank == 1:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(out, "go")):
            if time.monotonic() > deadline:
                sys.exit("never told to go on")
            time.sleep(0.05)
        client = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=10))
        client.set("late", "still served")
        path = os.path.join(out, "rank1.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"late": client.get("late").decode(), "MASTER_PORT": port}, f)
        os.replace(path + ".tmp", path)
    """
)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_node_finishing_later_still_has_the_store_after_node_rank_0_finished(
    tmp_path: Path, two_node_master: object
) -> None:
    from dlrover.master import MasterRuntime, NodeState

    assert isinstance(two_node_master, MasterRuntime)
    runtime = two_node_master
    script = tmp_path / "worker.py"
    script.write_text(LATE_STORE_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    with _two_agents(runtime, (sys.executable, str(script), str(out)), "exit-barrier") as two:
        # Node rank 0's workers finished and the master heard so; node rank 1's still run.
        _wait_for(
            lambda: (
                [n.state for n in runtime.master.status().nodes].count(NodeState.SUCCEEDED) == 1 or bool(two.errors)
            ),
            timeout_s=180,
        )
        assert not two.errors, two.errors
        # Time for an agent that does not wait to close the store and exit (not a measurement:
        # the agent that hosts the store must not return before the other node finishes at all).
        time.sleep(1.0)
        assert all(thread.is_alive() for thread in two.threads), two.results
        (out / "go").touch()
        for thread in two.threads:
            thread.join(120)
    errors, results, stores = two.errors, two.results, two.stores
    assert not errors, errors
    assert [results[i].exit_code for i in range(2)] == [0, 0], results
    record = json.loads((out / "rank1.json").read_text())
    assert record["late"] == "still served"
    assert all(store.address is None for store in stores)
    assert _refused(int(record["MASTER_PORT"]))
