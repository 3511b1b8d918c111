"""Splitters: where each shard of a bounded source begins and ends.

A bounded source (index range or record files) is a line of units [0, total); a splitter cuts
it into `num_shards` contiguous ranges, numbered in source order. The shard manager shuffles
the numbers, not the ranges, so a splitter is a few integers or one array, never a list of
objects: a million shards cost eight bytes each.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Protocol

from dlrover.shard.config import DatasetSpec, IndexSource, RecordFileSource
from dlrover.shard.errors import InvalidShardRequestError

__all__ = ["Splitter", "RangeSplitter", "BoundarySplitter", "make_splitter", "record_segments", "Segment"]

Segment = tuple[str, int, int]


class Splitter(Protocol):
    """Bounds of the shards of a bounded source."""

    @property
    def num_shards(self) -> int:
        """How many shards one epoch has."""
        ...

    @property
    def total_units(self) -> int:
        """Units in the whole source."""
        ...

    def bounds(self, index: int) -> tuple[int, int]:
        """[start, end) of shard `index` (0 <= index < num_shards)."""
        ...


class RangeSplitter:
    """Equal shards of `shard_units` over [0, total_units); the last may be shorter.

    Args:
        total_units: units in the source.
        shard_units: units per shard.
    """

    def __init__(self, total_units: int, shard_units: int) -> None:
        self._total = total_units
        self._size = shard_units
        self._count = -(-total_units // shard_units)

    @property
    def num_shards(self) -> int:
        """How many shards one epoch has."""
        return self._count

    @property
    def total_units(self) -> int:
        """Units in the whole source."""
        return self._total

    def bounds(self, index: int) -> tuple[int, int]:
        """[start, end) of shard `index`."""
        start = index * self._size
        return start, min(start + self._size, self._total)


class BoundarySplitter:
    """Shards that start at given offsets (used so shards end with their file).

    Args:
        starts: ascending start offsets, the first 0.
        total_units: the end of the last shard.
    """

    def __init__(self, starts: array[int], total_units: int) -> None:
        self._starts = starts
        self._total = total_units

    @property
    def num_shards(self) -> int:
        """How many shards one epoch has."""
        return len(self._starts)

    @property
    def total_units(self) -> int:
        """Units in the whole source."""
        return self._total

    def bounds(self, index: int) -> tuple[int, int]:
        """[start, end) of shard `index`."""
        end = self._starts[index + 1] if index + 1 < len(self._starts) else self._total
        return self._starts[index], end


def make_splitter(spec: DatasetSpec) -> Splitter:
    """The splitter of a bounded dataset.

    Raises:
        InvalidShardRequestError: the dataset is a stream (streams are cut as data arrives).
    """
    source = spec.source
    if isinstance(source, IndexSource):
        return RangeSplitter(source.num_samples, spec.shard_units)
    if isinstance(source, RecordFileSource):
        total = sum(f.size for f in source.files)
        if source.cross_file_boundaries:
            return RangeSplitter(total, spec.shard_units)
        starts: array[int] = array("q")
        offset = 0
        for f in source.files:
            starts.extend(range(offset, offset + f.size, spec.shard_units))
            offset += f.size
        return BoundarySplitter(starts, total)
    raise InvalidShardRequestError(f"dataset {spec.name!r} is a stream; it has no fixed splitter")


def record_segments(source: RecordFileSource, start: int, end: int) -> list[Segment]:
    """Map a global range of a record file source to (path, local_start, local_end) pieces.

    A shard that does not cross file boundaries maps to one piece.

    Raises:
        InvalidShardRequestError: the range is empty or outside the source.
    """
    total = sum(f.size for f in source.files)
    if not 0 <= start < end <= total:
        raise InvalidShardRequestError(f"range [{start}, {end}) is outside the record files' 0..{total}")
    offsets = [0]
    for f in source.files:
        offsets.append(offsets[-1] + f.size)
    pieces: list[Segment] = []
    i = bisect_right(offsets, start) - 1
    pos = start
    while pos < end:
        file_end = offsets[i + 1]
        stop = min(end, file_end)
        pieces.append((source.files[i].path, pos - offsets[i], stop - offsets[i]))
        pos = stop
        i += 1
    return pieces
