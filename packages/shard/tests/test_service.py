"""ShardService over real gRPC on 127.0.0.1: round trips, error codes, retries, auth, prefetch."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from dlrover.common import (
    GrpcServer,
    ManualClock,
    RetryPolicy,
    RpcError,
    ServerConfig,
    SystemClock,
    create_channel,
    generate_token,
)
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardRegistry, ShardStateError
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.service import ShardServicer, add_shard_service
from dlrover.shard.shard import Shard
from dlrover.shard.v1 import shard_pb2 as pb
from dlrover.shard.v1 import shard_pb2_grpc

pytestmark = pytest.mark.integration

FAST = ShardClientConfig(retry=RetryPolicy(call_timeout_s=10, total_timeout_s=30, initial_backoff_s=0.01))


def _spec(n: int = 20, **kw: Any) -> DatasetSpec:
    return DatasetSpec(name="ds", source=IndexSource(n), batch_size=2, batches_per_shard=2, **kw)


def _client(server: GrpcServer, token: str, worker: str = "w", **kw: Any) -> ShardClient:
    return ShardClient(server.address, token, "ds", worker, config=kw.pop("config", FAST), **kw)


def test_a_worker_reads_the_whole_dataset_through_the_service(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with _client(server, token) as c:
        assert c.register(_spec()).created
        assert not c.register(_spec()).created
        seen: list[int] = []
        while (shard := c.next_shard(timeout_s=30)) is not None:
            seen.extend(shard.remaining_samples())
            c.report_progress(shard.shard_id, 1)
            c.report_done(shard.shard_id)
        assert sorted(seen) == list(range(20))
        st = c.status()
        assert (st.done, st.todo, st.doing, st.finished) == (5, 0, 0, True)
        assert st.workers[0].worker == "w"
        assert st.workers[0].samples == 20


def _code(fn: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(RpcError) as info:
        fn()
    return info.value.code, info.value.details


def test_bad_requests_get_clear_status_codes_and_change_nothing(shard_server: Any, token: str) -> None:
    server, servicer = shard_server

    def state() -> str:
        # Written afresh, leases included: the service reuses a position read while its version
        # is unchanged, so comparing reads would not see a change that forgot to count itself.
        with servicer.locked() as registry:
            return str(registry.checkpoint("ds", include_leases=True))

    with _client(server, token, config=ShardClientConfig(prefetch_shards=0)) as c:
        c.register(_spec(delivery=DeliveryMode.EXACTLY_ONCE))
        shard = c.fetch(1).shards[0]
        before = c.checkpoint()
        before_state = state()
        with ShardClient(server.address, token, "nope", "w", config=FAST) as other:
            code, msg = _code(other.fetch)
            assert code is grpc.StatusCode.NOT_FOUND
            assert "'nope' is not registered" in msg
        assert _code(lambda: c.fetch(0))[0] is grpc.StatusCode.INVALID_ARGUMENT
        code, msg = _code(lambda: c.report_progress(shard.shard_id, 99))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "99" in msg
        code, msg = _code(lambda: c.report_done(12345))
        assert code is grpc.StatusCode.NOT_FOUND
        assert "12345" in msg
        with ShardClient(server.address, token, "ds", "intruder", config=FAST) as intruder:
            code, msg = _code(lambda: intruder.report_done(shard.shard_id))
            assert code is grpc.StatusCode.FAILED_PRECONDITION
            assert "another worker" in msg
        with create_channel(server.address, token) as channel:  # the client validates; send raw bad sizes
            stub = shard_pb2_grpc.ShardServiceStub(channel)
            bad = pb.DatasetSpec(name="ds2", batch_size=0, index=pb.IndexSource(num_samples=-3))
            with pytest.raises(grpc.RpcError) as info:
                stub.RegisterDataset(pb.RegisterDatasetRequest(spec=bad), timeout=10)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "num_samples must be a positive integer, got -3" in str(info.value.details())
        code, _ = _code(lambda: c.register(_spec(n=21)))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        doc = json.loads(before)
        code, msg = _code(lambda: c.restore(json.dumps({**doc, "version": 99})))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "version 99" in msg
        assert c.checkpoint() == before
        assert state() == before_state
        c.report_done(shard.shard_id)
        after = state()
        code, msg = _code(lambda: c.report_done(shard.shard_id))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "already done" in msg
        assert state() == after


def test_calls_without_the_job_token_are_refused(shard_server: Any) -> None:
    server, _ = shard_server
    with ShardClient(server.address, generate_token(), "ds", "w", config=FAST) as c:
        code, _ = _code(lambda: c.register(_spec()))
        assert code is grpc.StatusCode.UNAUTHENTICATED
        assert _code(c.status)[0] is grpc.StatusCode.UNAUTHENTICATED


class _LoseFirstReply(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Runs each RPC, then loses the reply of the first call of every method (UNAVAILABLE).

    This is the case retries must survive: the server acted, the client never heard.
    """

    def __init__(self) -> None:
        self.lost: set[str] = set()
        self._lock = threading.Lock()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = details.method
        inner = handler.unary_unary

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            reply = inner(request, context)
            with self._lock:
                first = method not in self.lost
                self.lost.add(method)
            if first:
                context.abort(grpc.StatusCode.UNAVAILABLE, "reply lost (injected)")
            return reply

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def test_retries_after_a_lost_reply_do_not_act_twice(token: str) -> None:
    lose = _LoseFirstReply()
    server = GrpcServer(ServerConfig(), token, interceptors=[lose])
    add_shard_service(server, ShardRegistry(SystemClock()))
    with server, _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0)) as c:
        assert c.register(_spec()).created is False  # the first reply (created=True) was lost
        first = c.fetch(2)
        assert len(first.shards) == 2
        st = c.status()
        assert st.doing == 2  # the lost first fetch leased the same two shards, not two more
        c.report_done(first.shards[0].shard_id)  # lost reply, retried, answered from the reply cache
        c.report_failure(first.shards[1].shard_id, "oops")
        st = c.status()
        assert (st.done, st.doing, st.todo, st.failed) == (1, 0, 4, 0)
        assert {"/dlrover.shard.v1.ShardService/ReportDone", "/dlrover.shard.v1.ShardService/FetchShards"} <= lose.lost


