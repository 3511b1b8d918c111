"""The saver in this process with a real Unix socket: persist requests, commit across ranks, bad
messages, a full disk, and persist on failure. Plus the channel's framing."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import attrs
import pytest
import torch
from flashckpt_testlib import our_files

from dlrover.common import ConfigError, ManualClock
from dlrover.flashckpt.channel import MAX_FRAME_BYTES, ChannelError, recv_message, send_message, unix_address
from dlrover.flashckpt.client import KEPT_PERSIST_OUTCOMES, SaverClient
from dlrover.flashckpt.commit import Committer, Tracker
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.payloads import payload_from_state
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.saver import Saver, SaverConfig
from dlrover.flashckpt.saver_core import HeldFailure, choose_failure_step, failure_persist_due, steps_to_join
from dlrover.flashckpt.segment import remove_run
from dlrover.flashckpt.stager import Stager
from dlrover.flashckpt.storage import InMemoryStorage
from dlrover.flashckpt.storage.base import Chunk
from dlrover.flashckpt.storage_loader import StorageReader

WAIT_S = 60.0


def _wait_until(predicate: Callable[[], bool]) -> None:
    """Wait for a condition another thread makes true, with a generous bound."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


# -- channel ----------------------------------------------------------------------------------------


def test_channel_roundtrip_and_eof() -> None:
    a, b = socket.socketpair()
    with a, b:
        send_message(a, {"type": "persist", "rank": 1, "step": 2})
        assert recv_message(b) == {"type": "persist", "rank": 1, "step": 2}
        a.shutdown(socket.SHUT_WR)
        assert recv_message(b) is None


def test_a_client_keeps_only_the_newest_persist_answers(tmp_path: Path) -> None:
    """A saver that answers many persists: the client holds the newest KEPT_PERSIST_OUTCOMES, no more."""
    path = tmp_path / "saver.sock"
    answers = KEPT_PERSIST_OUTCOMES + 5
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        with unix_address(path) as address:
            listener.bind(address)
        listener.listen(1)

        def fake_saver() -> None:
            conn, _ = listener.accept()
            with conn:
                assert recv_message(conn) is not None  # hello
                send_message(conn, {"type": "welcome", "saver_pid": 1})
                for step in range(answers):
                    send_message(conn, {"type": "persisted", "rank": 0, "step": step, "committed": True})
                # The oldest step answered again is the newest answer, kept.
                send_message(conn, {"type": "persisted", "rank": 0, "step": 0, "committed": True})
                recv_message(conn)  # until the client says bye

        saver = threading.Thread(target=fake_saver, daemon=True)
        saver.start()
        client = SaverClient(path, 0, 1)
        try:
            assert client.wait_persisted(answers - 1, WAIT_S).step == answers - 1
            # Step 5 goes only when step 0's second answer comes, the last one sent.
            _wait_until(lambda: not client.holding_or_done(5))
            assert client.wait_persisted(0, 0.0).committed
            # Steps 1..5 were dropped for the newer ones; the rest are there at once.
            assert [client.holding_or_done(step) for step in range(1, 7)] == [False] * 5 + [True]
        finally:
            client.close()
        saver.join(WAIT_S)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (struct.pack(">I", MAX_FRAME_BYTES + 1), "exceeds"),
        (struct.pack(">I", 5) + b"{bad}", "not JSON"),
        (struct.pack(">I", 2) + b"[]", "string 'type'"),
        (struct.pack(">I", 10) + b"{}", "closed inside a frame"),
        (b"\x00\x00", "closed inside a frame"),
    ],
)
def test_channel_rejects_bad_frames(raw: bytes, match: str) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(raw)
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ChannelError, match=match):
            recv_message(b)


def test_channel_refuses_to_send_bad_messages() -> None:
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(ChannelError, match="type"):
            send_message(a, {"rank": 1})
        with pytest.raises(ChannelError, match="exceeds"):
            send_message(a, {"type": "x", "pad": "a" * MAX_FRAME_BYTES})


