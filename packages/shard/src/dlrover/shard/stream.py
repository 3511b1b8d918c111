"""Streaming sources: partitions of records numbered by offsets, unbounded.

`StreamSource` is the contract a message-log adapter implements (Redis Streams here; a Kafka
adapter would map topic partitions and offsets one to one). The shard manager never reads a
source: `sync_stream` tells it how far each partition has grown, and workers read their shard's
records with `read_shard`. `StreamPoller` runs `sync_stream` periodically next to a service.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import attrs

from dlrover.common import ConfigError
from dlrover.shard.config import DatasetSpec, StreamPartitions
from dlrover.shard.errors import InvalidShardRequestError
from dlrover.shard.manager import ShardManager
from dlrover.shard.registry import ShardRegistry
from dlrover.shard.shard import Shard

__all__ = [
    "StreamRecord",
    "StreamSource",
    "InMemoryStreamSource",
    "stream_end_offsets",
    "sync_stream",
    "read_shard",
    "StreamPoller",
    "check_range",
]

_log = logging.getLogger(__name__)


@attrs.frozen
class StreamRecord:
    """One record: where it is and its bytes."""

    partition: str
    offset: int
    payload: bytes


@runtime_checkable
class StreamSource(Protocol):
    """Partitions of records with offsets 0, 1, 2, ... in each partition.

    Every implementation passes the contract tests in `tests/test_stream_contract.py`.
    """

    def partitions(self) -> list[str]:
        """The partition names, in a fixed order."""
        ...

    def end_offset(self, partition: str) -> int:
        """One past the offset of the partition's last record (0 when empty).

        Raises:
            InvalidShardRequestError: unknown partition.
        """
        ...

    def read(self, partition: str, start: int, end: int) -> list[StreamRecord]:
        """Records with offsets in [start, end) that exist, in offset order.

        Raises:
            InvalidShardRequestError: unknown partition or a negative offset.
        """
        ...

    def append(self, partition: str, payload: bytes) -> int:
        """Add a record at the end of the partition; returns its offset.

        Raises:
            InvalidShardRequestError: unknown partition.
        """
        ...


def check_range(partitions: list[str], partition: str, start: int, end: int) -> None:
    """Validation every source shares: a known partition and non-negative offsets."""
    if partition not in partitions:
        raise InvalidShardRequestError(f"unknown partition {partition!r}; the source has {partitions}")
    if start < 0 or end < 0:
        raise InvalidShardRequestError(f"offsets must not be negative, got [{start}, {end})")


class InMemoryStreamSource:
    """A thread-safe in-memory `StreamSource`, the reference implementation and test fake.

    Args:
        partitions: the partition names.
    """

    def __init__(self, partitions: list[str]) -> None:
        if not partitions or len(set(partitions)) != len(partitions):
            raise ConfigError(f"partitions must be non-empty and unique, got {partitions!r}")
        self._names = list(partitions)
        self._data: dict[str, list[bytes]] = {p: [] for p in partitions}
        self._lock = threading.Lock()

    def partitions(self) -> list[str]:
        """The partition names, in a fixed order."""
        return list(self._names)

    def end_offset(self, partition: str) -> int:
        """One past the offset of the partition's last record (0 when empty)."""
        check_range(self._names, partition, 0, 0)
        with self._lock:
            return len(self._data[partition])

    def read(self, partition: str, start: int, end: int) -> list[StreamRecord]:
        """Records with offsets in [start, end) that exist, in offset order."""
        check_range(self._names, partition, start, end)
        with self._lock:
            records = self._data[partition][start:end] if start < end else []
        return [StreamRecord(partition, start + i, payload) for i, payload in enumerate(records)]

    def append(self, partition: str, payload: bytes) -> int:
        """Add a record at the end of the partition; returns its offset."""
        check_range(self._names, partition, 0, 0)
        with self._lock:
            self._data[partition].append(bytes(payload))
            return len(self._data[partition]) - 1


def stream_end_offsets(source: StreamSource, spec: DatasetSpec) -> dict[str, int]:
    """How far each partition a stream dataset reads has grown (reads the source, touches no manager).

    Raises:
        InvalidShardRequestError: the dataset is not a stream, or names a partition the source lacks.
    """
    if not isinstance(spec.source, StreamPartitions):
        raise InvalidShardRequestError(f"dataset {spec.name!r} is not a stream")
    available = source.partitions()
    missing = [p for p in spec.source.partitions if p not in available]
    if missing:
        raise InvalidShardRequestError(f"dataset {spec.name!r} reads partitions {missing} the source lacks")
    return {p: source.end_offset(p) for p in spec.source.partitions}


def sync_stream(source: StreamSource, manager: ShardManager) -> dict[str, int]:
    """Tell a stream dataset's manager how far each of its partitions has grown.

    Returns:
        partition -> end offset reported.

    Raises:
        InvalidShardRequestError: the dataset is not a stream, or names a partition the source lacks.
    """
    ends = stream_end_offsets(source, manager.spec)
    for p, end in ends.items():
        manager.advance_stream(p, end)
    return ends


def read_shard(source: StreamSource, shard: Shard) -> list[StreamRecord]:
    """The records of a stream shard not yet consumed, in order.

    Raises:
        InvalidShardRequestError: the shard is not a stream shard, or its records are missing
            (trimmed from the source), which is reported rather than silently skipped.
    """
    if not shard.partition:
        raise InvalidShardRequestError(f"shard {shard.shard_id} of {shard.dataset!r} is not a stream shard")
    records = source.read(shard.partition, shard.start + shard.consumed, shard.end)
    expected = shard.end - shard.start - shard.consumed
    if len(records) != expected:
        raise InvalidShardRequestError(
            f"stream shard {shard.shard_id} expects {expected} records of {shard.partition!r} "
            f"[{shard.start + shard.consumed}, {shard.end}), the source returned {len(records)}"
        )
    return records


class StreamPoller:
    """Tells a stream dataset how far its partitions have grown every `interval_s`, in a thread: it
    reads the source outside the registry's lock and advances the dataset through the registry
    (`ShardRegistry.advance_stream`, which a host that journals the registry's changes logs).

    Args:
        source: the stream.
        locked_registry: a callable returning a context manager that yields the registry, such as
            `ShardServicer.locked`.
        dataset: the stream dataset to feed.
        interval_s: time between polls.
    """

    def __init__(
        self,
        source: StreamSource,
        locked_registry: Callable[[], AbstractContextManager[ShardRegistry]],
        dataset: str,
        interval_s: float = 0.5,
    ) -> None:
        if not interval_s > 0:
            raise ConfigError(f"interval_s must be positive, got {interval_s!r}")
        self._source = source
        self._locked = locked_registry
        self._dataset = dataset
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: Exception | None = None

    def poll_once(self) -> dict[str, int]:
        """One synchronization now; returns partition -> end offset."""
        with self._locked() as registry:
            spec = registry.manager(self._dataset).spec
        ends = stream_end_offsets(self._source, spec)  # source I/O outside the lock RPCs wait on
        with self._locked() as registry:
            for p, end in ends.items():
                registry.advance_stream(self._dataset, p, end)
        return ends

    def start(self) -> None:
        """Start polling in the background."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"stream-poller-{self._dataset}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop polling and join the thread; safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
                self.last_error = None
            except Exception as exc:  # keep polling; the error is kept and logged, not hidden
                self.last_error = exc
                _log.warning("stream poll of %r failed: %s", self._dataset, exc)
            self._stop.wait(self._interval_s)