def test_prefetch_keeps_a_shard_leased_ahead_and_returns_it_on_close(shard_server: Any, token: str) -> None:
    server, servicer = shard_server
    cfg = ShardClientConfig(retry=FAST.retry, prefetch_shards=2)
    with _client(server, token, config=cfg) as c:
        c.register(_spec())
        shard = c.next_shard(timeout_s=30)
        assert shard is not None
        with servicer.locked() as reg:
            assert reg.manager("ds").status().doing >= 1
    with servicer.locked() as reg:
        status = reg.manager("ds").status()
    assert status.doing == 1  # only the shard handed to the caller; buffered ones were returned
    assert status.todo == 4


def test_servicer_locked_gives_the_registry(shard_server: Any) -> None:
    _, servicer = shard_server
    assert isinstance(servicer, ShardServicer)
    with servicer.locked() as reg:
        assert reg.datasets() == []


def test_stream_poller_feeds_a_served_stream_dataset(shard_server: Any, token: str) -> None:
    from dlrover.shard import InMemoryStreamSource, StreamPartitions, StreamPoller, read_shard

    server, servicer = shard_server
    source = InMemoryStreamSource(["p0"])
    spec = DatasetSpec(name="ds", source=StreamPartitions(["p0"]), batch_size=2, num_epochs=None)
    poller = StreamPoller(source, servicer.locked, "ds", interval_s=0.05)
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0)) as c:
        c.register(spec)
        for i in range(5):
            source.append("p0", b"%d" % i)
        poller.start()
        try:
            got: list[bytes] = []
            while len(got) < 5:
                shard = c.next_shard(timeout_s=30)
                assert shard is not None
                got += [r.payload for r in read_shard(source, shard)]
                c.report_done(shard.shard_id)
        finally:
            poller.stop()
        assert got == [b"0", b"1", b"2", b"3", b"4"]
        assert poller.last_error is None


def test_shard_indices_feeds_every_index_and_marks_shards_done(shard_server: Any, token: str) -> None:
    from dlrover.shard.tf_data import make_tf_dataset, shard_indices

    server, _ = shard_server
    with _client(server, token) as c:
        c.register(_spec())
        assert sorted(shard_indices(lambda: _client(server, token, worker="tf"))) == list(range(20))
        assert c.status().finished
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            make_tf_dataset(lambda: _client(server, token))


