"""What a dataset is and how its shards are handed out: validated, frozen specifications."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs

from dlrover.shard.errors import InvalidShardRequestError

__all__ = [
    "DeliveryMode",
    "TaskType",
    "RecordUnit",
    "IndexSource",
    "RecordFile",
    "RecordFileSource",
    "StreamPartitions",
    "DataSource",
    "DatasetSpec",
    "ShardManagerConfig",
    "MAX_NAME_CHARS",
]

MAX_NAME_CHARS = 200
_MAX_SEED = 2**63 - 1


class DeliveryMode(enum.Enum):
    """What a failure does to a shard's samples.

    AT_LEAST_ONCE: the whole shard is dispatched again, so samples a failed worker had used may
        be used twice.
    EXACTLY_ONCE: workers acknowledge consumed samples; only the unacknowledged remainder is
        dispatched again.
    AT_MOST_ONCE: a shard is never dispatched twice; the remainder of a failed shard goes to the
        visible failed set with its reason.
    """

    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"
    AT_MOST_ONCE = "at_most_once"


class TaskType(enum.Enum):
    """What the data is used for; each task type has its own lease timeout."""

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


class RecordUnit(enum.Enum):
    """How record files are measured and split.

    LINE: sizes and shard bounds count lines (one record per line).
    BYTE: sizes and shard bounds are byte offsets; a record belongs to the shard holding its
        first byte (the reader skips a partial first line and finishes the last one), so files
        need not be scanned for line counts.
    """

    LINE = "line"
    BYTE = "byte"


def _invalid(message: str) -> InvalidShardRequestError:
    return InvalidShardRequestError(message)


def _positive_int(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _invalid(f"{attribute.name} must be a positive integer, got {value!r}")


def _positive_float(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _invalid(f"{attribute.name} must be positive, got {value!r}")


def _name(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise _invalid(
            f"{attribute.name} must be a non-empty string of at most {MAX_NAME_CHARS} characters, got {value!r}"
        )


@attrs.frozen
class IndexSource:
    """A map-style dataset of `num_samples` samples addressed by index 0..num_samples-1."""

    num_samples: int = attrs.field(validator=_positive_int)


@attrs.frozen
class RecordFile:
    """One record file: its path and its size in the source's unit (lines or bytes)."""

    path: str = attrs.field(validator=_name)
    size: int = attrs.field(validator=_positive_int)


def _file_tuple(value: Iterable[RecordFile]) -> tuple[RecordFile, ...]:
    return tuple(value)


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _files(_inst: object, _attribute: attrs.Attribute[Any], value: tuple[RecordFile, ...]) -> None:
    if not value:
        raise _invalid("a record file source needs at least one file, got none")
    paths = [f.path for f in value]
    if len(set(paths)) != len(paths):
        raise _invalid(f"record file paths must be unique, got {paths!r}")


@attrs.frozen
class RecordFileSource:
    """A list of record files split into shards by line or byte offsets.

    Attributes:
        files: the files, in order.
        unit: whether sizes and offsets count lines or bytes.
        record_bytes: with BYTE units, the expected bytes per record; a shard spans
            `shard_size * record_bytes` bytes. Ignored for LINE units.
        cross_file_boundaries: let a shard continue into the next file instead of ending with
            its file (so every shard but the last is full-sized).
    """

    files: tuple[RecordFile, ...] = attrs.field(converter=_file_tuple, validator=_files)
    unit: RecordUnit = RecordUnit.LINE
    record_bytes: int = 1
    cross_file_boundaries: bool = False

    def __attrs_post_init__(self) -> None:
        if isinstance(self.record_bytes, bool) or not isinstance(self.record_bytes, int) or self.record_bytes <= 0:
            raise _invalid(f"record_bytes must be a positive integer, got {self.record_bytes!r}")


