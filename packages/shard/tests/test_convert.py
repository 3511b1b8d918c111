"""Proto <-> domain conversions keep every field."""

from __future__ import annotations

import pytest

from dlrover.shard import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    InvalidShardRequestError,
    RecordFile,
    RecordFileSource,
    RecordUnit,
    Shard,
    StreamPartitions,
    TaskType,
)
from dlrover.shard.convert import fill_shard_proto, shard_from_proto, shard_to_proto, spec_from_proto, spec_to_proto
from dlrover.shard.progress import spec_from_json, spec_to_json
from dlrover.shard.v1 import shard_pb2 as pb

SPECS = [
    DatasetSpec(name="a", source=IndexSource(10), batch_size=2),
    DatasetSpec(
        name="b",
        source=RecordFileSource([RecordFile("x", 5), RecordFile("y", 7)], RecordUnit.BYTE, 3, True),
        batch_size=2,
        batches_per_shard=3,
        num_epochs=None,
        shuffle=True,
        seed=2**62,
        delivery=DeliveryMode.EXACTLY_ONCE,
        task_type=TaskType.EVALUATION,
        lease_timeout_s=2.5,
        max_attempts=7,
    ),
    DatasetSpec(
        name="c", source=StreamPartitions(["p", "q"]), batch_size=1, num_epochs=None, delivery=DeliveryMode.AT_MOST_ONCE
    ),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_spec_round_trips_through_proto_and_json(spec: DatasetSpec) -> None:
    assert spec_from_proto(spec_to_proto(spec)) == spec
    assert spec_from_json(spec_to_json(spec)) == spec


SHARDS = [
    Shard("d", 3, 1, 4, 8, 2, 99, "", 2),
    Shard("d", 0, 0, 0, 1, partition="p"),
    Shard("d", 5, 0, 10, 20, consumed=7, order_seed=0, partition="q", attempt=3),
]


def test_shard_round_trips() -> None:
    for shard in SHARDS:
        assert shard_from_proto(shard_to_proto(shard)) == shard


def test_shards_filled_into_a_repeated_field_survive_the_wire() -> None:
    response = pb.FetchShardsResponse(finished=False, reason="r")
    for shard in SHARDS:
        fill_shard_proto(response.shards.add(), shard)
    back = pb.FetchShardsResponse.FromString(response.SerializeToString())
    assert [shard_from_proto(m) for m in back.shards] == SHARDS


def test_bad_proto_values_are_invalid_arguments() -> None:
    with pytest.raises(InvalidShardRequestError, match="no source"):
        spec_from_proto(pb.DatasetSpec(name="x", batch_size=1))
    with pytest.raises(InvalidShardRequestError, match="delivery has unknown value 42"):
        spec_from_proto(pb.DatasetSpec(name="x", batch_size=1, index=pb.IndexSource(num_samples=1), delivery=42))  # type: ignore[arg-type]
    with pytest.raises(InvalidShardRequestError, match="batch_size must be a positive integer, got -1"):
        spec_from_proto(pb.DatasetSpec(name="x", batch_size=-1, index=pb.IndexSource(num_samples=1)))