def test_a_finished_client_fetches_again_after_a_restore(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with _client(server, token) as c:
        c.register(_spec(n=8))
        doc = c.checkpoint()
        while (shard := c.next_shard(timeout_s=30)) is not None:
            c.report_done(shard.shard_id)
        assert c.next_shard(timeout_s=30) is None
        c.restore(doc)
        again = c.next_shard(timeout_s=30)
        assert again is not None


def test_shards_a_prefetch_leased_before_a_restore_are_never_handed_out(shard_server: Any, token: str) -> None:
    # The prefetch thread's fetch is served, then the trainer restores a data position (dropping every
    # lease) before that fetch's answer lands: its shards must not reach the training loop.
    server, _ = shard_server
    with _client(server, token) as c:
        c.register(_spec(n=8, delivery=DeliveryMode.EXACTLY_ONCE))
        doc = c.checkpoint()
        fetch, served, answer = c.fetch, threading.Event(), threading.Event()
        stale: list[int] = []

        def held_back(count: int | None = None) -> Any:
            res = fetch(count)
            if not stale:
                stale.extend(s.shard_id for s in res.shards)
                served.set()
                answer.wait(30)
            return res

        c.fetch = held_back  # type: ignore[method-assign]
        got: list[Any] = []
        taker = threading.Thread(target=lambda: got.append(c.next_shard(timeout_s=30)))
        taker.start()
        assert served.wait(30), "the prefetch thread fetched"
        c.restore(doc)  # every lease dropped, the shards queued again
        answer.set()
        taker.join(30)
        assert got
        assert got[0] is not None
        assert stale, "the held-back fetch leased shards"
        c.report_done(got[0].shard_id)  # leased to this worker under the restored position


@pytest.mark.timeout(60)
def test_after_a_restore_a_prefetching_client_refills_at_once_not_at_its_next_renewal(
    shard_server: Any, token: str
) -> None:
    # The prefetch thread sleeps until a shard leaves its full buffer or the renewal is due; the restore
    # empties the buffer and must wake it. (With the renewal an hour away, a missed wake-up times out.)
    server, _ = shard_server
    config = ShardClientConfig(retry=FAST.retry, prefetch_shards=1, renew_interval_s=3600)
    with _client(server, token, config=config) as c:
        c.register(_spec(n=8, delivery=DeliveryMode.EXACTLY_ONCE))
        doc = c.checkpoint()
        assert c.next_shard(timeout_s=30) is not None
        with c._cond:  # the thread has refilled its buffer and sleeps
            assert c._cond.wait_for(lambda: len(c._buffer) == 1, 30)
        c.restore(doc)
        assert c.next_shard(timeout_s=30) is not None


def test_client_config_rejects_bad_values() -> None:
    from dlrover.common import ConfigError

    with pytest.raises(ConfigError, match="poll_interval_s"):
        ShardClientConfig(poll_interval_s=0)
    with pytest.raises(ConfigError, match="prefetch_shards"):
        ShardClientConfig(prefetch_shards=-1)


def test_concurrent_workers_never_get_the_same_shard(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    n = 400  # 100 shards of 4
    with _client(server, token, worker="setup") as c:
        c.register(_spec(n=n))
    got: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            with _client(server, token, worker=name) as client:
                mine = got.setdefault(name, [])
                while (shard := client.next_shard(timeout_s=60)) is not None:
                    mine.append(shard.shard_id)
                    client.report_done(shard.shard_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not errors
    assert not any(t.is_alive() for t in threads)
    every = [sid for ids in got.values() for sid in ids]
    assert sorted(every) == list(range(100))


def test_a_worker_trains_on_while_its_master_restarts_and_nothing_is_lost_or_repeated(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master dies holding the worker's leases and comes back on the same port from its journal."""
    # As under dlrover-run: the agent tells its workers how long to wait for a lost master.
    monkeypatch.setenv("DLROVER_MASTER_LOST_TIMEOUT_S", "120")
    config = ShardClientConfig(prefetch_shards=0, fetch_count=2)
    assert config.retry.total_timeout_s == 120
    assert config.retry.max_attempts is None
    first = GrpcServer(ServerConfig(), token)
    first_servicer = add_shard_service(first, ShardRegistry(SystemClock()))
    port = first.start()
    trained: list[int] = []
    second: GrpcServer | None = None
    try:
        with ShardClient(first.address, token, "ds", "w", config=config) as c:
            c.register(_spec(delivery=DeliveryMode.EXACTLY_ONCE))
            a = c.next_shard(timeout_s=30)  # leases two: one to use now, one kept for later
            assert a is not None
            trained += a.remaining_samples()
            assert not c.report_done(a.shard_id).pending
            b = c.next_shard(timeout_s=30)  # from the client's own buffer
            assert b is not None
            with first_servicer.locked() as reg:
                journal = reg.checkpoint("ds", include_leases=True)  # what the master journaled last
            first.stop(0)

            trained += b.remaining_samples()
            queued = c.report_done(b.shard_id)
            assert queued.pending, queued.reason
            assert c.queued_reports == 1

            restored = ShardRegistry(SystemClock())
            assert restored.restore(journal).returned_to_queue == 0
            second = GrpcServer(ServerConfig(port=port), token)
            add_shard_service(second, restored)
            second.start()
            assert c.flush_reports(timeout_s=120)
            assert c.queued_reports == 0
            while (shard := c.next_shard(timeout_s=30)) is not None:
                trained += shard.remaining_samples()
                c.report_done(shard.shard_id)
            status = c.status()
    finally:
        first.stop(0)
        if second is not None:
            second.stop(0)
    assert sorted(trained) == list(range(20)), "every sample trained exactly once across the restart"
    assert (status.done, status.doing, status.todo, status.failed) == (5, 0, 0, 0)


@contextlib.contextmanager
def _a_report_queued_for_a_master_that_lost_its_journal(token: str) -> Iterator[tuple[ShardClient, int]]:
    """A client whose report of a shard's end is queued while its master is away; the master comes
    back without its journal (it knows the dataset, not the lease), so it refuses the report once
    it is delivered. Yields the client and the shard's id."""
    first = GrpcServer(ServerConfig(), token)
    add_shard_service(first, ShardRegistry(SystemClock()))
    port = first.start()
    second: GrpcServer | None = None
    try:
        with ShardClient(first.address, token, "ds", "w", config=ShardClientConfig(prefetch_shards=0)) as c:
            c.register(_spec(delivery=DeliveryMode.EXACTLY_ONCE))
            shard = c.fetch(1).shards[0]
            first.stop(0)
            assert c.report_done(shard.shard_id).pending
            fresh = ShardRegistry(SystemClock())
            fresh.register(_spec(delivery=DeliveryMode.EXACTLY_ONCE))
            second = GrpcServer(ServerConfig(port=port), token)
            add_shard_service(second, fresh)
            second.start()
            yield c, shard.shard_id
    finally:
        first.stop(0)
        if second is not None:
            second.stop(0)


def test_a_report_the_restarted_master_refuses_is_raised_by_the_next_call(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLROVER_MASTER_LOST_TIMEOUT_S", "120")
    with _a_report_queued_for_a_master_that_lost_its_journal(token) as (c, shard_id):
        with pytest.raises(RpcError) as info:
            c.flush_reports(timeout_s=120)
        assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert f"shard {shard_id}" in info.value.details
        assert c.queued_reports == 0
        assert c.status().done == 0  # raised once; the client goes on


_EXITS_WITHOUT_CLOSE = """
import sys
from dlrover.shard import ShardClient, ShardClientConfig
client = ShardClient(sys.argv[1], sys.argv[2], "ds", "w", config=ShardClientConfig(prefetch_shards=0))
shard = client.fetch(1).shards[0]
print("fetched", shard.shard_id, flush=True)
sys.stdin.readline()  # the master is down now
print("queued" if client.report_done(shard.shard_id).pending else "sent", flush=True)
"""


def test_a_worker_that_exits_without_closing_delivers_its_queued_reports_first(tmp_path: Any, token: str) -> None:
    import os
    import subprocess
    import sys

    first = GrpcServer(ServerConfig(), token)
    first_servicer = add_shard_service(first, ShardRegistry(SystemClock()))
    port = first.start()
    with first_servicer.locked() as reg:
        reg.register(_spec(delivery=DeliveryMode.EXACTLY_ONCE))
    script = tmp_path / "worker.py"
    script.write_text(_EXITS_WITHOUT_CLOSE)
    env = {**os.environ, "DLROVER_MASTER_LOST_TIMEOUT_S": "120"}
    proc = subprocess.Popen(
        [sys.executable, str(script), first.address, token],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    second: GrpcServer | None = None
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        shard_id = int(proc.stdout.readline().split()[1])
        with first_servicer.locked() as reg:
            journal = reg.checkpoint("ds", include_leases=True)
        first.stop(0)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "queued"
        restored = ShardRegistry(SystemClock())
        restored.restore(journal)
        second = GrpcServer(ServerConfig(port=port), token)
        add_shard_service(second, restored)
        second.start()
        assert proc.wait(timeout=120) == 0
        assert restored.manager("ds").status().done == 1
        with pytest.raises(ShardStateError, match="already done"):
            restored.manager("ds").report_done("w", shard_id)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        first.stop(0)
        if second is not None:
            second.stop(0)


def test_a_client_nobody_closed_is_collected_with_its_channel(token: str) -> None:
    import gc
    import weakref

    client = ShardClient("127.0.0.1:1", token, "ds", "w", config=FAST)
    alive = weakref.ref(client)
    del client
    gc.collect()
    assert alive() is None, "the exit-time delivery of queued reports must not keep the client alive"


def test_a_fetch_that_asks_for_the_position_reads_it_before_leasing(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0)) as c:
        c.register(_spec(n=16, delivery=DeliveryMode.EXACTLY_ONCE))
        shard = c.next_shard(timeout_s=30)
        assert shard is not None
        c.report_done(shard.shard_id)  # the position changed: the next read is written afresh
        document = c.checkpoint(lease_next=True)
        assert c.status().doing == 1, "the next shard is leased by the same call"
        assert json.loads(document)["state"]["in_flight"] == [], "the lease is granted after the read"
        assert document == c.checkpoint()
        c.checkpoint(lease_next=True)
        assert c.status().doing == 1
        leased = c.next_shard(timeout_s=30)
        assert leased is not None
        assert leased.shard_id != shard.shard_id
        assert c.status().doing == 1, "next_shard took the buffered shard without a fetch"
        channel = create_channel(server.address, token)
        stub = shard_pb2_grpc.ShardServiceStub(channel)  # type: ignore[no-untyped-call]
        plain = stub.FetchShards(pb.FetchShardsRequest(dataset="ds", worker="other", count=1))
        channel.close()
        assert len(plain.shards) == 1
        assert plain.checkpoint == "", "the position is read only when asked for"


def test_a_lease_asked_ahead_in_the_background_is_the_next_shard_handed_out(shard_server: Any, token: str) -> None:
    server, servicer = shard_server
    on_demand = ShardClientConfig(retry=FAST.retry, prefetch_shards=0)
    with _client(server, token, config=on_demand) as c, _client(server, token, "peer", config=on_demand) as peer:
        c.register(_spec(n=16, delivery=DeliveryMode.EXACTLY_ONCE))
        first = c.next_shard(timeout_s=30)
        assert first is not None
        c.report_done(first.shard_id)
        assert c.lease_ahead()
        assert not c.lease_ahead(), "one fetch out (or its shard buffered) at a time"
        ahead = c.next_shard(timeout_s=30)
        assert ahead is not None
        with servicer.locked() as reg:
            assert reg.manager("ds").status().doing == 1, "next_shard took the shard leased ahead, no fetch of its own"
        # Leased in the order asked: the peer's fetch after it gets the next shard, not this one.
        mine = peer.next_shard(timeout_s=30)
        assert mine is not None
        assert len({first.shard_id, ahead.shard_id, mine.shard_id}) == 3
        assert c.report_done(ahead.shard_id).changed, "this worker holds the lease of the shard taken"


def test_a_lease_asked_ahead_that_failed_is_raised_once_by_the_next_shard_asked_for(
    shard_server: Any, token: str
) -> None:
    server, _ = shard_server
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0)) as c:
        assert c.lease_ahead()  # the dataset is not registered yet: the service refuses the fetch
        with pytest.raises(RpcError) as info:
            c.next_shard(timeout_s=30)
        assert info.value.code is grpc.StatusCode.NOT_FOUND
        c.register(_spec(n=8))
        assert c.next_shard(timeout_s=30) is not None, "the failure was the background fetch's, raised once"


def test_a_lease_asked_ahead_goes_back_on_close_and_is_dropped_by_a_restore(shard_server: Any, token: str) -> None:
    server, servicer = shard_server
    on_demand = ShardClientConfig(retry=FAST.retry, prefetch_shards=0)
    with _client(server, token, config=on_demand) as c:
        c.register(_spec(n=16, delivery=DeliveryMode.EXACTLY_ONCE))
        document = c.checkpoint()
        assert c.lease_ahead()
        c.restore(document)  # waits for the fetch: its lease is among those the restore drops
        assert c.buffered == 0
        with servicer.locked() as reg:
            assert reg.manager("ds").status().doing == 0
        assert c.lease_ahead()
        assert c.buffered == 1, "buffered waits for the fetch out"
    with servicer.locked() as reg:
        status = reg.manager("ds").status()
    assert (status.doing, status.todo) == (0, 4), "the shard leased ahead and never taken went back on close"
    assert not [t for t in threading.enumerate() if t.name.startswith("shard-lease-ahead-")], "its thread ended"


def test_a_lease_asked_ahead_keeps_its_lease_until_taken_through_a_pause_longer_than_the_lease(token: str) -> None:
    # A save or an evaluation between the round that leased the next shard ahead and the step that
    # takes it outlasts the lease: the keep-alive renews it, so it is not lost (nor an attempt spent).
    from dlrover.common import GrpcServer, ManualClock, ServerConfig
    from dlrover.shard import ShardRegistry

    clock = ManualClock()
    server = GrpcServer(ServerConfig(), token)
    add_shard_service(server, ShardRegistry(clock))
    server.start()
    config = ShardClientConfig(retry=FAST.retry, prefetch_shards=0, renew_interval_s=0.2)
    try:
        with ShardClient(server.address, token, "ds", "w", config=config, clock=clock) as c:
            c.register(_spec(n=8, delivery=DeliveryMode.EXACTLY_ONCE, lease_timeout_s=60.0))
            first = c.next_shard(timeout_s=30)  # (starts the keep-alive)
            assert first is not None
            c.report_done(first.shard_id)
            assert c.lease_ahead()
            c.settle_lease_ahead()
            renew, renewed = c._renew_lease, threading.Event()

            def counted(s: Any) -> bool:
                held = renew(s)
                renewed.set()
                return held

            c._renew_lease = counted  # type: ignore[method-assign]
            for _ in range(3):  # 135 s before the shard is taken, against a 60 s lease
                renewed.clear()
                clock.advance(45.0)
                assert renewed.wait(30), "the keep-alive renewed the lease of the shard leased ahead"
            ahead = c.next_shard(timeout_s=30)
            assert ahead is not None
            assert ahead.attempt == first.attempt, "its first lease, not a second attempt after that ran out"
            assert c.report_done(ahead.shard_id).changed
    finally:
        server.stop(0)


def test_a_failed_lease_ahead_is_kept_until_raised(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0)) as c:
        assert c.lease_ahead()  # refused: the dataset is not registered yet
        c.settle_lease_ahead()
        assert not c.lease_ahead(), "no second fetch while the first one's failure is still to be raised"
        with pytest.raises(RpcError):
            c.next_shard(timeout_s=30)
        c.register(_spec(n=8))
        assert c.lease_ahead(), "the failure was raised: leasing ahead goes on"
        c.settle_lease_ahead()
        assert c.next_shard(timeout_s=30) is not None


def test_a_lease_ahead_leaves_a_refused_reports_failure_to_the_reports_caller(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLROVER_MASTER_LOST_TIMEOUT_S", "120")
    with _a_report_queued_for_a_master_that_lost_its_journal(token) as (c, shard_id):
        deadline = time.monotonic() + 120
        while c.queued_reports and time.monotonic() < deadline:  # delivered, and refused
            threading.Event().wait(0.01)
        assert c.queued_reports == 0
        assert c.lease_ahead()
        c.settle_lease_ahead()
        with pytest.raises(RpcError) as info:
            c.flush_reports(timeout_s=30)
        assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION, "the background fetch took it"
        assert f"shard {shard_id}" in info.value.details
        assert c.next_shard(timeout_s=30) is not None, "the shard leased ahead"


def _keepalive_config() -> ShardClientConfig:
    return ShardClientConfig(retry=FAST.retry, prefetch_shards=0, renew_interval_s=0.2)


@contextlib.contextmanager
def _keepalive_client(token: str) -> Iterator[tuple[ShardClient, ManualClock]]:
    """An on-demand client whose keep-alive renews every 0.2 s of a clock the test advances."""
    clock = ManualClock()
    server = GrpcServer(ServerConfig(), token)
    add_shard_service(server, ShardRegistry(clock))
    server.start()
    try:
        with _client(server, token, config=_keepalive_config(), clock=clock) as c:
            yield c, clock
    finally:
        server.stop(0)


def _in_keepalive() -> bool:
    return threading.current_thread().name.startswith("shard-keepalive")


def test_a_late_not_held_answer_does_not_drop_a_newer_lease_of_the_same_shard(token: str) -> None:
    """The keep-alive asks about a shard leased ahead; a restore returns it and a lease after the
    restore gets it again as the same attempt; the master's "not held" about the first lease then
    arrives. The newer lease stays buffered and is the next shard handed out."""
    with _keepalive_client(token) as (c, clock):
        c.register(_spec(n=8, delivery=DeliveryMode.EXACTLY_ONCE))
        first = c.next_shard(timeout_s=5)
        assert first is not None
        c.report_done(first.shard_id)
        document = c.checkpoint()
        assert c.lease_ahead()
        c.settle_lease_ahead()
        asked, restored, answered, released, renewed_again = (threading.Event() for _ in range(5))
        real_renew = c._renew_lease

        def late_answer(shard: Shard) -> bool:
            if not _in_keepalive():
                return real_renew(shard)
            if asked.is_set():  # a later pass: the earlier one has finished
                renewed_again.set()
                return real_renew(shard)
            asked.set()
            assert restored.wait(30)
            held = real_renew(shard)  # after the restore: not held
            answered.set()
            assert released.wait(30)  # the same shard leased again meanwhile
            return held

        c._renew_lease = late_answer  # type: ignore[method-assign]
        clock.advance(1.0)
        assert asked.wait(30)
        c.restore(document)
        restored.set()
        assert answered.wait(30)
        assert c.lease_ahead()
        c.settle_lease_ahead()
        released.set()
        clock.advance(1.0)
        assert renewed_again.wait(30), "the keep-alive renews the newer lease at its next pass"
        ahead = c.next_shard(timeout_s=5)
        assert ahead is not None
        assert ahead.shard_id == first.shard_id + 1, "the shard leased again, not the one after it"
        assert c.report_done(ahead.shard_id).changed


def test_a_renewal_the_master_cannot_answer_keeps_the_shard_leased_ahead(token: str) -> None:
    with _keepalive_client(token) as (c, clock):
        c.register(_spec(n=8))
        first = c.next_shard(timeout_s=5)  # handing one out starts the keep-alive
        assert first is not None
        c.report_done(first.shard_id)
        assert c.lease_ahead()
        c.settle_lease_ahead()
        refused, renewed = threading.Event(), threading.Event()
        real_renew = c._renew_lease

        def overloaded_once(shard: Shard) -> bool:
            if not _in_keepalive():
                return real_renew(shard)
            if not refused.is_set():
                refused.set()
                raise RpcError("ReportProgress", grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded (injected)", 1)
            renewed.set()
            return real_renew(shard)

        c._renew_lease = overloaded_once  # type: ignore[method-assign]
        clock.advance(1.0)
        assert refused.wait(30)
        clock.advance(1.0)
        assert renewed.wait(30), "asked again at the next pass"
        ahead = c.next_shard(timeout_s=5)
        assert ahead is not None
        assert (ahead.shard_id, ahead.attempt) == (first.shard_id + 1, 1), "its first lease, kept"


def test_a_failed_lease_ahead_is_said_not_raised_once_a_later_lease_brought_a_shard(
    shard_server: Any, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = shard_server
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0)) as c:
        assert c.lease_ahead()  # refused: the dataset is not registered yet
        c.settle_lease_ahead()
        c.register(_spec(n=8))
        c.checkpoint(lease_next=True)  # a read that leases the next shard
        with caplog.at_level(logging.WARNING, logger="dlrover.shard.client"):
            shard = c.next_shard(timeout_s=30)
        assert shard is not None
        assert "a later one brought a shard" in caplog.text


def test_a_lease_ahead_failure_nobody_asked_for_is_said_at_close(
    shard_server: Any, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = shard_server
    c = _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0))
    assert c.lease_ahead()  # refused: the dataset is not registered yet
    c.settle_lease_ahead()
    with caplog.at_level(logging.WARNING, logger="dlrover.shard.client"):
        c.close()
    assert "failed before the client closed" in caplog.text


def test_next_shard_waits_for_a_lease_ahead_no_longer_than_its_timeout(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=0)) as c:
        c.register(_spec(n=8))
        held_up, go = threading.Event(), threading.Event()
        real_fetch = c._fetch_shards

        def slow_fetch(count: int) -> Any:
            held_up.set()
            assert go.wait(30)
            return real_fetch(count)

        c._fetch_shards = slow_fetch  # type: ignore[method-assign]
        assert c.lease_ahead()
        assert held_up.wait(30)
        with pytest.raises(TimeoutError, match="a lease asked for ahead is out"):
            c.next_shard(timeout_s=0.0)
        go.set()
        shard = c.next_shard(timeout_s=30)
        assert shard is not None
        assert shard.shard_id == 0


def test_a_lease_asked_ahead_is_refused_by_a_prefetching_client(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=1)) as c:
        c.register(_spec(n=8))
        assert not c.lease_ahead(), "its prefetch thread leases ahead already"


