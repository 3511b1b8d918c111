from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliveryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_MODE_UNSPECIFIED: _ClassVar[DeliveryMode]
    AT_LEAST_ONCE: _ClassVar[DeliveryMode]
    EXACTLY_ONCE: _ClassVar[DeliveryMode]
    AT_MOST_ONCE: _ClassVar[DeliveryMode]

class TaskType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_TYPE_UNSPECIFIED: _ClassVar[TaskType]
    TRAINING: _ClassVar[TaskType]
    EVALUATION: _ClassVar[TaskType]
    PREDICTION: _ClassVar[TaskType]

class RecordUnit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECORD_UNIT_UNSPECIFIED: _ClassVar[RecordUnit]
    LINE: _ClassVar[RecordUnit]
    BYTE: _ClassVar[RecordUnit]
DELIVERY_MODE_UNSPECIFIED: DeliveryMode
AT_LEAST_ONCE: DeliveryMode
EXACTLY_ONCE: DeliveryMode
AT_MOST_ONCE: DeliveryMode
TASK_TYPE_UNSPECIFIED: TaskType
TRAINING: TaskType
EVALUATION: TaskType
PREDICTION: TaskType
RECORD_UNIT_UNSPECIFIED: RecordUnit
LINE: RecordUnit
BYTE: RecordUnit

class IndexSource(_message.Message):
    __slots__ = ("num_samples",)
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    num_samples: int
    def __init__(self, num_samples: _Optional[int] = ...) -> None: ...

class RecordFile(_message.Message):
    __slots__ = ("path", "size")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class RecordFileSource(_message.Message):
    __slots__ = ("files", "unit", "record_bytes", "cross_file_boundaries")
    FILES_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    RECORD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CROSS_FILE_BOUNDARIES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[RecordFile]
    unit: RecordUnit
    record_bytes: int
    cross_file_boundaries: bool
    def __init__(self, files: _Optional[_Iterable[_Union[RecordFile, _Mapping]]] = ..., unit: _Optional[_Union[RecordUnit, str]] = ..., record_bytes: _Optional[int] = ..., cross_file_boundaries: _Optional[bool] = ...) -> None: ...

class StreamPartitions(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, partitions: _Optional[_Iterable[str]] = ...) -> None: ...

