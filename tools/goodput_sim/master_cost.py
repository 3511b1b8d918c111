"""The master's own cost at scale: how much CPU one call of each kind takes with `nodes` nodes,
the real code on a virtual clock with the real SQLite journal, beside a no-op authenticated gRPC
call measured in the same run (what any RPC costs before the master does anything).

    python tools/goodput_sim cost --nodes 10000

Every node is registered (one journaled transaction each), then measured: a heartbeat round
without a new step (what most heartbeats are), a round with one (progress), a round whose
heartbeats carry their 8 ranks' step stats (what the straggler detector judges, once an interval
over every rank), rounds whose heartbeats carry the node's samples trained to a master with
``--autoscale on`` (what every agent sends: the samples rate, and the autoscaler's measurements), a tick (the master's
timeout checks), a node failure decided and journaled (a relaunch), a warm spare's promotion
handed to every node (the failure that promotes it, then each node's heartbeat taking its restart
for the spare's round; per node), a rendezvous round of every node
(`dlrover.rendezvous.RendezvousManager`: each joins, then each polls until the round holds it), and
a shard exchange (a worker reports its shard done and leases the next: the master's hosted shard
service, journaled before the answer as under ``--state-dir``: two change lines) with one worker per
node holding a lease, one request at a time and from as many requests at once as the master's gRPC
server has threads (`dlrover.common.ServerConfig.max_workers`): those share the journal's writes;
the shard journal's base (the whole registry, every lease: what the log starts with and is compacted
into), and that base's cost spread over the exchanges whose lines make the next one due.
CPU time is this process's (`time.process_time`); the gRPC call's is wall time per round trip with
client and server in this process, so it counts both sides.
"""

from __future__ import annotations

import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from dlrover.common import ManualClock
from dlrover.common.channel import create_channel
from dlrover.common.ping import add_ping_service
from dlrover.common.server import GrpcServer, ServerConfig
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc
from dlrover.diagnosis import FailureKind, RankStepStats
from dlrover.master import MasterConfig
from dlrover.master.autoscaler import AutoscaleMode, AutoscalerConfig
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.factory import default_policy
from dlrover.master.hosting import HostedShards
from dlrover.master.journal import SqliteJournal
from dlrover.master.master import Master
from dlrover.master.scheduler.base import ObservedState
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.rendezvous import RendezvousConfig, RendezvousManager
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardRegistry

from .scenario import CAUSES

__all__ = ["MasterCost", "measure"]


@attrs.frozen
class MasterCost:
    """Seconds per call by what was measured (CPU; `grpc_noop_call` is wall per round trip)."""

    nodes: int
    per_call_s: dict[str, float]

    def table(self) -> str:
        """A Markdown table: each call's cost and its ratio to the no-op gRPC call."""
        rows = [f"| call, {self.nodes:,} nodes | per call | against a no-op gRPC call |", "|---|---|---|"]
        base = self.per_call_s["grpc_noop_call"]
        for name, seconds in self.per_call_s.items():
            rows.append(f"| {name} | {_fmt(seconds)} | {seconds / base:.2f}x |")
        return "\n".join(rows)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"


def _cpu(calls: int, run: Callable[[], None]) -> float:
    started = time.process_time()
    run()
    return (time.process_time() - started) / max(calls, 1)


def _grpc_noop(calls: int) -> float:
    token = secrets.token_hex(24)
    server = GrpcServer(ServerConfig(port=0), token)
    add_ping_service(server)
    port = server.start()
    try:
        with create_channel(f"127.0.0.1:{port}", token) as channel:
            stub = ping_pb2_grpc.PingServiceStub(channel)  # type: ignore[no-untyped-call]
            request = ping_pb2.PingRequest(payload=b"x" * 64)
            for _ in range(100):  # connect and warm up
                stub.Ping(request, timeout=10)
            started = time.perf_counter()
            for _ in range(calls):
                stub.Ping(request, timeout=10)
            return (time.perf_counter() - started) / calls
    finally:
        server.stop(0)


def _config(nodes: int, spares: int = 0) -> MasterConfig:
    lifecycle = LifecycleConfig(
        nodes=NodeRange(nodes, nodes),
        heartbeat_timeout_s=3600.0,
        node_start_timeout_s=None,
        node_pending_timeout_s=None,
        max_relaunches=10**9,
        max_job_failures=10**9,
        spare_nodes=spares,
    )
    return MasterConfig(job_name="cost", lifecycle=lifecycle, max_node_relaunches=10**9, progress_event_interval_s=0.0)


