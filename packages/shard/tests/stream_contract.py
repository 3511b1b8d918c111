"""The `StreamSource` contract: a mixin every implementation's test class inherits.

A subclass provides a `source` fixture returning a fresh, empty source with partitions
["p0", "p1"]. Kept out of `test_*` names so pytest collects it only through its subclasses.
"""

from __future__ import annotations

import pytest

from dlrover.common import ManualClock
from dlrover.shard import DatasetSpec, InvalidShardRequestError, ShardManager, StreamPartitions
from dlrover.shard.stream import StreamSource, read_shard, sync_stream


class StreamSourceContract:
    def test_is_a_stream_source(self, source: StreamSource) -> None:
        assert isinstance(source, StreamSource)
        assert source.partitions() == ["p0", "p1"]

    def test_empty_partitions_end_at_zero_and_read_nothing(self, source: StreamSource) -> None:
        assert source.end_offset("p0") == 0
        assert source.read("p0", 0, 10) == []

    def test_appends_get_dense_offsets_per_partition(self, source: StreamSource) -> None:
        assert [source.append("p0", b"a%d" % i) for i in range(3)] == [0, 1, 2]
        assert source.append("p1", b"x") == 0
        assert (source.end_offset("p0"), source.end_offset("p1")) == (3, 1)

    def test_read_returns_exactly_the_range_in_order_with_bytes_intact(self, source: StreamSource) -> None:
        payloads = [bytes([i, 0, 255]) + b"\n" for i in range(6)]
        for p in payloads:
            source.append("p0", p)
        got = source.read("p0", 2, 5)
        assert [(r.partition, r.offset, r.payload) for r in got] == [("p0", i, payloads[i]) for i in range(2, 5)]
        assert [r.offset for r in source.read("p0", 4, 100)] == [4, 5]
        assert source.read("p0", 3, 3) == []
        assert source.read("p0", 5, 2) == []

    def test_bad_partitions_and_offsets_are_refused(self, source: StreamSource) -> None:
        with pytest.raises(InvalidShardRequestError, match="unknown partition 'zz'"):
            source.read("zz", 0, 1)
        with pytest.raises(InvalidShardRequestError, match="unknown partition"):
            source.append("zz", b"")
        with pytest.raises(InvalidShardRequestError, match="negative"):
            source.read("p0", -1, 1)

    def test_a_stream_dataset_reads_every_record_exactly_once(self, source: StreamSource) -> None:
        spec = DatasetSpec(name="s", source=StreamPartitions(["p0", "p1"]), batch_size=2, num_epochs=None)
        manager = ShardManager(spec, ManualClock())
        got: list[tuple[str, int]] = []
        for round_ in range(3):
            for i in range(5):
                source.append("p0", b"%d" % (round_ * 5 + i))
            source.append("p1", b"q")
            sync_stream(source, manager)
            while (res := manager.fetch("w", 2)).shards:
                for shard in res.shards:
                    got.extend((r.partition, r.offset) for r in read_shard(source, shard))
                    manager.report_done("w", shard.shard_id)
        assert sorted(got) == sorted([("p0", i) for i in range(15)] + [("p1", i) for i in range(3)])