def test_a_prefetching_client_reads_the_position_alone(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with _client(server, token, config=ShardClientConfig(retry=FAST.retry, prefetch_shards=1)) as c:
        c.register(_spec(n=8))
        assert c.next_shard(timeout_s=30) is not None
        while c.status().doing < 2:  # the prefetch thread leased one ahead
            threading.Event().wait(0.01)
        c.checkpoint(lease_next=True)
        assert c.status().doing == 2, "the prefetch thread leases ahead; the read leased nothing more"


def test_a_shard_leased_ahead_is_renewed_before_use_or_fetched_again_once_its_lease_ended(token: str) -> None:
    """A save or an evaluation may come between the position read that leased the next shard and the step
    that uses it: an on-demand client has no thread renewing buffered shards, so it renews one that waited
    past `renew_interval_s` when it is taken, and leases another when its lease already ended."""
    clock = ManualClock()
    server = GrpcServer(ServerConfig(), token)
    add_shard_service(server, ShardRegistry(clock))
    cfg = ShardClientConfig(retry=FAST.retry, prefetch_shards=0, renew_interval_s=10.0)
    with server, _client(server, token, config=cfg, clock=clock) as c:
        c.register(_spec(n=16, delivery=DeliveryMode.EXACTLY_ONCE, lease_timeout_s=30.0))
        first = c.next_shard(timeout_s=1)
        assert first is not None
        c.report_done(first.shard_id)
        c.checkpoint(lease_next=True)
        clock.advance(20.0)  # past the renew interval, within the lease
        ahead = c.next_shard(timeout_s=1)
        assert ahead is not None
        clock.advance(20.0)  # 40 s after the lease: it holds only because taking it renewed it
        assert c.report_done(ahead.shard_id).changed
        c.checkpoint(lease_next=True)
        clock.advance(40.0)  # the lease ended before the shard was taken
        again = c.next_shard(timeout_s=1)
        assert again is not None
        assert c.report_done(again.shard_id).changed, "a shard whose lease ended is leased again, not trained blind"
        assert c.status().doing == 0


@pytest.mark.parametrize("prefetch", [1, 0])
def test_a_shard_in_use_keeps_its_lease_through_a_pause_longer_than_the_lease(token: str, prefetch: int) -> None:
    # An evaluation between two commits outlasts the lease: without a renewal the shard would go back to
    # the queue, another worker would train its rest too, and this worker's next commit would be refused.
    from dlrover.common import GrpcServer, ManualClock, ServerConfig
    from dlrover.shard import ShardRegistry

    clock = ManualClock()
    registry = ShardRegistry(clock)
    server = GrpcServer(ServerConfig(), token)
    add_shard_service(server, registry)
    server.start()
    config = ShardClientConfig(retry=FAST.retry, prefetch_shards=prefetch, renew_interval_s=0.2)
    try:
        with ShardClient(server.address, token, "ds", "w", config=config, clock=clock) as c:
            c.register(_spec(n=8, delivery=DeliveryMode.EXACTLY_ONCE, lease_timeout_s=60.0))
            shard = c.next_shard(timeout_s=30)
            assert shard is not None
            c.report_progress(shard.shard_id, 2)
            renew, renewed = c._renew_lease, threading.Event()

            def counted(s: Any) -> bool:
                held = renew(s)
                if s.shard_id == shard.shard_id:
                    renewed.set()
                return held

            c._renew_lease = counted  # type: ignore[method-assign]
            for _ in range(3):  # 135 s without a report of its own, against a 60 s lease
                renewed.clear()
                clock.advance(45.0)
                assert renewed.wait(30), "the keep-alive renewed the idle shard's lease"
            with ShardClient(server.address, token, "ds", "v", config=FAST) as other:
                taken = [s.shard_id for s in other.fetch(4).shards]
                assert shard.shard_id not in taken, "the shard in use stayed leased"
            assert c.report_progress(shard.shard_id, 4).changed
            c.report_done(shard.shard_id)
    finally:
        server.stop(0)


def test_a_shard_in_use_is_kept_alive_no_longer_than_keep_alive_s(token: str) -> None:
    # A trainer stuck (or one that abandoned its pass) holds a shard: past keep_alive_s the lease runs out
    # and the rest goes back to the queue.
    from dlrover.common import GrpcServer, ManualClock, ServerConfig
    from dlrover.shard import ShardRegistry

    clock = ManualClock()
    registry = ShardRegistry(clock)
    server = GrpcServer(ServerConfig(), token)
    add_shard_service(server, registry)
    server.start()
    config = ShardClientConfig(retry=FAST.retry, prefetch_shards=0, renew_interval_s=0.2, keep_alive_s=100.0)
    try:
        with ShardClient(server.address, token, "ds", "w", config=config, clock=clock) as c:
            c.register(_spec(n=4, delivery=DeliveryMode.EXACTLY_ONCE, lease_timeout_s=60.0))
            shard = c.next_shard(timeout_s=30)
            assert shard is not None
            renew, renewed = c._renew_lease, threading.Event()

            def counted(s: Any) -> bool:
                renewed.set()
                return bool(renew(s))

            c._renew_lease = counted  # type: ignore[method-assign]
            clock.advance(50.0)
            assert renewed.wait(30), "renewed within keep_alive_s"
            renewed.clear()
            clock.advance(60.0)  # 110 s without a report: past keep_alive_s, it is let go
            deadline = threading.Event()
            while c._in_use and not deadline.wait(0.05):
                pass
            assert not c._in_use
            assert not renewed.is_set()
            clock.advance(60.0)  # the last renewal (at 50 s) ran out
            with ShardClient(server.address, token, "ds", "v", config=FAST) as other:
                assert [s.shard_id for s in other.fetch(4).shards] == [shard.shard_id]
    finally:
        server.stop(0)