# -- pure decision -------------------------------------------------------------------------------


def test_choose_failure_step() -> None:
    assert choose_failure_step({0: [1, 2], 1: [2, 3]}, [0, 1], [])[0] == 2
    step, reason = choose_failure_step({0: [1, 2], 1: [3]}, [0, 1], [])
    assert step is None
    assert "no step is complete" in reason
    step, reason = choose_failure_step({0: [2], 1: [2]}, [0, 1], [2])
    assert step is None
    assert "already persisted" in reason
    assert choose_failure_step({}, [], [])[0] is None


def test_choose_failure_step_prefers_the_step_held_at_the_failure() -> None:
    # Restarted ranks sealed step 3 since; step 2 (held by all at the failure) is still in memory.
    step, reason = choose_failure_step({0: [2, 3], 1: [2, 3]}, [0, 1], [], preferred=2)
    assert step == 2
    assert "when the failure happened" in reason
    # Overwritten meanwhile on rank 1: the newest common step instead, saying so.
    step, reason = choose_failure_step({0: [2, 3], 1: [3, 4]}, [0, 1], [], preferred=2)
    assert step == 3
    assert "overwritten" in reason
    step, reason = choose_failure_step({0: [2, 3], 1: [2, 3]}, [0, 1], [2], preferred=2)
    assert step is None
    assert "already persisted" in reason
    step, reason = choose_failure_step({0: [2, 3], 1: [2, 3]}, [0, 1], [3], preferred=2)
    assert step is None
    assert "older than step 3, already persisted" in reason


def test_steps_to_join() -> None:
    # Node 1 (rank 1) persisted step 1; this node (rank 0) holds steps 1 and 2.
    assert [s for s, _ in steps_to_join({1: [1], 2: [0]}, [0], {0: [1, 2]}, [2])] == [1]
    # A step only this node's ranks wrote, or that it persisted already, is no join.
    assert steps_to_join({2: [0]}, [0], {0: [1, 2]}, []) == []
    assert steps_to_join({1: [1]}, [0], {0: [1, 2]}, [1]) == []
    # Every rank of this node must hold the step.
    assert steps_to_join({1: [2]}, [0, 1], {0: [1, 2], 1: [2, 3]}, []) == []
    joins = steps_to_join({3: [2], 2: [3]}, [0, 1], {0: [2, 3], 1: [2, 3]}, [])
    assert [s for s, _ in joins] == [3, 2]  # newest first
    assert "ranks [2] of other nodes persisted step 3" in joins[0][1]
    assert steps_to_join({1: [1]}, [], {}, []) == []


def test_failure_persist_due() -> None:
    held = HeldFailure(first_lost_at=10.0, last_lost_at=11.0, step=2)
    assert not failure_persist_due(held, 12.0, 30.0, {0: 12.0}, [0, 1])[0]  # rank 1 not back yet
    assert not failure_persist_due(held, 12.0, 30.0, {0: 12.0, 1: 10.5}, [0, 1])[0]  # sealed before the loss
    due, reason = failure_persist_due(held, 12.0, 30.0, {0: 12.0, 1: 11.0}, [0, 1])
    assert due
    assert "train again" in reason
    due, reason = failure_persist_due(held, 40.0, 30.0, {}, [0, 1])
    assert due
    assert "longest hold" in reason
    assert not failure_persist_due(held, 39.9, 30.0, {}, [])[0]  # no rank known: only the bound ends it


# -- the saver ---------------------------------------------------------------------------------


