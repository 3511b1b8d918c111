"""Reading the records of a record-file shard (one record per line).

LINE units: a shard is a range of line numbers; the reader scans to the first one.
BYTE units: a shard is a byte range, and a record belongs to the shard that holds its first
byte: the reader skips the partial line at the start of its range (the previous shard reads it
to its end) and reads the last line past its range's end. So byte-range shards need no line
counts up front and still give every line to exactly one shard. Under exactly-once, acknowledge
the byte offset of the next unread record (`RecordRef.next_offset - shard.start`), which is
always a record boundary.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs

from dlrover.shard.config import RecordFileSource, RecordUnit
from dlrover.shard.errors import InvalidShardRequestError
from dlrover.shard.shard import Shard
from dlrover.shard.splitter import record_segments

__all__ = ["RecordRef", "read_lines", "read_byte_range", "read_shard_records"]


@attrs.frozen
class RecordRef:
    """One record read from a file.

    Attributes:
        path: the file.
        offset: line number (LINE units) or byte offset (BYTE units) of the record in its file.
        next_offset: where the next record starts, in the same unit.
        data: the record without its line ending.
    """

    path: str
    offset: int
    next_offset: int
    data: bytes


def read_lines(path: str, start: int, end: int) -> Iterator[RecordRef]:
    """Lines number `start` to `end - 1` of `path` (0-based).

    Raises:
        InvalidShardRequestError: the file has fewer than `end` lines.
    """
    with Path(path).open("rb") as f:
        number = 0
        for line in f:
            if number >= end:
                return
            if number >= start:
                yield RecordRef(path, number, number + 1, line.rstrip(b"\r\n"))
            number += 1
    if number < end:
        raise InvalidShardRequestError(f"{path!r} has {number} lines; the shard needs lines up to {end}")


def read_byte_range(path: str, start: int, end: int) -> Iterator[RecordRef]:
    """The lines of `path` whose first byte lies in [start, end)."""
    with Path(path).open("rb") as f:
        if start > 0:
            f.seek(start - 1)
            f.readline()  # finish the line that began before `start`; it belongs to the previous range
        pos = f.tell()
        while pos < end:
            line = f.readline()
            if not line:
                return
            yield RecordRef(path, pos, pos + len(line), line.rstrip(b"\r\n"))
            pos += len(line)


def read_shard_records(source: RecordFileSource, shard: Shard) -> Iterator[RecordRef]:
    """The records of a record-file shard not yet consumed, in order (shuffle_samples is not applied).

    Raises:
        InvalidShardRequestError: the shard lies outside the source, or a file is shorter than
            its declared size.
    """
    if shard.order_seed is not None:
        raise InvalidShardRequestError(
            f"shard {shard.shard_id} shuffles its samples; read records by index with read_lines instead"
        )
    first = shard.start + shard.consumed
    if first >= shard.end:
        return
    for path, lo, hi in record_segments(source, first, shard.end):
        if source.unit is RecordUnit.LINE:
            yield from read_lines(path, lo, hi)
        else:
            yield from read_byte_range(path, lo, hi)
