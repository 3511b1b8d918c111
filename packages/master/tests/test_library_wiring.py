"""The master's one server hosts rendezvous and shards: real gRPC on 127.0.0.1, agents as clients in-process.

Time is a manual clock: heartbeat timeouts fire when the test advances it and ticks the master,
so nothing here waits on wall time.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import attrs
import grpc
import pytest

from dlrover.common import ManualClock, RetryPolicy, RpcError, generate_token
from dlrover.diagnosis import ActionKind, FailureKind
from dlrover.master.client import MasterClient
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.factory import create_master
from dlrover.master.journal import SqliteJournal
from dlrover.master.runtime import MasterRuntime
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.master.states import NodeState
from dlrover.rendezvous import PollState, RendezvousClient
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient, ShardClientConfig, ShardRegistry
from dlrover.shard.changelog import LoggedCall

pytestmark = pytest.mark.integration

SPEC = DatasetSpec(
    name="train", source=IndexSource(100), batch_size=5, batches_per_shard=2, delivery=DeliveryMode.EXACTLY_ONCE
)
ONCE = RetryPolicy(max_attempts=1)
IMPORT_ERROR = """Traceback (most recent call last):
  File "/job/train.py", line 3, in <module>
    import flash_attn_missing
ModuleNotFoundError: No module named 'flash_attn_missing'
"""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def runtime(clock: ManualClock) -> Iterator[MasterRuntime]:
    cfg = MasterConfig(
        job_name="wiring",
        lifecycle=LifecycleConfig(
            nodes=NodeRange(2, 3), heartbeat_timeout_s=10.0, node_start_timeout_s=None, insufficient_nodes_window_s=600
        ),
        token=generate_token(),
        backend="external",
        heartbeat_interval_s=1.0,
        tick_interval_s=3600.0,  # the test ticks
        rendezvous_last_call_s=1.0,
    )
    rt = create_master(cfg, scheduler=ExternalScheduler(), clock=clock)
    rt.start()
    yield rt
    rt.stop()


class Agent:
    """What an agent does against the master's one address: register, heartbeat, rendezvous, read shards."""

    def __init__(self, rt: MasterRuntime, name: str) -> None:
        self.master = MasterClient(rt.address, rt.token, policy=ONCE)
        self.node_id = self.master.register(name, f"host-{name}").node_id
        self.id = str(self.node_id)  # the agent's id in the rendezvous and the shard service
        self.rdzv = RendezvousClient(rt.address, rt.token, policy=ONCE)
        self.shards = ShardClient(
            rt.address, rt.token, "train", self.id, config=ShardClientConfig(prefetch_shards=0, retry=ONCE)
        )

    def close(self) -> None:
        self.shards.close(return_buffered=False)
        self.rdzv.close()
        self.master.close()


def test_agents_rendezvous_and_read_shards_at_the_masters_address_and_a_silent_node_is_let_go(
    runtime: MasterRuntime, clock: ManualClock
) -> None:
    agents = [Agent(runtime, name) for name in ("a", "b", "c")]
    a, b, c = agents
    try:
        for agent in agents:
            assert agent.rdzv.join(agent.id).accepted
        polls = {agent.id: agent.rdzv.poll(agent.id) for agent in agents}
        assert {p.state for p in polls.values()} == {PollState.ASSIGNED}
        assert {p.round for p in polls.values()} == {1}
        assert sorted(p.rank for p in polls.values()) == [0, 1, 2]  # contiguous from 0
        assert {p.world_size for p in polls.values()} == {3}

        assert c.shards.register(SPEC).created
        held = c.shards.fetch().shards[0]
        c.shards.report_progress(held.shard_id, 4)
        mine = a.shards.fetch().shards[0]

        # c goes silent; a and b keep heartbeating.
        clock.advance(11.0)
        a.master.heartbeat(step=1)
        b.master.heartbeat(step=1)
        runtime.master.tick()
        assert runtime.master.node(c.node_id).state is NodeState.RELAUNCHING

        # The round c was in is gone, and the others are told so.
        assert a.rdzv.num_nodes_waiting(a.id) >= 1
        poll = b.rdzv.poll(b.id)
        assert poll.state is PollState.NOT_WAITING
        assert "dissolved" in poll.reason
        assert f"'{c.id}' left" in poll.reason

        # c's shard goes to another worker at the position c acknowledged; c's lease is void.
        again = b.shards.fetch().shards[0]
        assert (again.shard_id, again.consumed) == (held.shard_id, 4)
        with pytest.raises(RpcError) as info:
            c.shards.report_progress(held.shard_id, 5)
        assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
        a.shards.report_progress(mine.shard_id, 1)  # a's lease is untouched

        # The replacement registers, and the new round gives it the rank c had.
        d = Agent(runtime, "d")
        agents.append(d)
        assert runtime.master.node(d.node_id).rank == runtime.master.node(c.node_id).rank
        for agent in (a, b, d):
            agent.rdzv.join(agent.id)
        second = {agent.id: agent.rdzv.poll(agent.id) for agent in (a, b, d)}
        assert {p.round for p in second.values()} == {2}
        assert {k: p.rank for k, p in second.items()} == {
            a.id: polls[a.id].rank,
            b.id: polls[b.id].rank,
            d.id: polls[c.id].rank,
        }
    finally:
        for agent in agents:
            agent.close()


