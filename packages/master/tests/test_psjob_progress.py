"""RewindWatchingServicer: the samples a restore of a data position undoes, counted where the data is handed out."""

from __future__ import annotations

from typing import Any

from dlrover.common import ManualClock
from dlrover.master.psjob import Rewind, RewindWatchingServicer
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardRegistry
from dlrover.shard.v1 import shard_pb2 as pb


class _Context:
    def abort(self, code: Any, message: str) -> None:
        raise AssertionError(f"aborted: {code} {message}")


def _servicer() -> tuple[RewindWatchingServicer, list[Rewind]]:
    registry = ShardRegistry(ManualClock())
    registry.register(DatasetSpec(name="d", source=IndexSource(40), batch_size=4, batches_per_shard=1,
                                  delivery=DeliveryMode.EXACTLY_ONCE))  # fmt: skip
    rewinds: list[Rewind] = []
    return RewindWatchingServicer(registry, rewinds.append), rewinds


def _train(servicer: RewindWatchingServicer, shards: int) -> None:
    for _ in range(shards):
        with servicer.locked() as registry:
            manager = registry.manager("d")
            shard = manager.fetch("chief").shards[0]
            manager.report_done("chief", shard.shard_id)


def _checkpoint(servicer: RewindWatchingServicer) -> str:
    return servicer.GetCheckpoint(pb.GetCheckpointRequest(dataset="d"), _Context()).document  # type: ignore[arg-type]


def _restore(servicer: RewindWatchingServicer, document: str, dataset: str = "d", request_id: str = "") -> None:
    request = pb.RestoreCheckpointRequest(document=document, dataset=dataset, request_id=request_id)
    servicer.RestoreCheckpoint(request, _Context())  # type: ignore[arg-type]


def test_a_restore_reports_the_samples_acknowledged_since_its_position_was_read() -> None:
    servicer, rewinds = _servicer()
    _train(servicer, 2)
    position = _checkpoint(servicer)
    _train(servicer, 3)
    _restore(servicer, position)
    assert rewinds == [Rewind("d", 12, 3)]
    _train(servicer, 1)
    _restore(servicer, position, dataset="")  # the name left to the document
    assert rewinds[-1] == Rewind("d", 4, 1), "counted from the restored position, and for a nameless request"


def test_a_retried_restore_is_not_counted_twice() -> None:
    servicer, rewinds = _servicer()
    position = _checkpoint(servicer)
    _train(servicer, 2)
    _restore(servicer, position, request_id="r1")
    _restore(servicer, position, request_id="r1")
    assert rewinds == [Rewind("d", 8, 2)]


def test_a_position_this_master_did_not_hand_out_is_reported_as_unknown() -> None:
    servicer, rewinds = _servicer()
    earlier_run, _ = _servicer()
    _train(earlier_run, 1)
    _train(servicer, 2)
    _restore(servicer, _checkpoint(earlier_run))
    assert rewinds == [Rewind("d", None, None)]


def test_a_position_read_with_a_fetch_is_counted_as_one_read_alone() -> None:
    servicer, rewinds = _servicer()
    _train(servicer, 2)
    request = pb.FetchShardsRequest(dataset="d", worker="chief", count=1, request_id="f1", with_checkpoint=True)
    reply = servicer.FetchShards(request, _Context())  # type: ignore[arg-type]
    assert len(reply.shards) == 1
    with servicer.locked() as registry:
        registry.manager("d").report_done("chief", reply.shards[0].shard_id)
    _train(servicer, 2)
    _restore(servicer, reply.checkpoint)
    assert rewinds == [Rewind("d", 12, 3)], "the shard leased with the read and the two after it are undone"
