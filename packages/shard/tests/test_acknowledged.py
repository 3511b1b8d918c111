"""Batched acknowledgements over real gRPC, and a data position completed with the acknowledgements made
after it was read (`apply_acknowledged`): what a group sampler's restore sends."""

from __future__ import annotations

import json
from typing import Any

import attrs
import grpc
import pytest

from dlrover.common import GrpcServer, ManualClock, RetryPolicy, RpcError, ServerConfig, SystemClock
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, InvalidShardRequestError, ShardRegistry
from dlrover.shard.acknowledged import apply_acknowledged
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.progress import decode_progress, encode_progress
from dlrover.shard.service import ShardServicer
from dlrover.shard.v1 import shard_pb2 as pb
from dlrover.shard.v1 import shard_pb2_grpc

pytestmark = pytest.mark.integration

CFG = ShardClientConfig(
    retry=RetryPolicy(call_timeout_s=10, total_timeout_s=30, initial_backoff_s=0.01), prefetch_shards=0
)


def _spec(n: int = 24, epochs: int | None = 1) -> DatasetSpec:
    return DatasetSpec(
        name="ds",
        source=IndexSource(n),
        batch_size=2,
        batches_per_shard=2,
        num_epochs=epochs,
        shuffle=True,
        seed=3,
        delivery=DeliveryMode.EXACTLY_ONCE,
    )


def _done_ids(document: str) -> int:
    return int(json.loads(document)["state"]["done_total"])


@pytest.mark.timeout(60)
def test_one_call_acknowledges_a_batch_reads_the_position_after_it_and_leases_ahead(
    shard_server: Any, token: str
) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "w", config=CFG) as client:
        client.register(_spec())  # 6 shards of 4
        first = client.sync([], lease=2)
        assert first.shards_to_hand_out == 4
        assert client.buffered == 2
        a, b = client.next_shard(), client.next_shard()
        assert a is not None
        assert b is not None
        second = client.sync([(a.shard_id, 4, True), (b.shard_id, 3, False)], lease=3)
        assert _done_ids(second.document) == 1  # read after the batch, before this call's lease
        queued = {q["shard_id"]: q["consumed"] for q in json.loads(second.document)["state"]["queue"]}
        assert queued[b.shard_id] == 3
        assert second.shards_to_hand_out == 1
        assert client.buffered == 3
        with pytest.raises(RpcError) as refused:  # a is done: the whole batch is refused, nothing applied
            client.sync([(b.shard_id, 4, True), (a.shard_id, 4, True)], lease=1)
        assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert {q["shard_id"]: q["consumed"] for q in json.loads(client.checkpoint())["state"]["queue"]}[
            b.shard_id
        ] == 3
        with pytest.raises(RpcError) as bad_count:  # the count is checked before the batch is applied
            client._call(
                client._stub.FetchShards,
                pb.FetchShardsRequest(dataset="ds", worker="w", count=5000, acknowledged=[pb.Acknowledgement(
                    shard_id=b.shard_id, consumed=4, done=True)]),
            )  # fmt: skip
        assert bad_count.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert _done_ids(client.checkpoint()) == 1


class _OlderServicer(ShardServicer):
    """A service that predates batched acknowledgements: it drops them unread, as protobuf drops an unknown field."""

    def FetchShards(self, request: pb.FetchShardsRequest, context: grpc.ServicerContext) -> pb.FetchShardsResponse:
        del request.acknowledged[:]
        response = super().FetchShards(request, context)
        response.ClearField("todo")
        return response


@pytest.mark.timeout(60)
def test_against_an_older_service_the_batch_is_reported_one_by_one(token: str) -> None:
    server = GrpcServer(ServerConfig(), token)
    servicer = _OlderServicer(ShardRegistry(SystemClock()))
    server.add(shard_pb2_grpc.add_ShardServiceServicer_to_server, servicer)
    server.start()
    try:
        with ShardClient(server.address, token, "ds", "w", config=CFG) as client:
            client.register(_spec())
            client.sync([], lease=1)
            shard = client.next_shard()
            assert shard is not None
            result = client.sync([(shard.shard_id, 4, True)], lease=1)
            assert _done_ids(result.document) == 1  # reported, and the position read again after it
            assert result.shards_to_hand_out == 0  # unknown there: read as "near the end", never as plenty
    finally:
        server.stop(0)


def _live(n: int = 24) -> ShardRegistry:
    registry = ShardRegistry(SystemClock())
    registry.register(_spec(n))
    return registry