class DatasetSpec(_message.Message):
    __slots__ = ("name", "index", "record_files", "stream", "batch_size", "batches_per_shard", "num_epochs", "shuffle", "shuffle_samples", "seed", "delivery", "task_type", "lease_timeout_s", "max_attempts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RECORD_FILES_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PER_SHARD_FIELD_NUMBER: _ClassVar[int]
    NUM_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    index: IndexSource
    record_files: RecordFileSource
    stream: StreamPartitions
    batch_size: int
    batches_per_shard: int
    num_epochs: int
    shuffle: bool
    shuffle_samples: bool
    seed: int
    delivery: DeliveryMode
    task_type: TaskType
    lease_timeout_s: float
    max_attempts: int
    def __init__(self, name: _Optional[str] = ..., index: _Optional[_Union[IndexSource, _Mapping]] = ..., record_files: _Optional[_Union[RecordFileSource, _Mapping]] = ..., stream: _Optional[_Union[StreamPartitions, _Mapping]] = ..., batch_size: _Optional[int] = ..., batches_per_shard: _Optional[int] = ..., num_epochs: _Optional[int] = ..., shuffle: _Optional[bool] = ..., shuffle_samples: _Optional[bool] = ..., seed: _Optional[int] = ..., delivery: _Optional[_Union[DeliveryMode, str]] = ..., task_type: _Optional[_Union[TaskType, str]] = ..., lease_timeout_s: _Optional[float] = ..., max_attempts: _Optional[int] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("dataset", "shard_id", "epoch", "start", "end", "consumed", "order_seed", "partition", "attempt")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    ORDER_SEED_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    shard_id: int
    epoch: int
    start: int
    end: int
    consumed: int
    order_seed: int
    partition: str
    attempt: int
    def __init__(self, dataset: _Optional[str] = ..., shard_id: _Optional[int] = ..., epoch: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., consumed: _Optional[int] = ..., order_seed: _Optional[int] = ..., partition: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class RegisterDatasetRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: DatasetSpec
    def __init__(self, spec: _Optional[_Union[DatasetSpec, _Mapping]] = ...) -> None: ...

class RegisterDatasetResponse(_message.Message):
    __slots__ = ("created", "reason")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    created: bool
    reason: str
    def __init__(self, created: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class FetchShardsRequest(_message.Message):
    __slots__ = ("dataset", "worker", "count", "request_id", "with_checkpoint", "acknowledged")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    worker: str
    count: int
    request_id: str
    with_checkpoint: bool
    acknowledged: _containers.RepeatedCompositeFieldContainer[Acknowledgement]
    def __init__(self, dataset: _Optional[str] = ..., worker: _Optional[str] = ..., count: _Optional[int] = ..., request_id: _Optional[str] = ..., with_checkpoint: _Optional[bool] = ..., acknowledged: _Optional[_Iterable[_Union[Acknowledgement, _Mapping]]] = ...) -> None: ...

class Acknowledgement(_message.Message):
    __slots__ = ("shard_id", "consumed", "done")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    consumed: int
    done: bool
    def __init__(self, shard_id: _Optional[int] = ..., consumed: _Optional[int] = ..., done: _Optional[bool] = ...) -> None: ...

class FetchShardsResponse(_message.Message):
    __slots__ = ("shards", "finished", "reason", "checkpoint", "acknowledged", "todo")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    TODO_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    finished: bool
    reason: str
    checkpoint: str
    acknowledged: int
    todo: int
    def __init__(self, shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ..., finished: _Optional[bool] = ..., reason: _Optional[str] = ..., checkpoint: _Optional[str] = ..., acknowledged: _Optional[int] = ..., todo: _Optional[int] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("dataset", "worker", "shard_id", "consumed", "request_id", "attempt")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    worker: str
    shard_id: int
    consumed: int
    request_id: str
    attempt: int
    def __init__(self, dataset: _Optional[str] = ..., worker: _Optional[str] = ..., shard_id: _Optional[int] = ..., consumed: _Optional[int] = ..., request_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("changed", "reason")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    reason: str
    def __init__(self, changed: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportDoneRequest(_message.Message):
    __slots__ = ("dataset", "worker", "shard_id", "request_id")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    worker: str
    shard_id: int
    request_id: str
    def __init__(self, dataset: _Optional[str] = ..., worker: _Optional[str] = ..., shard_id: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportDoneResponse(_message.Message):
    __slots__ = ("changed", "reason")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    reason: str
    def __init__(self, changed: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportFailureRequest(_message.Message):
    __slots__ = ("dataset", "worker", "shard_id", "reason", "consumed", "request_id")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    worker: str
    shard_id: int
    reason: str
    consumed: int
    request_id: str
    def __init__(self, dataset: _Optional[str] = ..., worker: _Optional[str] = ..., shard_id: _Optional[int] = ..., reason: _Optional[str] = ..., consumed: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportFailureResponse(_message.Message):
    __slots__ = ("changed", "reason")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    reason: str
    def __init__(self, changed: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class RemoveWorkerRequest(_message.Message):
    __slots__ = ("worker", "reason")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker: str
    reason: str
    def __init__(self, worker: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleasedShards(_message.Message):
    __slots__ = ("dataset", "shard_ids")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SHARD_IDS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    shard_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dataset: _Optional[str] = ..., shard_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RemoveWorkerResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: _containers.RepeatedCompositeFieldContainer[ReleasedShards]
    def __init__(self, released: _Optional[_Iterable[_Union[ReleasedShards, _Mapping]]] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class GetCheckpointResponse(_message.Message):
    __slots__ = ("document",)
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    document: str
    def __init__(self, document: _Optional[str] = ...) -> None: ...

class RestoreCheckpointRequest(_message.Message):
    __slots__ = ("document", "dataset", "request_id")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    document: str
    dataset: str
    request_id: str
    def __init__(self, document: _Optional[str] = ..., dataset: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RestoreCheckpointResponse(_message.Message):
    __slots__ = ("dataset", "returned_to_queue", "reason")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    RETURNED_TO_QUEUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    returned_to_queue: int
    reason: str
    def __init__(self, dataset: _Optional[str] = ..., returned_to_queue: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class WorkerThroughput(_message.Message):
    __slots__ = ("worker", "samples", "shards_done", "samples_per_s", "leased")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_DONE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    worker: str
    samples: int
    shards_done: int
    samples_per_s: float
    leased: int
    def __init__(self, worker: _Optional[str] = ..., samples: _Optional[int] = ..., shards_done: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., leased: _Optional[int] = ...) -> None: ...

class FailedShard(_message.Message):
    __slots__ = ("shard", "reasons")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    shard: Shard
    reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shard: _Optional[_Union[Shard, _Mapping]] = ..., reasons: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("dataset", "todo", "doing", "done", "failed", "epoch", "epochs_remaining", "finished", "workers", "failed_shards")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    TODO_FIELD_NUMBER: _ClassVar[int]
    DOING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_REMAINING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FAILED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    todo: int
    doing: int
    done: int
    failed: int
    epoch: int
    epochs_remaining: int
    finished: bool
    workers: _containers.RepeatedCompositeFieldContainer[WorkerThroughput]
    failed_shards: _containers.RepeatedCompositeFieldContainer[FailedShard]
    def __init__(self, dataset: _Optional[str] = ..., todo: _Optional[int] = ..., doing: _Optional[int] = ..., done: _Optional[int] = ..., failed: _Optional[int] = ..., epoch: _Optional[int] = ..., epochs_remaining: _Optional[int] = ..., finished: _Optional[bool] = ..., workers: _Optional[_Iterable[_Union[WorkerThroughput, _Mapping]]] = ..., failed_shards: _Optional[_Iterable[_Union[FailedShard, _Mapping]]] = ...) -> None: ...