class Node:
    """A saver and two ranks' stagers and clients in this process (world size 2)."""

    def __init__(
        self, job: str, storage: InMemoryStorage, hold_s: float = 0.0, clock: ManualClock | None = None
    ) -> None:
        self.job = job
        self.storage = storage
        config = SaverConfig(
            job_id=job,
            run_id="r",
            world_size=2,
            lock_timeout_s=WAIT_S,
            failure_persist_hold_s=hold_s,
            commit_poll_interval_s=0.01,
        )
        self.saver = Saver(config, storage, clock=clock)
        self.saver.start()
        self.closed = False
        self.stagers: list[Stager] = []
        self.clients: list[SaverClient] = []
        for rank in range(2):
            self.clients.append(SaverClient(self.saver.socket_path, rank, 2))
            self.stagers.append(self._stager(rank))

    def _stager(self, rank: int, busy_policy: str = "wait") -> Stager:
        cfg = StagerConfig(
            job_id=self.job, run_id="r", rank=rank, world_size=2, seal_in_background=False, busy_policy=busy_policy
        )
        return Stager(cfg, on_sealed=self.clients[rank].notify_sealed)

    def kill(self, rank: int) -> None:
        """Rank `rank`'s process dies: its connection closes without 'bye'."""
        dying = self.clients[rank]
        attached = self.saver.active_connections()
        dying._sock.shutdown(socket.SHUT_RDWR)
        dying._reader.join(WAIT_S)
        self.stagers[rank].close()
        _wait_until(lambda: self.saver.active_connections() < attached)  # the saver saw it go

    def restart(self, rank: int, busy_policy: str = "wait") -> None:
        """A new process for rank `rank`: a new connection and stager on the same memory."""
        self.clients[rank].close()
        self.clients[rank] = SaverClient(self.saver.socket_path, rank, 2)
        self.stagers[rank] = self._stager(rank, busy_policy)

    def save(self, rank: int, step: int) -> None:
        assert self.try_save(rank, step)

    def try_save(self, rank: int, step: int) -> bool:
        """Whether the snapshot was taken (False: skipped under the busy policy)."""
        return self.stagers[rank].save(step, {"w": torch.full((8,), float(step * 10 + rank)), "s": step}).saved

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for stager in self.stagers:
            stager.close()
        for client in self.clients:
            client.close()
        self.saver.stop(remove_memory=True)


@pytest.fixture
def node(job_id: str) -> Iterator[Node]:
    n = Node(job_id, InMemoryStorage())
    yield n
    n.close()
    assert our_files(job_id) == []


def test_stagers_do_not_own_memory_the_saver_does(node: Node) -> None:
    assert not any(s.owns_segments for s in node.stagers)


def test_persist_commits_when_every_rank_is_done(node: Node) -> None:
    for rank in range(2):
        node.save(rank, 1)
    node.clients[0].request_persist(1)
    first = node.clients[0].wait_persisted(1, WAIT_S)
    assert first.ok
    assert not first.committed
    assert "[1]" in first.reason
    assert Committer(node.storage).tracker() is None
    node.clients[1].request_persist(1)
    second = node.clients[1].wait_persisted(1, WAIT_S)
    assert second.ok
    assert second.committed
    assert Committer(node.storage).tracker() == Tracker(1, 2)
    loaded = StorageReader(node.storage).load(1, 2)
    assert torch.equal(loaded.state["w"], torch.full((8,), 11.0))


def test_persist_of_a_step_not_in_memory_is_reported(node: Node) -> None:
    node.save(0, 1)
    node.clients[0].request_persist(7)
    outcome = node.clients[0].wait_persisted(7, WAIT_S)
    assert not outcome.ok
    assert "no complete snapshot of step 7" in outcome.reason
    assert "persist_failed" in node.clients[0].events.kinds()


def test_full_disk_is_reported_and_training_goes_on(node: Node) -> None:
    for rank in range(2):
        node.save(rank, 1)
        node.clients[rank].request_persist(1)
        assert node.clients[rank].wait_persisted(1, WAIT_S).committed is (rank == 1)
    node.storage.capacity_bytes = node.storage.size("1/rank_00000.safetensors") * 2 + 100
    node.save(0, 2)
    node.clients[0].request_persist(2)
    outcome = node.clients[0].wait_persisted(2, WAIT_S)
    assert not outcome.ok
    assert "no space left" in outcome.reason
    node.save(0, 3)  # training continues
    assert Committer(node.storage).tracker() == Tracker(1, 2)
    assert StorageReader(node.storage).load(0, 2).step == 1


