"""The data state a sampler saves: its acknowledgements packed in one string (version 3), and the
list of version 2 still read."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError, SystemClock
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardRegistry
from dlrover.shard._data_state import acknowledged_in, make_state, pack_acknowledged, unpack_acknowledged

torch_data = pytest.importorskip("dlrover.shard.torch_data")

_INT64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(st.tuples(_INT64, _INT64, st.booleans()), max_size=50))
def test_packed_acknowledgements_read_back_as_written(entries: list[tuple[int, int, bool]]) -> None:
    packed = pack_acknowledged(entries)
    assert isinstance(packed, str)
    assert unpack_acknowledged(packed) == entries
    assert acknowledged_in({"acknowledged": packed}) == entries


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not base64!", "not base64"),
        (base64.b64encode(b"\0" * 25).decode(), "not whole"),
        (base64.b64encode((1).to_bytes(8, "little") * 2 + (7).to_bytes(8, "little")).decode(), "done=7"),
        ("é", "not base64"),
    ],
)
def test_a_bad_packed_string_is_refused_by_name(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        unpack_acknowledged(text)


def test_a_state_of_the_list_form_restores_as_the_packed_one_does() -> None:
    registry = ShardRegistry(SystemClock())
    spec = DatasetSpec(
        name="ds", source=IndexSource(24), batch_size=2, batches_per_shard=2, delivery=DeliveryMode.EXACTLY_ONCE
    )
    registry.register(spec)
    first, second = registry.fetch("ds", "w0", 2).shards
    document = registry.checkpoint("ds")
    acks = [(first.shard_id, 4, True), (second.shard_id, 2, False)]
    fmt = torch_data.STATE_FORMAT
    newest = make_state(fmt, torch_data.STATE_VERSION, "ds", document, acks)
    older = make_state(fmt, 2, "ds", document, acks, packed=False)
    assert isinstance(newest["acknowledged"], str)
    assert older["acknowledged"] == [[first.shard_id, 4, True], [second.shard_id, 2, False]]
    assert torch_data._check_state(newest, "ds") == torch_data._check_state(older, "ds") != document
