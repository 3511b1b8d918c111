"""dlrover.shard: dynamic data sharding that loses no sample and trains none twice.

A dataset is split into small shards; workers lease the next shard when they have used up the
last, report progress (which renews the lease and, under exactly-once, acknowledges samples) and
report done or failure. Failed or expired leases return the shard (or, under exactly-once, its
unacknowledged remainder) to the queue; a shard failing too often goes to a visible failed set.

The core (`ShardRegistry`, `ShardManager`) is pure: no I/O, no threads, time from an injected
clock. `dlrover.shard.service` hosts it over gRPC, `ShardClient` talks to it, and
`dlrover.shard.torch_data` / `dlrover.shard.tf_data` feed training loops (torch and TensorFlow
are optional extras and are imported only by those modules), and `dlrover.shard.redis_stream`
reads Redis Streams (optional extra `redis`).
"""

from dlrover.shard.acknowledged import apply_acknowledged
from dlrover.shard.changelog import LoggedCall
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.config import (
    DatasetSpec,
    DataSource,
    DeliveryMode,
    IndexSource,
    RecordFile,
    RecordFileSource,
    RecordUnit,
    ShardManagerConfig,
    StreamPartitions,
    TaskType,
)
from dlrover.shard.errors import (
    InvalidShardRequestError,
    ShardError,
    ShardStateError,
    UnknownDatasetError,
    UnknownShardError,
)
from dlrover.shard.manager import ShardManager
from dlrover.shard.progress import PROGRESS_FORMAT, PROGRESS_VERSION, decode_progress, spec_from_json, spec_to_json
from dlrover.shard.records import RecordRef, read_byte_range, read_lines, read_shard_records
from dlrover.shard.registry import ShardRegistry
from dlrover.shard.results import (
    DatasetStatus,
    FailedShard,
    FetchResult,
    RegisterResult,
    ReportResult,
    RestoreResult,
    ShardSnapshot,
    SyncResult,
    WorkerThroughput,
)
from dlrover.shard.service import ShardServicer, add_shard_service, status_code_of
from dlrover.shard.shard import Shard, mix_seed
from dlrover.shard.splitter import record_segments
from dlrover.shard.stream import (
    InMemoryStreamSource,
    StreamPoller,
    StreamRecord,
    StreamSource,
    read_shard,
    stream_end_offsets,
    sync_stream,
)

__all__ = [
    # specification
    "DatasetSpec",
    "DataSource",
    "IndexSource",
    "RecordFile",
    "RecordFileSource",
    "RecordUnit",
    "StreamPartitions",
    "DeliveryMode",
    "TaskType",
    "ShardManagerConfig",
    # core
    "ShardRegistry",
    "ShardManager",
    "LoggedCall",
    "Shard",
    "mix_seed",
    "record_segments",
    # record files
    "RecordRef",
    "read_lines",
    "read_byte_range",
    "read_shard_records",
    # results
    "FetchResult",
    "ReportResult",
    "RegisterResult",
    "RestoreResult",
    "FailedShard",
    "WorkerThroughput",
    "DatasetStatus",
    "ShardSnapshot",
    "SyncResult",
    # streams
    "StreamSource",
    "StreamRecord",
    "InMemoryStreamSource",
    "StreamPoller",
    "stream_end_offsets",
    "sync_stream",
    "read_shard",
    # gRPC edge
    "ShardServicer",
    "add_shard_service",
    "status_code_of",
    "ShardClient",
    "ShardClientConfig",
    # checkpoint format
    "PROGRESS_FORMAT",
    "PROGRESS_VERSION",
    "decode_progress",
    "spec_to_json",
    "spec_from_json",
    "apply_acknowledged",
    # errors
    "ShardError",
    "InvalidShardRequestError",
    "UnknownDatasetError",
    "UnknownShardError",
    "ShardStateError",
]