def test_bad_messages_get_errors_and_change_nothing(node: Node) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(WAIT_S)
        with unix_address(node.saver.socket_path) as address:
            s.connect(address)
        send_message(s, {"type": "persist", "rank": -1, "step": 1})
        reply = recv_message(s)
        assert reply is not None
        assert reply["type"] == "error"
        assert "'rank'" in reply["reason"]
        send_message(s, {"type": "launch_missiles"})
        reply = recv_message(s)
        assert reply is not None
        assert "unknown message type 'launch_missiles'" in reply["reason"]
    assert node.saver.wait_idle(WAIT_S)
    assert node.storage.list_dir("") == []


def test_persist_on_failure_commits_newest_common_step(node: Node) -> None:
    for step in (1, 2):
        for rank in range(2):
            node.save(rank, step)
    node.save(1, 3)  # rank 1 got one step further; rank 0 holds {1, 2}, rank 1 holds {2, 3}
    node.kill(0)
    _wait_until(lambda: "committed" in node.saver.events.kinds())
    assert "stager_lost" in node.saver.events.kinds()
    assert Committer(node.storage).tracker() == Tracker(2, 2)
    for rank in range(2):
        assert StorageReader(node.storage).load(rank, 2).state["s"] == 2


def test_a_failure_persist_writes_nothing_for_a_step_storage_committed_already(node: Node) -> None:
    # The training processes persisted step 2 themselves (a sharded job's DCP persist, here a
    # plain commit written beside the saver), then died holding nothing newer.
    for rank in range(2):
        node.save(rank, 2)
        persist_rank(node.storage, payload_from_state(2, rank, 2, {"w": torch.zeros(1), "s": 2}))
    assert Committer(node.storage).try_commit(2, 2).commit
    writes: list[str] = []
    node.storage.before_write = writes.append
    node.kill(0)
    _wait_until(lambda: "failure_persist" in node.saver.events.kinds())
    (event,) = [e for e in node.saver.events.snapshot() if e.kind == "failure_persist"]
    assert "not newer than the committed step 2" in event.reason
    assert writes == []  # the committed step is not written over
    assert "persisted" not in node.saver.events.kinds()


def test_a_peer_stopped_after_a_failure_queues_no_second_failure_persist(node: Node) -> None:
    for step in (1, 2):
        for rank in range(2):
            node.save(rank, step)
    node.kill(1)
    _wait_until(lambda: "committed" in node.saver.events.kinds())
    node.kill(0)  # the agent stops the surviving rank for the restart: the same failure
    _wait_until(lambda: "failure_persist_covered" in node.saver.events.kinds())
    assert node.saver.wait_idle(WAIT_S)
    assert node.saver.events.kinds().count("failure_persist") == 1
    # The restarted processes are a new generation: their loss is a failure of its own.
    node.restart(0)
    node.restart(1)
    for rank in range(2):
        node.save(rank, 3)
    node.kill(1)
    _wait_until(lambda: Committer(node.storage).tracker() == Tracker(3, 2))
    assert node.saver.events.kinds().count("failure_persist") == 2
    assert node.saver.events.kinds().count("failure_persist_covered") == 1


class _GatedStorage(InMemoryStorage):
    """Holds one rank's tensor file at a gate the test opens: before storage takes its bytes or,
    with `after_taking`, after (a slow fsync)."""

    def __init__(self, gated_rank: int, after_taking: bool = False) -> None:
        super().__init__()
        self._gated = f"rank_{gated_rank:05d}.safetensors"
        self._after_taking = after_taking
        self.reached = threading.Event()
        self.gate = threading.Event()

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        if path.endswith(self._gated):
            if self._after_taking:
                chunks = [b"".join(bytes(c) for c in chunks)]
            self.reached.set()
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return super().write_file(path, chunks)


