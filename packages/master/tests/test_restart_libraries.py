"""A `dlrover-master` process SIGKILLed mid-job and restarted on its state directory keeps the hosted libraries.

Real processes, real gRPC on 127.0.0.1. The export cadence is set to an hour, so whatever the
restarted master knows about shard progress came from journaling each change before answering.
The first test kills between calls (it drives the workers one call at a time): a call in flight
at the kill is in doubt for any client, see the README. The second sends a lease asked for ahead
to a master that is dead, or frozen and then killed with the call unread.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import grpc
import pytest

from dlrover.common import RetryPolicy, RpcError, load_token
from dlrover.master.client import MasterClient
from dlrover.rendezvous import PollState, RendezvousClient
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, Shard, ShardClient, ShardClientConfig

pytestmark = pytest.mark.integration

SAMPLES = 100
SPEC = DatasetSpec(
    name="train",
    source=IndexSource(SAMPLES),
    batch_size=5,
    batches_per_shard=2,
    shuffle=True,
    shuffle_samples=True,
    seed=7,
    delivery=DeliveryMode.EXACTLY_ONCE,
)
POLICY = RetryPolicy(call_timeout_s=20.0, total_timeout_s=60.0, max_attempts=20)
FLAGS = ["--backend", "external", "--nnodes", "2", "--heartbeat-timeout-s", "60", "--heartbeat-interval-s", "1",
         "--node-start-timeout-s", "0", "--rdzv-last-call-s", "0", "--state-export-interval-s", "3600",
         "--tick-interval-s", "0.2"]  # fmt: skip


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.05)


def start_master(state: Path, log: Path, port: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """`dlrover-master` as a real process; returns it and the address it printed."""
    start = log.stat().st_size if log.exists() else 0
    out = open(log, "ab")  # noqa: SIM115 - the child owns it; closed after it exits
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrover.master.cli", "--state-dir", str(state), "--port", str(port),
         "--log-level", "WARNING", *FLAGS],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out.close()
    found: list[str] = []

    def listening() -> bool:
        text = log.read_text(errors="replace") if log.exists() else ""
        found.extend(re.findall(r"listening on (\S+)", text[start:]))
        assert proc.poll() is None, f"the master exited early: {text}"
        return bool(found)

    wait_for(listening, what="the master listening")
    return proc, found[-1]


class Worker:
    """Reads shards one sample at a time, acknowledging each, and counts what the master acknowledged."""

    def __init__(self, address: str, token: str, worker: str, acks: Counter[int]) -> None:
        self.client = ShardClient(
            address, token, "train", worker, config=ShardClientConfig(prefetch_shards=0, retry=POLICY)
        )
        self.acks = acks
        self.shard: Shard | None = None
        self.order: list[int] = []
        self.pos = 0
        self.abandoned = 0
        self.finished = False

    def step(self) -> None:
        """One call: fetch a shard, or acknowledge the next sample (and finish the shard)."""
        if self.shard is None:
            result = self.client.fetch()
            if not result.shards:
                self.finished = result.finished
                return
            self.shard = result.shards[0]
            self.order, self.pos = self.shard.sample_order(), self.shard.consumed
            return
        try:
            reply = self.client.report_progress(self.shard.shard_id, self.pos + 1)
        except RpcError as exc:
            if exc.code is not grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # The master took the lease back (it expired): the unacknowledged rest goes to whoever fetches next.
            self.shard, self.abandoned = None, self.abandoned + 1
            return
        assert reply.changed, reply.reason
        self.acks[self.order[self.pos]] += 1
        self.pos += 1
        if self.pos == self.shard.size:
            self.client.report_done(self.shard.shard_id)
            self.shard = None

    @property
    def midway(self) -> bool:
        return self.shard is not None and 0 < self.pos < self.shard.size


class TwoNodeJob:
    """A `dlrover-master` process with two registered agents whose nodes joined the rendezvous."""

    def __init__(self, tmp_path: Path) -> None:
        self.state, self.log = tmp_path / "state", tmp_path / "master.log"
        proc, self.address = start_master(self.state, self.log)
        self.procs = [proc]
        self.clients: list[MasterClient | RendezvousClient | ShardClient] = []

    @property
    def master(self) -> subprocess.Popen[bytes]:
        """The master process now running (the last started)."""
        return self.procs[-1]

    def join(self) -> None:
        self.token = load_token(token_file=self.state / "token")
        self.agents = [MasterClient(self.address, self.token, policy=POLICY) for _ in range(2)]
        self.ids = [str(agent.register(f"agent-{i}", f"host-{i}").node_id) for i, agent in enumerate(self.agents)]
        self.rdzv = RendezvousClient(self.address, self.token, policy=POLICY)
        self.clients.extend([*self.agents, self.rdzv])
        for node in self.ids:
            assert self.rdzv.join(node, params=None).accepted

    def restart_master(self) -> None:
        """Start a master on the dead one's state directory and port."""
        proc, address = start_master(self.state, self.log, port=int(self.address.rsplit(":", 1)[1]))
        self.procs.append(proc)
        assert address == self.address

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # a stopped (frozen) master too
                p.wait(timeout=30)


@contextlib.contextmanager
def two_node_job(tmp_path: Path) -> Iterator[TwoNodeJob]:
    job = TwoNodeJob(tmp_path)
    try:
        job.join()
        yield job
    finally:
        job.close()


