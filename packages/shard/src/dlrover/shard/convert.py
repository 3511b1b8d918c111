"""Conversions between protobuf messages and domain types; no logic beyond translation."""

from __future__ import annotations

from dlrover.shard.config import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    RecordFile,
    RecordFileSource,
    RecordUnit,
    StreamPartitions,
    TaskType,
)
from dlrover.shard.errors import InvalidShardRequestError
from dlrover.shard.results import DatasetStatus, FailedShard, WorkerThroughput
from dlrover.shard.shard import Shard
from dlrover.shard.v1 import shard_pb2 as pb

__all__ = [
    "spec_to_proto",
    "spec_from_proto",
    "shard_to_proto",
    "fill_shard_proto",
    "shard_from_proto",
    "status_to_proto",
    "status_from_proto",
]

_DELIVERY = {
    pb.DELIVERY_MODE_UNSPECIFIED: DeliveryMode.AT_LEAST_ONCE,
    pb.AT_LEAST_ONCE: DeliveryMode.AT_LEAST_ONCE,
    pb.EXACTLY_ONCE: DeliveryMode.EXACTLY_ONCE,
    pb.AT_MOST_ONCE: DeliveryMode.AT_MOST_ONCE,
}
_TASK = {
    pb.TASK_TYPE_UNSPECIFIED: TaskType.TRAINING,
    pb.TRAINING: TaskType.TRAINING,
    pb.EVALUATION: TaskType.EVALUATION,
    pb.PREDICTION: TaskType.PREDICTION,
}
_UNIT = {pb.RECORD_UNIT_UNSPECIFIED: RecordUnit.LINE, pb.LINE: RecordUnit.LINE, pb.BYTE: RecordUnit.BYTE}
_DELIVERY_OUT = {DeliveryMode.AT_LEAST_ONCE: pb.AT_LEAST_ONCE, DeliveryMode.EXACTLY_ONCE: pb.EXACTLY_ONCE,
                 DeliveryMode.AT_MOST_ONCE: pb.AT_MOST_ONCE}  # fmt: skip
_TASK_OUT = {TaskType.TRAINING: pb.TRAINING, TaskType.EVALUATION: pb.EVALUATION, TaskType.PREDICTION: pb.PREDICTION}
_UNIT_OUT = {RecordUnit.LINE: pb.LINE, RecordUnit.BYTE: pb.BYTE}


def _enum(table: dict[int, object], value: int, name: str) -> object:
    if value not in table:
        raise InvalidShardRequestError(f"{name} has unknown value {value}")
    return table[value]


def spec_from_proto(msg: pb.DatasetSpec) -> DatasetSpec:
    """A validated `DatasetSpec` from its message.

    Raises:
        InvalidShardRequestError: no source, an unknown enum value, or an invalid field.
    """
    kind = msg.WhichOneof("source")
    source: IndexSource | RecordFileSource | StreamPartitions
    if kind == "index":
        source = IndexSource(msg.index.num_samples)
    elif kind == "record_files":
        rf = msg.record_files
        source = RecordFileSource(
            files=tuple(RecordFile(f.path, f.size) for f in rf.files),
            unit=_enum(_UNIT, rf.unit, "record_files.unit"),  # type: ignore[arg-type]
            record_bytes=rf.record_bytes or 1,
            cross_file_boundaries=rf.cross_file_boundaries,
        )
    elif kind == "stream":
        source = StreamPartitions(tuple(msg.stream.partitions))
    else:
        raise InvalidShardRequestError(f"dataset {msg.name!r} has no source (index, record_files or stream)")
    return DatasetSpec(
        name=msg.name,
        source=source,
        batch_size=msg.batch_size,
        batches_per_shard=msg.batches_per_shard,
        num_epochs=msg.num_epochs if msg.HasField("num_epochs") else None,
        shuffle=msg.shuffle,
        shuffle_samples=msg.shuffle_samples,
        seed=msg.seed,
        delivery=_enum(_DELIVERY, msg.delivery, "delivery"),  # type: ignore[arg-type]
        task_type=_enum(_TASK, msg.task_type, "task_type"),  # type: ignore[arg-type]
        lease_timeout_s=msg.lease_timeout_s if msg.HasField("lease_timeout_s") else None,
        max_attempts=msg.max_attempts if msg.HasField("max_attempts") else None,
    )