def test_a_failure_persist_holds_every_ranks_snapshot_before_it_writes_the_first(job_id: str) -> None:
    # Restarted ranks save again while the failure persist still writes rank 0: rank 1's snapshot
    # of the failure step, not yet written, must not be overwritten by rank 1's next-but-one save.
    storage = _GatedStorage(gated_rank=0)
    node = Node(job_id, storage)
    try:
        for step in (1, 2):
            for rank in range(2):
                node.save(rank, step)
        assert not node.saver.failure_persist_pending()
        node.kill(1)
        assert storage.reached.wait(WAIT_S)  # persisting rank 0's step 2, rank 1's is next
        assert node.saver.failure_persist_pending()
        node.kill(0)  # the agent stops the surviving rank for the restart
        for rank in range(2):
            node.restart(rank, busy_policy="skip")
        node.save(1, 3)  # into the slot of step 1
        assert not node.try_save(1, 4)  # only step 2's slot is left, and the failure persist holds it
        skipped = [e for e in node.stagers[1].events.snapshot() if e.kind == "save_skipped"]
        assert [e.step for e in skipped] == [4]
        storage.gate.set()
        _wait_until(lambda: Committer(storage).tracker() == Tracker(2, 2))
        assert "persist_failed" not in node.saver.events.kinds()
        for rank in range(2):
            loaded = StorageReader(storage).load(rank, 2)
            assert torch.equal(loaded.state["w"], torch.full((8,), float(20 + rank)))
        assert node.saver.wait_idle(WAIT_S)
        assert not node.saver.failure_persist_pending()
        assert node.try_save(1, 4)  # step 2's slot is free again
    finally:
        storage.gate.set()
        node.close()
    assert our_files(job_id) == []


def test_a_persist_lets_the_slot_go_once_storage_has_its_bytes(job_id: str) -> None:
    storage = _GatedStorage(gated_rank=1, after_taking=True)
    node = Node(job_id, storage)
    try:
        for step in (1, 2):
            for rank in range(2):
                node.save(rank, step)
        node.stagers[1].close()
        node.stagers[1] = node._stager(1, busy_policy="skip")
        node.clients[1].request_persist(2)
        assert storage.reached.wait(WAIT_S)  # step 2's bytes are with storage, not yet durable
        node.save(1, 3)  # into the slot of step 1
        node.save(1, 4)  # into the slot of step 2, which the persist no longer needs
        storage.gate.set()
        outcome = node.clients[1].wait_persisted(2, WAIT_S)
        assert outcome.ok, outcome.reason
        node.clients[0].request_persist(2)
        assert node.clients[0].wait_persisted(2, WAIT_S).committed
        loaded = StorageReader(storage).load(1, 2)
        assert torch.equal(loaded.state["w"], torch.full((8,), 21.0))
    finally:
        storage.gate.set()
        node.close()
    assert our_files(job_id) == []


@contextlib.contextmanager
def _held_failure(job_id: str) -> Iterator[tuple[Node, ManualClock]]:
    """Two ranks saved steps 1 and 2, then rank 1 died at t=1: its saver holds the persist (30 s)."""
    clock = ManualClock()
    node = Node(job_id, InMemoryStorage(), hold_s=30.0, clock=clock)
    try:
        for step in (1, 2):
            for rank in range(2):
                node.save(rank, step)
        _wait_until(lambda: node.saver.ranks_sealed_since(0.0) == frozenset({0, 1}))
        clock.advance(1.0)
        node.kill(1)
        _wait_until(lambda: "failure_persist_held" in node.saver.events.kinds())
        assert node.saver.failure_persist_pending()  # held counts: it is still to run
        yield node, clock
    finally:
        node.close()
    assert our_files(job_id) == []


