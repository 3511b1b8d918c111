"""The in-memory StreamSource passes the StreamSource contract; sync and read helpers."""

from __future__ import annotations

import pytest

from dlrover.common import ConfigError, ManualClock
from dlrover.shard import DatasetSpec, IndexSource, InvalidShardRequestError, Shard, ShardManager, StreamPartitions
from dlrover.shard.stream import InMemoryStreamSource, read_shard, sync_stream

from .stream_contract import StreamSourceContract


class TestInMemoryStreamSource(StreamSourceContract):
    @pytest.fixture
    def source(self) -> InMemoryStreamSource:
        return InMemoryStreamSource(["p0", "p1"])


def test_construction_and_helpers_refuse_bad_input() -> None:
    with pytest.raises(ConfigError, match="unique"):
        InMemoryStreamSource(["a", "a"])
    src = InMemoryStreamSource(["p0"])
    with pytest.raises(InvalidShardRequestError, match="not a stream"):
        sync_stream(src, ShardManager(DatasetSpec(name="i", source=IndexSource(3), batch_size=1), ManualClock()))
    other = DatasetSpec(name="s", source=StreamPartitions(["p9"]), batch_size=1, num_epochs=None)
    with pytest.raises(InvalidShardRequestError, match=r"\['p9'\]"):
        sync_stream(src, ShardManager(other, ManualClock()))
    with pytest.raises(InvalidShardRequestError, match="not a stream shard"):
        read_shard(src, Shard("i", 0, 0, 0, 1))
    with pytest.raises(InvalidShardRequestError, match="returned 0"):
        read_shard(src, Shard("s", 0, 0, 0, 2, partition="p0"))


def test_an_exactly_once_stream_shard_resumes_after_its_acknowledged_records() -> None:
    from dlrover.shard import DeliveryMode

    src = InMemoryStreamSource(["p0"])
    for i in range(4):
        src.append("p0", b"%d" % i)
    spec = DatasetSpec(
        name="s", source=StreamPartitions(["p0"]), batch_size=4, num_epochs=None, delivery=DeliveryMode.EXACTLY_ONCE
    )
    m = ShardManager(spec, ManualClock())
    sync_stream(src, m)
    shard = m.fetch("a").shards[0]
    m.report_progress("a", shard.shard_id, 3)
    m.remove_worker("a")
    again = m.fetch("b").shards[0]
    assert [r.payload for r in read_shard(src, again)] == [b"3"]