def spec_to_proto(spec: DatasetSpec) -> pb.DatasetSpec:
    """The message of a `DatasetSpec`."""
    msg = pb.DatasetSpec(
        name=spec.name,
        batch_size=spec.batch_size,
        batches_per_shard=spec.batches_per_shard,
        shuffle=spec.shuffle,
        shuffle_samples=spec.shuffle_samples,
        seed=spec.seed,
        delivery=_DELIVERY_OUT[spec.delivery],
        task_type=_TASK_OUT[spec.task_type],
    )
    src = spec.source
    if isinstance(src, IndexSource):
        msg.index.num_samples = src.num_samples
    elif isinstance(src, RecordFileSource):
        msg.record_files.files.extend(pb.RecordFile(path=f.path, size=f.size) for f in src.files)
        msg.record_files.unit = _UNIT_OUT[src.unit]
        msg.record_files.record_bytes = src.record_bytes
        msg.record_files.cross_file_boundaries = src.cross_file_boundaries
    else:
        msg.stream.partitions.extend(src.partitions)
    if spec.num_epochs is not None:
        msg.num_epochs = spec.num_epochs
    if spec.lease_timeout_s is not None:
        msg.lease_timeout_s = spec.lease_timeout_s
    if spec.max_attempts is not None:
        msg.max_attempts = spec.max_attempts
    return msg


def shard_to_proto(shard: Shard) -> pb.Shard:
    """The message of a `Shard`."""
    return fill_shard_proto(pb.Shard(), shard)


def fill_shard_proto(msg: pb.Shard, shard: Shard) -> pb.Shard:
    """Write `shard` into an empty `msg` in place, e.g. `response.shards.add()`; returns `msg`.

    Filling the element a repeated field adds avoids building a message and copying it in,
    which is most of the cost of a one-shard `FetchShards` reply. Fields at their proto3
    default are left unset; they read back the same.
    """
    msg.dataset = shard.dataset
    msg.shard_id = shard.shard_id
    msg.epoch = shard.epoch
    msg.start = shard.start
    msg.end = shard.end
    if shard.consumed:
        msg.consumed = shard.consumed
    if shard.partition:
        msg.partition = shard.partition
    msg.attempt = shard.attempt
    if shard.order_seed is not None:
        msg.order_seed = shard.order_seed
    return msg


def shard_from_proto(msg: pb.Shard) -> Shard:
    """A `Shard` from its message."""
    return Shard(
        dataset=msg.dataset,
        shard_id=msg.shard_id,
        epoch=msg.epoch,
        start=msg.start,
        end=msg.end,
        consumed=msg.consumed,
        order_seed=msg.order_seed if msg.HasField("order_seed") else None,
        partition=msg.partition,
        attempt=msg.attempt,
    )


def status_to_proto(status: DatasetStatus) -> pb.GetStatusResponse:
    """The message of a `DatasetStatus`."""
    msg = pb.GetStatusResponse(
        dataset=status.dataset,
        todo=status.todo,
        doing=status.doing,
        done=status.done,
        failed=status.failed,
        epoch=status.epoch,
        finished=status.finished,
        workers=[
            pb.WorkerThroughput(
                worker=w.worker,
                samples=w.samples,
                shards_done=w.shards_done,
                samples_per_s=w.samples_per_s,
                leased=w.leased,
            )
            for w in status.workers
        ],
        failed_shards=[pb.FailedShard(shard=shard_to_proto(f.shard), reasons=f.reasons) for f in status.failed_shards],
    )
    if status.epochs_remaining is not None:
        msg.epochs_remaining = status.epochs_remaining
    return msg


def status_from_proto(msg: pb.GetStatusResponse) -> DatasetStatus:
    """A `DatasetStatus` from its message."""
    return DatasetStatus(
        dataset=msg.dataset,
        todo=msg.todo,
        doing=msg.doing,
        done=msg.done,
        failed=msg.failed,
        epoch=msg.epoch,
        epochs_remaining=msg.epochs_remaining if msg.HasField("epochs_remaining") else None,
        finished=msg.finished,
        workers=tuple(
            WorkerThroughput(w.worker, w.samples, w.shards_done, w.samples_per_s, w.leased) for w in msg.workers
        ),
        failed_shards=tuple(FailedShard(shard_from_proto(f.shard), tuple(f.reasons)) for f in msg.failed_shards),
    )