@pytest.mark.timeout(110)
def test_sigkill_mid_job_keeps_every_acknowledged_sample_once_and_the_round_and_ranks(tmp_path: Path) -> None:
    with two_node_job(tmp_path) as job:
        rdzv, ids = job.rdzv, job.ids
        before = {node: rdzv.poll(node) for node in ids}
        assert {p.state for p in before.values()} == {PollState.ASSIGNED}
        assert sorted(p.rank for p in before.values()) == [0, 1]

        acks: Counter[int] = Counter()
        workers = [Worker(job.address, job.token, node, acks) for node in ids]
        job.clients.extend(w.client for w in workers)
        assert workers[0].client.register(SPEC).created
        while sum(acks.values()) < SAMPLES * 0.45 or not all(w.midway for w in workers):
            for w in workers:
                w.step()

        os.killpg(job.master.pid, signal.SIGKILL)
        job.master.wait(timeout=30)
        job.restart_master()

        # The round and the ranks are what they were; nobody joined again.
        after = {node: rdzv.poll(node) for node in ids}
        assert {n: (p.state, p.round, p.rank) for n, p in after.items()} == {
            n: (p.state, p.round, p.rank) for n, p in before.items()
        }

        deadline = time.monotonic() + 60
        while not all(w.finished for w in workers):
            assert time.monotonic() < deadline, f"the data did not finish: {sum(acks.values())} acknowledged"
            for w in workers:
                if not w.finished:
                    w.step()
        assert sum(w.abandoned for w in workers) == 0  # both leases outlived the old master
        assert sorted(acks) == list(range(SAMPLES))  # nothing lost ...
        assert set(acks.values()) == {1}  # ... nothing acknowledged twice
        status = workers[0].client.status()
        assert (status.done, status.failed, status.doing) == (SAMPLES // 10, 0, 0)

        job.agents[0].stop_job("test over")
        assert job.master.wait(timeout=60) == 3


def _unread_connections(port: int) -> int:
    """Connections to 127.0.0.1:`port` holding bytes the listening process has not read."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, queues = fields[1], fields[3], fields[4]
                rx_queue = int(queues.split(":")[1], 16)
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01" and rx_queue > 0:
                    count += 1
    return count


class AheadWorker:
    """Trains whole shards as `ShardSampler` with a process group does: two shards a lease, the next
    lease asked for ahead (`lease_ahead`) once the buffer is empty, on a thread of the client's."""

    def __init__(self, address: str, token: str, worker: str) -> None:
        # Retries bounded by time alone: refused connects fail fast, and 20 attempts can run out
        # before a master restarted on two busy cores listens again.
        retry = attrs.evolve(POLICY, max_attempts=None)
        config = ShardClientConfig(prefetch_shards=0, fetch_count=2, retry=retry)
        self.client = ShardClient(address, token, "train", worker, config=config)
        self.trained: list[int] = []
        self.finished = False

    def train_one(self) -> None:
        """Train the next shard and report it done (queued while the master is away)."""
        shard = self.client.next_shard(timeout_s=60)
        if shard is None:
            self.finished = True
            return
        self.trained += shard.remaining_samples()
        self.client.report_done(shard.shard_id)

    def train_to_the_end(self, errors: list[BaseException]) -> None:
        try:
            while not self.finished:
                self.train_until_the_buffer_is_empty()
                if not self.finished:
                    self.client.lease_ahead()
            assert self.client.flush_reports(timeout_s=60)
        except BaseException as exc:  # the test thread raises it
            errors.append(exc)

    def train_until_the_buffer_is_empty(self) -> None:
        self.client.settle_lease_ahead()
        self.train_one()
        while self.client.buffered:
            self.train_one()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("master", ["down", "frozen"])
def test_a_lease_asked_for_ahead_across_a_master_sigkill_is_served_once(tmp_path: Path, master: str) -> None:
    """A lease asked for ahead (`lease_ahead`, two shards a lease) while the master is dead ("down":
    the fetch retries until the restarted master answers) or frozen ("frozen": SIGSTOPped, the
    fetches waiting unread in its sockets, then SIGKILLed): every sample is trained once, and no
    lease is left held for nobody. (A fetch the master served and could not answer is the lost-reply
    case of the shard package's tests and of the journal's replayed replies.)"""
    with two_node_job(tmp_path) as job:
        workers = [AheadWorker(job.address, job.token, node) for node in job.ids]
        job.clients.extend(w.client for w in workers)
        assert workers[0].client.register(SPEC).created
        for w in workers:  # two shards each, the second from the lease's buffer
            w.train_until_the_buffer_is_empty()
        assert all(w.client.flush_reports(timeout_s=60) for w in workers)

        proc = job.master
        if master == "frozen":
            os.killpg(proc.pid, signal.SIGSTOP)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        assert all(w.client.lease_ahead() for w in workers)
        if master == "frozen":
            port = int(job.address.rsplit(":", 1)[1])
            # The clients share one connection (gRPC pools them); nothing else is sent to it meanwhile.
            wait_for(lambda: _unread_connections(port) > 0, what="the fetches in the master's sockets")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        job.restart_master()

        # Each on a thread of its own: a worker with no shard left waits for the other's to be done.
        errors: list[BaseException] = []
        threads = [threading.Thread(target=w.train_to_the_end, args=(errors,), daemon=True) for w in workers]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 90
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 0.0))
        trained_by = [len(w.trained) for w in workers]
        assert not any(t.is_alive() for t in threads), f"the data did not finish: {trained_by}, errors {errors}"
        assert not errors, errors
        trained = Counter(s for w in workers for s in w.trained)
        assert sorted(trained) == list(range(SAMPLES))  # nothing lost ...
        assert set(trained.values()) == {1}  # ... nothing trained twice
        status = workers[0].client.status()
        assert (status.done, status.failed, status.doing, status.todo) == (SAMPLES // 10, 0, 0, 0)

        job.agents[0].stop_job("test over")
        assert job.master.wait(timeout=60) == 3