def test_failure_persist_waits_until_the_restarted_ranks_train(job_id: str) -> None:
    with _held_failure(job_id) as (node, clock):
        clock.advance(1.0)
        node.kill(0)  # the agent stops the surviving rank for the restart
        node.restart(0)
        node.restart(1)
        clock.advance(1.0)
        node.save(0, 3)
        _wait_until(lambda: node.saver.ranks_sealed_since(3.0) == frozenset({0}))  # the saver saw it
        assert node.saver.wait_idle(WAIT_S)
        assert "failure_persist_released" not in node.saver.events.kinds()  # rank 1 is not back yet
        node.save(1, 3)
        _wait_until(lambda: "committed" in node.saver.events.kinds())
        # The step every rank held at the failure, not the newer step 3: other nodes choose it too.
        assert Committer(node.storage).tracker() == Tracker(2, 2)
        released = [e for e in node.saver.events.snapshot() if e.kind == "failure_persist_released"]
        assert len(released) == 1
        assert "train again" in released[0].reason


def test_failure_persist_hold_ends_after_its_bound(job_id: str) -> None:
    with _held_failure(job_id) as (node, clock):
        clock.advance(29.0)
        assert node.saver.wait_idle(WAIT_S)
        assert node.storage.list_dir("") == []
        clock.advance(1.0)  # the worker thread looks again within commit_poll_interval_s
        _wait_until(lambda: "committed" in node.saver.events.kinds())
        assert Committer(node.storage).tracker() == Tracker(2, 2)


@pytest.mark.parametrize("how", ["persist_newest", "release_held", "stop"])
def test_held_failure_persist_runs_at_once_when_the_saver_stops(job_id: str, how: str) -> None:
    with _held_failure(job_id) as (node, _clock):
        if how == "persist_newest":
            node.saver.persist_newest()
            _wait_until(lambda: "committed" in node.saver.events.kinds())
        elif how == "release_held":  # the agent's node ranks changed
            node.saver.release_held("this node's ranks changed")
            _wait_until(lambda: "committed" in node.saver.events.kinds())
        else:
            node.close()
        assert "failure_persist_released" in node.saver.events.kinds()
        assert Committer(node.storage).tracker() == Tracker(2, 2)


def test_saver_config_validation() -> None:
    with pytest.raises(ConfigError, match="'bad id'"):
        SaverConfig(job_id="bad id", run_id="r")
    with pytest.raises(ConfigError, match="lock_timeout_s"):
        SaverConfig(job_id="j", run_id="r", lock_timeout_s=0)
    with pytest.raises(ConfigError, match="failure_persist_hold_s"):
        SaverConfig(job_id="j", run_id="r", failure_persist_hold_s=-1)


def test_lost_saver_never_stops_training(job_id: str) -> None:
    from dlrover.flashckpt import FlashCheckpointer

    storage = InMemoryStorage()
    saver = Saver(SaverConfig(job_id=job_id, run_id="r"), storage)
    saver.start()
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), storage=storage, saver="connect")
    try:
        state = {"w": torch.ones(4)}
        ckpt.save(1, state, persist=True)
        assert ckpt.wait_persisted(1, WAIT_S).committed
        saver.stop(remove_memory=False)
        _wait_until(lambda: "saver_lost" in ckpt.events.kinds())
        result = ckpt.save(2, state, persist=True)  # no exception: training goes on
        assert result.saved
        ckpt.stager.flush()
        assert "persist_failed" in ckpt.events.kinds()
        assert ckpt.load().step == 2  # the snapshot is still in memory
    finally:
        ckpt.close()
        remove_run("/dev/shm", job_id, "r")