@contextmanager
def _master_on_sqlite(config: MasterConfig, scheduler: FakeScheduler, clock: ManualClock) -> Iterator[Master]:
    """A started master journaling to SQLite in a temporary directory (gone afterwards)."""
    with tempfile.TemporaryDirectory(prefix="goodput-sim-cost-") as tmp:
        journal = SqliteJournal(Path(tmp) / "journal.db")
        try:
            master = Master(config, scheduler, journal, clock, policy=default_policy(config))
            master.start()
            yield master
        finally:
            journal.close()


def _spare_promotion(nodes: int) -> float:
    """CPU per node of a spare's promotion: the failure that promotes it and every node's
    heartbeat that takes the restart for the spare's round."""
    clock = ManualClock(0.0, 1_700_000_000.0)
    config = _config(nodes, spares=1)
    scheduler = FakeScheduler()
    with _master_on_sqlite(config, scheduler, clock) as master:
        for node_id in range(nodes + 1):
            scheduler.set_state(node_id, ObservedState.RUNNING)
            master.register(node_id, f"agent-{node_id}", f"host-{node_id}")
        clock.advance(1.0)

        def promote_and_hand_over() -> None:
            master.report_failure(0, FailureKind.UNKNOWN, CAUSES["gpu"].evidence, exit_code=1)
            for node_id in range(1, nodes):
                master.heartbeat(node_id)

        cost = _cpu(nodes, promote_and_hand_over)
        if master.node(nodes).rank != 0:
            raise RuntimeError("the spare was not promoted: the measurement measured something else")
        return cost


@attrs.frozen
class _ShardJournalCost:
    exchange_s: float  # CPU per exchange, its two change lines journaled
    base_s: float  # CPU of one base: the whole registry exported and journaled
    base_locked_s: float  # ... of which under the shard lock (the document; its encoding is not)
    base_bytes: int
    line_bytes: float  # per exchange


def _shard_exchanges(nodes: int, *, requests: int, threads: int) -> _ShardJournalCost:
    """CPU per shard exchange (done, then the next lease, journaled) with `nodes` workers each
    holding a lease, `requests` of them made from `threads` threads at once; and the base the
    shard log starts with (and is compacted into once the lines outgrow it)."""
    clock = ManualClock(0.0, 1_700_000_000.0)
    config = _config(1)
    with tempfile.TemporaryDirectory(prefix="goodput-sim-cost-") as tmp:
        journal = SqliteJournal(Path(tmp) / "journal.db")
        try:
            shards = HostedShards(ShardRegistry(clock))
            master = Master(
                config, FakeScheduler(), journal, clock, policy=default_policy(config), collaborators=[shards]
            )
            shards.attach(master)
            master.start()
            spec = DatasetSpec(
                name="data", source=IndexSource(nodes * 64), batch_size=4, delivery=DeliveryMode.EXACTLY_ONCE
            )
            workers = [f"node-{i}" for i in range(nodes)]
            with shards.locked() as registry:
                registry.register(spec)
                for worker in workers:
                    registry.fetch("data", worker)
            base_started = time.process_time()
            shards.changed_by_request()  # the first write: a base holding every lease
            base_s = time.process_time() - base_started
            with shards.locked() as registry:  # what of a base holds every shard call up
                locked_started = time.process_time()
                registry.journal_base_document()  # (numbers a base never written: the next skips one)
                base_locked_s = time.process_time() - locked_started

            def exchange(part: list[str]) -> None:
                for worker in part:
                    with shards.locked() as registry:
                        [held] = registry.manager("data").leased_shards(worker)
                        registry.report_done("data", worker, held.shard_id)
                        registry.fetch("data", worker)
                    shards.changed_by_request()

            chosen = workers[:requests]
            pool = [threading.Thread(target=exchange, args=(chosen[i::threads],)) for i in range(threads)]
            started = time.process_time()
            for thread in pool:
                thread.start()
            for thread in pool:
                thread.join()
            exchange_s = (time.process_time() - started) / len(chosen)
            state = journal.load()
            lines = state.changes.get("shards", ())
            return _ShardJournalCost(
                exchange_s=exchange_s,
                base_s=base_s,
                base_locked_s=base_locked_s,
                base_bytes=len(state.blobs["shards"].data),
                line_bytes=sum(len(line.data) for line in lines) / len(chosen),
            )
        finally:
            journal.close()


