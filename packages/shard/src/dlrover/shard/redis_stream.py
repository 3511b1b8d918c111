"""A `StreamSource` on Redis Streams (optional extra `redis`, imported lazily).

Each partition is one Redis stream key, `<key_prefix><partition>`. Offsets map to entry ids
`0-<offset + 1>` (Redis forbids the id 0-0), so offsets are dense and `XRANGE` reads a range
directly. Records must therefore be appended through `append`, which picks the next id; an entry
added with an automatic id would break the mapping, and `end_offset` reports such a stream as
an error rather than guessing.
"""

from __future__ import annotations

from typing import Any

from dlrover.common import ConfigError
from dlrover.shard.errors import InvalidShardRequestError
from dlrover.shard.stream import StreamRecord, check_range

__all__ = ["RedisStreamSource"]

_FIELD = b"d"
_APPEND_RETRIES = 32


def _seq(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    if ms != "0":
        raise InvalidShardRequestError(
            f"redis stream entry {text!r} was not added by RedisStreamSource.append (ids must be 0-<offset+1>)"
        )
    return int(seq)


class RedisStreamSource:
    """Partitions as Redis streams.

    Args:
        client: a `redis.Redis` client (bytes responses, i.e. decode_responses=False).
        partitions: the partition names.
        key_prefix: prepended to a partition name to form its stream key.
    """

    def __init__(self, client: Any, partitions: list[str], key_prefix: str = "dlrover:shard:") -> None:
        if not partitions or len(set(partitions)) != len(partitions):
            raise ConfigError(f"partitions must be non-empty and unique, got {partitions!r}")
        self._redis = client
        self._names = list(partitions)
        self._prefix = key_prefix

    def _key(self, partition: str) -> str:
        return self._prefix + partition

    def partitions(self) -> list[str]:
        """The partition names, in a fixed order."""
        return list(self._names)

    def end_offset(self, partition: str) -> int:
        """One past the offset of the stream's last entry (0 when empty or missing)."""
        check_range(self._names, partition, 0, 0)
        last = self._redis.xrevrange(self._key(partition), "+", "-", count=1)
        return _seq(last[0][0]) if last else 0

    def read(self, partition: str, start: int, end: int) -> list[StreamRecord]:
        """Entries with offsets in [start, end), in order (one XRANGE)."""
        check_range(self._names, partition, start, end)
        if start >= end:
            return []
        entries = self._redis.xrange(self._key(partition), f"0-{start + 1}", f"0-{end}", count=end - start)
        return [StreamRecord(partition, _seq(eid) - 1, fields[_FIELD]) for eid, fields in entries]

    def append(self, partition: str, payload: bytes) -> int:
        """XADD the payload at the next offset; retries when another producer took it first."""
        check_range(self._names, partition, 0, 0)
        import redis  # the optional extra; imported only when a Redis source is used

        for _ in range(_APPEND_RETRIES):
            offset = self.end_offset(partition)
            try:
                self._redis.xadd(self._key(partition), {_FIELD: bytes(payload)}, id=f"0-{offset + 1}")
                return offset
            except redis.ResponseError as exc:
                if "equal or smaller" not in str(exc):
                    raise
                # another producer took this offset first; read the new end and try the next one
        raise InvalidShardRequestError(f"could not append to {partition!r} after {_APPEND_RETRIES} contended attempts")