@pytest.mark.parametrize("busy_policy", ["wait", "skip"])
def test_a_rank_saving_every_step_keeps_a_requested_snapshot_until_the_saver_persisted_it(
    job_id: str, busy_policy: str
) -> None:
    # The saver persists the node's ranks one after another. Rank 0 asks to persist step 1, then trains on,
    # saving every step, while the saver still writes rank 1's step 1: its save of step 3 (into the slot of
    # step 1, the other holding step 2) must not write over step 1 before the saver got to it.
    from dlrover.flashckpt import FlashCheckpointer

    storage = _GatedStorage(gated_rank=1)
    saver = Saver(SaverConfig(job_id=job_id, run_id="r", world_size=2, lock_timeout_s=WAIT_S), storage)
    saver.start()
    stager_configs = [
        StagerConfig(
            job_id=job_id,
            run_id="r",
            rank=rank,
            world_size=2,
            busy_policy=busy_policy,
            busy_wait_timeout_s=WAIT_S,
            busy_poll_interval_s=0.01,
        )
        for rank in range(2)
    ]
    ckpts = [FlashCheckpointer(cfg, storage=storage, saver="connect") for cfg in stager_configs]
    saved_third: list[bool] = []
    try:
        state = [{"w": torch.full((8,), float(rank))} for rank in range(2)]
        ckpts[1].save(1, state[1], persist=True)
        assert storage.reached.wait(WAIT_S)  # the saver writes rank 1's step 1, held at the gate
        ckpts[0].save(1, state[0], persist=True)  # queued behind it
        assert ckpts[0].save(2, state[0]).saved
        third = threading.Thread(target=lambda: saved_third.append(ckpts[0].save(3, state[0]).saved))
        third.start()
        if busy_policy == "wait":
            third.join(0.3)
            assert third.is_alive(), "step 3 was written over the step 1 the saver has yet to persist"
        else:
            third.join(WAIT_S)
            assert saved_third == [False], "skipped: no slot free"
        storage.gate.set()
        third.join(WAIT_S)
        for ckpt in ckpts:
            outcome = ckpt.wait_persisted(1, WAIT_S)
            assert outcome.ok, outcome.reason
        assert Committer(storage).tracker() == Tracker(1, 2)
        assert saved_third == [busy_policy == "wait"]
        for rank in range(2):  # each rank's step 1, not a later step
            loaded = StorageReader(storage).load(rank, 2, step=1)
            assert torch.equal(loaded.state["w"], torch.full((8,), float(rank)))
    finally:
        storage.gate.set()
        for ckpt in ckpts:
            ckpt.close()
        saver.stop(remove_memory=True)
    assert our_files(job_id) == []