def _rounds_with_step_stats(master: Master, clock: ManualClock, nodes: int, interval_s: float) -> Callable[[], None]:
    """Three heartbeat rounds, one interval apart, each heartbeat with its node's 8 ranks' step stats."""
    # Built before the clock runs: what the agents send is not the master's cost.
    sent = {
        step: [
            [RankStepStats(8 * i + r, step, 0, 1.0, 0.2, median_sync_lead_s=0.4) for r in range(8)]
            for i in range(nodes)
        ]
        for step in (4, 5, 6)
    }

    def rounds() -> None:
        for step, stats in sent.items():
            clock.advance(interval_s)
            for i in range(nodes):
                master.heartbeat(i, step=step, rank_steps=stats[i])

    return rounds


def _rounds_with_samples(nodes: int) -> float:
    """CPU per heartbeat of rounds 5 s apart, each heartbeat with its node's samples trained so far, to a
    master whose autoscaler is on (it measures them), with the master's tick after each round."""
    clock = ManualClock(0.0, 1_700_000_000.0)
    config = attrs.evolve(_config(nodes), autoscale=AutoscalerConfig(mode=AutoscaleMode.ON))
    scheduler = FakeScheduler()
    with _master_on_sqlite(config, scheduler, clock) as master:
        for node_id in range(nodes):
            scheduler.set_state(node_id, ObservedState.RUNNING)
            master.register(node_id, f"agent-{node_id}", f"host-{node_id}")
        master.tick()  # the autoscaler follows the running nodes from its tick: every beat now counts
        rounds = 6

        def beat() -> None:
            for r in range(1, rounds + 1):
                clock.advance(5.0)
                for i in range(nodes):
                    master.heartbeat(i, samples=64 * r)
                master.tick()

        return _cpu(rounds * nodes, beat)


def measure(nodes: int, *, failures: int = 20, grpc_calls: int = 2000) -> MasterCost:
    """Measure the master's calls with `nodes` nodes (see the module)."""
    clock = ManualClock(0.0, 1_700_000_000.0)
    config = _config(nodes)
    scheduler = FakeScheduler()
    out: dict[str, float] = {}
    with _master_on_sqlite(config, scheduler, clock) as master:
        for node_id in range(nodes):
            scheduler.set_state(node_id, ObservedState.RUNNING)
        master.tick()

        def register_all() -> None:
            for i in range(nodes):
                master.register(i, f"agent-{i}", f"host-{i}")

        def rounds(steps: tuple[int | None, ...]) -> Callable[[], None]:
            def beat() -> None:
                for step in steps:
                    clock.advance(5.0)
                    for i in range(nodes):
                        master.heartbeat(i, step=step)

            return beat

        def ticks() -> None:
            for _ in range(20):
                master.tick()

        out["register"] = _cpu(nodes, register_all)
        out["heartbeat"] = _cpu(3 * nodes, rounds((None, None, None)))
        out["heartbeat, new step"] = _cpu(3 * nodes, rounds((1, 2, 3)))

        stats_rounds = _rounds_with_step_stats(master, clock, nodes, config.heartbeat_interval_s)
        out["heartbeat, 8 ranks' step stats"] = _cpu(3 * nodes, stats_rounds)
        out["heartbeat, samples, autoscaler on"] = _rounds_with_samples(nodes)
        out["tick"] = _cpu(20, ticks)
        evidence = CAUSES["gpu"].evidence

        def fail() -> None:
            for i in range(failures):
                master.report_failure(i, FailureKind.UNKNOWN, evidence, exit_code=1)

        out["failure, relaunch journaled"] = _cpu(failures, fail)
    out["spare promotion, per node handed its round"] = _spare_promotion(nodes)
    manager = RendezvousManager(RendezvousConfig(min_nodes=nodes, max_nodes=nodes, last_call_s=0.0))
    names = [f"node-{i}" for i in range(nodes)]

    def rendezvous() -> None:
        for name in names:
            manager.join(name, 1.0)
        for name in names:
            manager.poll(name, 1.0)

    out["rendezvous round, every node"] = _cpu(1, rendezvous)
    requests, threads = min(nodes, 200), ServerConfig().max_workers
    alone = _shard_exchanges(nodes, requests=requests, threads=1)
    out["shard exchange, journaled, one at a time"] = alone.exchange_s
    together = _shard_exchanges(nodes, requests=requests, threads=threads)
    out[f"shard exchange, journaled, {threads} at once"] = together.exchange_s
    out["shard journal base (every lease)"] = alone.base_s
    out["shard journal base, of which under the shard lock"] = alone.base_locked_s
    # A new base is written once the lines since the last one outgrow it (`HostedShards`'s
    # compaction_ratio, 1.0): its cost spread over the exchanges whose lines filled it.
    out["shard exchange, base compaction amortized"] = alone.base_s * alone.line_bytes / alone.base_bytes
    out["grpc_noop_call"] = _grpc_noop(grpc_calls)
    return MasterCost(nodes, out)