def test_a_position_read_before_acknowledgements_and_leases_completes_to_the_position_after_them() -> None:
    registry = _live()
    a = registry.fetch("ds", "w0", 2).shards
    early = registry.checkpoint("ds")  # a, leased; the rest not handed out yet
    b = registry.fetch("ds", "w1", 2).shards  # leased after the read: not handed out in `early`
    acks = [(a[0].shard_id, 4, True), (b[1].shard_id, 2, False), (b[0].shard_id, 4, True)]
    for worker, batch in (("w0", acks[:1]), ("w1", acks[1:])):
        registry.acknowledge("ds", worker, batch)
    completed = apply_acknowledged(early, acks)
    _, state = decode_progress(completed)
    now = json.loads(registry.checkpoint("ds"))["state"]
    assert state["done_total"] == now["done_total"] == 2
    assert state["epochs"] == now["epochs"]  # the same shards done
    waiting = {q["shard_id"]: q["consumed"] for q in state["queue"]}
    # a[1] was leased at the read; b[1] is at 2; nothing else was handed out
    assert waiting == {a[1].shard_id: 0, b[1].shard_id: 2}
    assert (state["epoch"], state["cursor"]) == (now["epoch"], now["cursor"])
    # Applying what the position already holds changes nothing.
    assert apply_acknowledged(completed, acks) == completed


@pytest.mark.parametrize(
    ("acks", "match"),
    [
        ([(999, 1, False)], "has no shard 999"),
        ([(0, 1, False), (0, 2, False)], "acknowledged twice"),
        ([(0, 99, False)], "consumed must be in"),
        ([(0, 1)], "must be \\(shard_id, consumed, done\\)"),
        ([("0", 1, False)], "must be an integer"),
    ],
)
def test_bad_acknowledgements_are_refused_by_name(acks: list[Any], match: str) -> None:
    document = _live().checkpoint("ds")
    with pytest.raises(InvalidShardRequestError, match=match):
        apply_acknowledged(document, acks)


def test_a_shard_the_service_gave_up_on_stays_failed_and_the_position_still_restores() -> None:
    """Its holder trained part of it and acknowledged that, and its lease ended for the last time before
    the position was read: the saved state must still restore, with the shard among the failed."""
    clock = ManualClock()
    registry = ShardRegistry(clock)
    registry.register(attrs.evolve(_spec(), max_attempts=1, lease_timeout_s=10.0))
    (lost,) = registry.fetch("ds", "w0", 1).shards
    clock.advance(11)
    registry.manager("ds").expire_leases()
    document = registry.checkpoint("ds")
    completed = apply_acknowledged(document, [(lost.shard_id, 2, False)])
    _, state = decode_progress(completed)
    assert [f["shard_id"] for f in state["failed"]] == [lost.shard_id]
    assert lost.shard_id not in {q["shard_id"] for q in state["queue"]}
    restored = ShardRegistry(clock)
    restored.restore(completed, "ds")
    assert restored.manager("ds").status().failed == 1


def test_at_most_once_a_shard_acknowledged_in_part_after_the_read_is_set_aside_like_one_leased_at_it() -> None:
    registry = ShardRegistry(SystemClock())
    registry.register(attrs.evolve(_spec(), delivery=DeliveryMode.AT_MOST_ONCE))
    (at_read,) = registry.fetch("ds", "w0", 1).shards
    document = registry.checkpoint("ds")
    passed, after, done = registry.fetch("ds", "w1", 3).shards  # `passed`: leased, not acknowledged yet
    completed = apply_acknowledged(document, [(after.shard_id, 2, False), (done.shard_id, 4, True)])
    _, state = decode_progress(completed)
    failed = sorted(f["shard_id"] for f in state["failed"])
    assert failed == sorted([at_read.shard_id, passed.shard_id, after.shard_id])
    assert state["queue"] == []  # nothing handed out once is handed out again
    assert state["done_total"] == 1
    assert {f["shard_id"]: f["reasons"][-1] for f in state["failed"]}[passed.shard_id].startswith(
        "at-most-once: leased after the position was read"
    )


def test_at_most_once_a_shard_passed_by_one_acknowledgement_and_done_by_a_later_one_of_the_batch_is_done() -> None:
    """Acknowledgements arrive sorted by shard id, not in dispatch order (the dataset is shuffled): a
    later shard's may pass one whose own acknowledgement comes next."""
    registry = ShardRegistry(SystemClock())
    registry.register(attrs.evolve(_spec(), delivery=DeliveryMode.AT_MOST_ONCE))
    document = registry.checkpoint("ds")
    shards = registry.fetch("ds", "w1", 6).shards
    first, last = shards[0], shards[-1]
    completed = apply_acknowledged(document, [(last.shard_id, 4, True), (first.shard_id, 4, True)])
    _, state = decode_progress(completed)
    assert state["done_total"] == 2
    assert sorted(f["shard_id"] for f in state["failed"]) == sorted(s.shard_id for s in shards[1:-1])
    assert state["queue"] == []


def test_a_service_journal_with_leases_is_not_taken_for_a_data_position() -> None:
    registry = _live()
    registry.fetch("ds", "w0", 1)
    with pytest.raises(InvalidShardRequestError, match="keeps leases"):
        apply_acknowledged(registry.checkpoint("ds", include_leases=True), [])
    assert encode_progress(registry.manager("ds"))  # the registry is untouched


@pytest.mark.timeout(60)
def test_a_sync_may_lease_nothing_but_a_plain_fetch_must_ask_for_a_shard(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "w", config=CFG) as client:
        client.register(_spec())
        result = client.sync([], lease=0)
        assert client.buffered == 0
        assert result.shards_to_hand_out == 6
        with pytest.raises(RpcError) as refused:
            client.fetch(0)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