def test_a_node_that_finished_first_never_dissolves_the_round_its_peer_still_trains_in(
    runtime: MasterRuntime, clock: ManualClock
) -> None:
    # Nodes finish at different times (rank 0's last evaluation, uneven data). The one done first
    # stops calling; its silence past every heartbeat timeout must not tell the other to restart.
    agents = [Agent(runtime, name) for name in ("a", "b")]
    a, b = agents
    try:
        for agent in agents:
            assert agent.rdzv.join(agent.id).accepted
        clock.advance(1.5)  # min 2 of max 3: the round forms after its last call
        assert {agent.rdzv.poll(agent.id).state for agent in agents} == {PollState.ASSIGNED}
        a.master.report_success()
        for _ in range(8):  # 40 s: past the master's and the rendezvous' heartbeat timeouts
            clock.advance(5.0)
            b.master.heartbeat(step=1)
            assert b.rdzv.num_nodes_waiting(b.id) == 0
            runtime.master.tick()
        poll = b.rdzv.poll(b.id)
        assert (poll.state, poll.round, poll.world_size) == (PollState.ASSIGNED, 1, 2)
        assert runtime.master.node(b.node_id).state is NodeState.RUNNING
        b.master.report_success()
        assert runtime.master.node(b.node_id).state is NodeState.SUCCEEDED
    finally:
        for agent in agents:
            agent.close()


def test_the_same_token_guards_the_hosted_services(runtime: MasterRuntime) -> None:
    with RendezvousClient(runtime.address, generate_token(), policy=ONCE) as stranger, pytest.raises(RpcError) as info:
        stranger.join("0")
    assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
    with (
        ShardClient(runtime.address, "x" * 32, "train", "0", config=ShardClientConfig(retry=ONCE)) as bad,
        pytest.raises(RpcError) as info,
    ):
        bad.register(SPEC)
    assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert runtime.rendezvous is not None
    with runtime.rendezvous.locked() as manager:
        assert manager.waiting == ()


def test_an_import_error_report_stops_the_job_after_one_attempt(runtime: MasterRuntime) -> None:
    a, b = Agent(runtime, "a"), Agent(runtime, "b")
    try:
        reply = a.master.report_failure(FailureKind.UNKNOWN, IMPORT_ERROR, exit_code=1)
        assert reply.action is ActionKind.ABORT_JOB
        assert "user_code" in reply.outcome
        status = b.master.job_status()
        assert status.state == "failed"
        assert "ModuleNotFoundError" in status.exit_reason
        assert status.job_failures == 1
        assert [e.kind for e in b.master.list_events(limit=1000)].count("process_restart") == 0
        assert b.rdzv.status().closed  # nobody waits for a round that cannot come
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(110)
def test_rpcs_ticks_exports_and_departures_share_the_libraries_without_races(tmp_path: Path) -> None:
    """Many threads on the hosted services while the master ticks, exports every 10 ms and fails a silent node."""
    cfg = MasterConfig(
        job_name="busy",
        lifecycle=LifecycleConfig(
            nodes=NodeRange(1, 4), heartbeat_timeout_s=5.0, node_start_timeout_s=None, insufficient_nodes_window_s=600
        ),
        token=generate_token(),
        backend="external",
        heartbeat_interval_s=0.2,
        tick_interval_s=0.01,
        state_export_interval_s=0.01,
        rendezvous_last_call_s=0.0,
        state_dir=str(tmp_path / "state"),
    )
    rt = create_master(cfg, scheduler=ExternalScheduler())
    rt.start()
    errors: list[BaseException] = []
    stop = threading.Event()
    agents: list[Agent] = []
    try:
        agents = [Agent(rt, f"n{i}") for i in range(4)]
        silent = agents[3]  # registers, holds a shard, then says nothing more
        spec = attrs.evolve(SPEC, source=IndexSource(160))
        assert agents[0].shards.register(spec).created
        held = silent.shards.fetch().shards[0]
        silent.shards.report_progress(held.shard_id, 3)
        acks: Counter[int] = Counter()
        lock = threading.Lock()

        def train(agent: Agent) -> None:
            try:
                while (shard := agent.shards.next_shard(timeout_s=60)) is not None:
                    order = shard.sample_order()
                    for n in range(shard.consumed + 1, shard.size + 1):
                        agent.shards.report_progress(shard.shard_id, n)
                        with lock:
                            acks[order[n - 1]] += 1
                        agent.master.heartbeat(step=n)
                    agent.shards.report_done(shard.shard_id)
            except BaseException as exc:
                errors.append(exc)

        def rendezvous(agent: Agent) -> None:
            try:
                while not stop.is_set():
                    agent.rdzv.join(agent.id)
                    agent.rdzv.poll(agent.id)
                    agent.rdzv.num_nodes_waiting(agent.id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=train, args=(a,)) for a in agents[:3]]
        threads += [threading.Thread(target=rendezvous, args=(a,)) for a in agents[:3]]
        for t in threads:
            t.start()
        for t in threads[:3]:
            t.join(timeout=90)
        stop.set()
        for t in threads[3:]:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        # The silent node was failed by the tick and its shard re-dispatched from its acknowledged position.
        assert rt.master.node(silent.node_id).state is not NodeState.RUNNING
        assert sorted(acks) == [i for i in range(160) if i not in held.sample_order()[:3]]
        assert set(acks.values()) == {1}
        assert rt.shards is not None
        with rt.shards.locked() as registry:
            final = json.loads(registry.journal_base().text)
    finally:
        stop.set()
        for agent in agents:
            agent.close()
        rt.stop()
    journal = SqliteJournal(str(tmp_path / "state"))
    try:
        state = journal.load()
    finally:
        journal.close()
    # The journal's base and lines after it replay into exactly the state the master ended with
    # (on a clock at the moment that state was read, so the same leases have run out).
    blob = state.blobs["shards"]
    replica = ShardRegistry(ManualClock(final["time"]))
    lines = [LoggedCall(line.seq, line.data) for line in state.changes.get("shards", ())]
    replica.load_journal(LoggedCall(blob.version, blob.data), lines, restart_leases=False)
    assert json.loads(replica.journal_base().text)["datasets"] == final["datasets"]