def test_a_save_the_agent_asks_for_does_not_wait_on_a_snapshot_kept_for_a_persist(
    job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A planned round is held until every worker saved: that save must not wait out a persist the saver
    # has not reached yet. It lets the kept snapshot go and says so.
    from dlrover.common.step_slots import STEP_SLOT_ENV_VAR, STEP_SLOTS_ENV_VAR, StepSlotFile
    from dlrover.flashckpt import FlashCheckpointer

    storage = _GatedStorage(gated_rank=1)
    saver = Saver(SaverConfig(job_id=job_id, run_id="r", world_size=2, lock_timeout_s=WAIT_S), storage)
    saver.start()
    slots = StepSlotFile(tmp_path / "steps.slots", 1)
    ckpts = []
    try:
        for rank in (1, 0):  # rank 0 runs under the agent's step slots
            if rank == 0:
                monkeypatch.setenv(STEP_SLOTS_ENV_VAR, str(slots.path))
                monkeypatch.setenv(STEP_SLOT_ENV_VAR, "0")
            cfg = StagerConfig(job_id=job_id, run_id="r", rank=rank, world_size=2, busy_wait_timeout_s=WAIT_S)
            ckpts.append(FlashCheckpointer(cfg, storage=storage, saver="connect"))
        rank1, rank0 = ckpts
        state = {"w": torch.zeros(8)}
        rank1.save(1, state, persist=True)
        assert storage.reached.wait(WAIT_S)  # the saver is busy with rank 1
        rank0.save(1, state, persist=True)  # kept until the saver gets to it
        rank0.save(2, state)
        assert not rank0.save_requested()
        slots.request_save()  # the agent holds a planned round
        assert rank0.save_requested()
        assert rank0.save(3, state).saved, "the requested save waited on the kept snapshot"
        assert "keep_released" in rank0.events.kinds()
        assert rank0.round_pending()
    finally:
        storage.gate.set()
        for ckpt in ckpts:
            ckpt.close()
        saver.stop(remove_memory=True)
        slots.close()
    assert our_files(job_id) == []


@attrs.define
class TwoNodes:
    """Two nodes of one rank each: a saver per node (own shared memory), one storage for the job;
    only node 0's saver coordinates."""

    storage: InMemoryStorage
    savers: list[Saver]
    clients: list[SaverClient]
    stagers: list[Stager]

    def kill(self, node: int) -> None:
        """Node `node`'s training process dies: its connection closes without 'bye'."""
        attached = self.savers[node].active_connections()
        self.clients[node]._sock.shutdown(socket.SHUT_RDWR)
        self.clients[node]._reader.join(WAIT_S)
        _wait_until(lambda: self.savers[node].active_connections() < attached)


@contextlib.contextmanager
def _two_nodes(job_id: str) -> Iterator[TwoNodes]:
    nodes = TwoNodes(InMemoryStorage(), [], [], [])
    try:
        for node in range(2):
            run = f"n{node}"  # each node has its own shared memory; the job's storage is shared
            config = SaverConfig(
                job_id=job_id, run_id=run, world_size=2, coordinator=node == 0, commit_poll_interval_s=0.01
            )
            nodes.savers.append(Saver(config, nodes.storage))
            nodes.savers[-1].start()
            nodes.clients.append(SaverClient(nodes.savers[-1].socket_path, node, 2))
            cfg = StagerConfig(job_id=job_id, run_id=run, rank=node, world_size=2, seal_in_background=False)
            nodes.stagers.append(Stager(cfg, on_sealed=nodes.clients[-1].notify_sealed))
        yield nodes
    finally:
        for stager in nodes.stagers:
            stager.close()
        for client in nodes.clients:
            client.close()
        for saver in nodes.savers:
            saver.stop(remove_memory=True)


def test_coordinator_commits_when_another_node_finishes(job_id: str) -> None:
    with _two_nodes(job_id) as nodes:
        clients = nodes.clients
        for rank in range(2):
            assert nodes.stagers[rank].save(5, {"w": torch.full((2,), float(rank))}).saved
        clients[0].request_persist(5)
        assert not clients[0].wait_persisted(5, WAIT_S).committed  # rank 1 not done yet
        clients[1].request_persist(5)
        outcome = clients[1].wait_persisted(5, WAIT_S)
        assert outcome.ok
        assert not outcome.committed  # node 1 is not the coordinator
        _wait_until(lambda: Committer(nodes.storage).tracker() == Tracker(5, 2))
        assert "committed" in nodes.savers[0].events.kinds()


def test_nodes_whose_failure_persists_chose_different_steps_still_commit_a_common_one(job_id: str) -> None:
    """Node 0's rank staged step 2 before dying, node 1's did not: each saver first persists its own
    newest step (2 and 1); node 0's then sees rank 1's step 1 in storage, writes step 1 from memory
    too, and step 1, which every rank holds, is committed."""
    with _two_nodes(job_id) as nodes:
        for rank in range(2):
            assert nodes.stagers[rank].save(1, {"w": torch.full((4,), 1.0 + rank)}).saved
        assert nodes.stagers[0].save(2, {"w": torch.full((4,), 2.0)}).saved
        nodes.kill(0)
        nodes.kill(1)
        _wait_until(lambda: Committer(nodes.storage).tracker() == Tracker(1, 2))
        assert "failure_persist_join" in nodes.savers[0].events.kinds()
        assert "failure_persist_join" not in nodes.savers[1].events.kinds()  # it does not hold step 2
        loaded = [StorageReader(nodes.storage).load(rank, 2) for rank in range(2)]
        assert [x.step for x in loaded] == [1, 1]
        assert torch.equal(loaded[1].state["w"], torch.full((4,), 2.0))