def _partitions(_inst: object, _attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not value:
        raise _invalid("a stream needs at least one partition, got none")
    for p in value:
        if not isinstance(p, str) or not p or len(p) > MAX_NAME_CHARS:
            raise _invalid(f"a partition name must be a non-empty string, got {p!r}")
    if len(set(value)) != len(value):
        raise _invalid(f"partition names must be unique, got {list(value)!r}")


@attrs.frozen
class StreamPartitions:
    """An unbounded stream: partitions of records numbered by offsets from 0.

    Shards are cut as records arrive (see `ShardManager.advance_stream`); there are no epochs.
    """

    partitions: tuple[str, ...] = attrs.field(converter=_str_tuple, validator=_partitions)


DataSource = IndexSource | RecordFileSource | StreamPartitions


def _source(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, IndexSource | RecordFileSource | StreamPartitions):
        raise _invalid(f"source must be an IndexSource, RecordFileSource or StreamPartitions, got {value!r}")


def _epochs(_inst: object, _attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _positive_int(_inst, _attribute, value)


def _seed(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SEED:
        raise _invalid(f"{attribute.name} must be an integer in 0..2**63-1, got {value!r}")


def _optional_positive_float(inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        _positive_float(inst, attribute, value)


def _optional_positive_int(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _positive_int(inst, attribute, value)


@attrs.frozen
class DatasetSpec:
    """A dataset and how its shards are made and handed out.

    Attributes:
        name: the dataset's unique name.
        source: what is split (index range, record files, or stream partitions).
        batch_size: samples per batch.
        batches_per_shard: batches per shard; a shard holds `batch_size * batches_per_shard`
            samples (the last shard of a file or range may hold fewer).
        num_epochs: passes over the data; None for unbounded. Streams must use None.
        shuffle: shuffle the order of shards in each epoch (seeded by `seed` and the epoch).
        shuffle_samples: shuffle samples within each shard (seeded); not for BYTE units or
            streams, whose readers consume in order.
        seed: the seed of every shuffle; the same seed gives the same order.
        delivery: what a failure does to a shard's samples.
        task_type: training, evaluation or prediction; picks the default lease timeout.
        lease_timeout_s: overrides the manager's lease timeout for this task type.
        max_attempts: overrides the manager's attempts before a shard is declared failed.
    """

    name: str = attrs.field(validator=_name)
    source: DataSource = attrs.field(validator=_source)
    batch_size: int = attrs.field(validator=_positive_int)
    batches_per_shard: int = attrs.field(default=1, validator=_positive_int)
    num_epochs: int | None = attrs.field(default=1, validator=_epochs)
    shuffle: bool = False
    shuffle_samples: bool = False
    seed: int = attrs.field(default=0, validator=_seed)
    delivery: DeliveryMode = DeliveryMode.AT_LEAST_ONCE
    task_type: TaskType = TaskType.TRAINING
    lease_timeout_s: float | None = attrs.field(default=None, validator=_optional_positive_float)
    max_attempts: int | None = attrs.field(default=None, validator=_optional_positive_int)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.delivery, DeliveryMode):
            raise _invalid(f"delivery must be a DeliveryMode, got {self.delivery!r}")
        if not isinstance(self.task_type, TaskType):
            raise _invalid(f"task_type must be a TaskType, got {self.task_type!r}")
        if isinstance(self.source, StreamPartitions):
            if self.num_epochs is not None:
                raise _invalid(f"a stream is unbounded: num_epochs must be None, got {self.num_epochs!r}")
            if self.shuffle or self.shuffle_samples:
                raise _invalid("a stream is consumed in offset order: shuffle and shuffle_samples must be False")
        if isinstance(self.source, RecordFileSource) and self.source.unit is RecordUnit.BYTE and self.shuffle_samples:
            raise _invalid("byte-offset shards are read in order: shuffle_samples must be False with BYTE units")

    @property
    def shard_size(self) -> int:
        """Samples per shard: `batch_size * batches_per_shard`."""
        return self.batch_size * self.batches_per_shard

    @property
    def shard_units(self) -> int:
        """Units (samples, lines or bytes) per shard."""
        if isinstance(self.source, RecordFileSource) and self.source.unit is RecordUnit.BYTE:
            return self.shard_size * self.source.record_bytes
        return self.shard_size


@attrs.frozen
class ShardManagerConfig:
    """Settings shared by every dataset of a registry.

    Attributes:
        training_lease_timeout_s: lease of a training shard without a progress report.
        evaluation_lease_timeout_s: the same for evaluation shards.
        prediction_lease_timeout_s: the same for prediction shards.
        max_attempts: dispatches that end in failure (reported failure, expired lease, departed
            worker) before a shard goes to the failed set.
        max_fetch_count: the most shards one fetch may ask for.
        request_cache_size: replies remembered per worker, so a retried request with the same
            request id gets the same reply instead of acting twice. A client has at most two
            calls in flight (its prefetch thread and its caller), so a few suffice.
        done_when_acknowledged: under exactly-once, a lease that ends with every unit acknowledged
            finishes the shard instead of re-queueing an empty rest. A journal base written before
            this setting existed restores it as False, so a master replays its predecessor's
            change lines as they were decided.
    """

    training_lease_timeout_s: float = attrs.field(default=60.0, validator=_positive_float)
    evaluation_lease_timeout_s: float = attrs.field(default=60.0, validator=_positive_float)
    prediction_lease_timeout_s: float = attrs.field(default=60.0, validator=_positive_float)
    max_attempts: int = attrs.field(default=3, validator=_positive_int)
    max_fetch_count: int = attrs.field(default=1024, validator=_positive_int)
    request_cache_size: int = attrs.field(default=4, validator=_positive_int)
    done_when_acknowledged: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    def lease_timeout_s(self, task_type: TaskType) -> float:
        """The lease timeout of `task_type`."""
        return {
            TaskType.TRAINING: self.training_lease_timeout_s,
            TaskType.EVALUATION: self.evaluation_lease_timeout_s,
            TaskType.PREDICTION: self.prediction_lease_timeout_s,
        }[task_type]
