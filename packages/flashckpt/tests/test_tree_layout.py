"""The JSON tree encoding and the slot header: exact round trips and clear errors."""

from __future__ import annotations

import json
import math
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch
from flashckpt_testlib import same_bits

from dlrover.flashckpt.errors import LayoutError, StateStructureError
from dlrover.flashckpt.layout import ALIGN, SlotHeader, SlotState, decode_manifest, encode_manifest
from dlrover.flashckpt.planner import plan_layout
from dlrover.flashckpt.restore import apply_values, match_targets
from dlrover.flashckpt.tree import build_tree, decode_scalar, flatten_state


def test_scalars_and_keys_round_trip_through_json() -> None:
    state = {
        (1, "a"): None,
        0: [True, 2**80, -0.0, math.inf, -math.inf, math.nan, "s", b"\x00\xff"],
        "size": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "t": (1, (2.5,)),
    }
    flat = flatten_state(state)
    tree = json.loads(json.dumps(flat.tree, allow_nan=False))  # pure JSON, no NaN tokens
    rebuilt = build_tree(tree, [])
    assert same_bits(state, rebuilt)
    assert isinstance(rebuilt["size"], torch.Size)


def test_unsupported_and_cyclic_states_are_refused() -> None:
    with pytest.raises(StateStructureError, match="set at 'a/b'"):
        flatten_state({"a": {"b": {1, 2}}})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(StateStructureError, match="cyclic"):
        flatten_state({"x": loop})
    with pytest.raises(StateStructureError, match="object ndarray"):
        flatten_state({"o": np.array([object()])})
    with pytest.raises(StateStructureError, match="malformed"):
        decode_scalar({"int": "7"})


def test_restore_keeps_container_types() -> None:
    Point = namedtuple("Point", "x y")
    saved = OrderedDict(p=Point(torch.ones(2), 5), n=[1, 2])
    flat = flatten_state(saved)
    specs = plan_layout(flat, 0).specs
    target = OrderedDict(p=Point(torch.zeros(2), 0), n=[0, 0])
    tensors = match_targets(target, flat.tree, specs)
    for dst, leaf in zip(tensors, flat.leaves, strict=True):
        dst.copy_(leaf.tensor)
    out = apply_values(target, flat.tree)
    assert out is target
    assert isinstance(out["p"], Point)
    assert out["p"].y == 5
    assert out["n"] == [1, 2]
    assert torch.equal(out["p"].x, torch.ones(2))


def test_layout_offsets_are_aligned_and_manifest_round_trips() -> None:
    flat = flatten_state({"a": torch.ones(3, dtype=torch.int8), "b": torch.ones(5), "c": torch.tensor(1.0)})
    layout = plan_layout(flat, 100)
    assert all(s.offset % ALIGN == 0 for s in layout.specs)
    assert layout.data_off % 4096 == 0
    raw = encode_manifest(flat.tree, layout.specs)
    tree, specs = decode_manifest(raw)
    assert specs == layout.specs
    assert tree == flat.tree
    with pytest.raises(LayoutError, match="checksum"):
        decode_manifest(raw, expected_crc=1)
    with pytest.raises(LayoutError, match="not a flashckpt slot manifest"):
        decode_manifest(b"[1]")


def test_header_round_trip_and_rejects_garbage() -> None:
    h = SlotHeader(SlotState.SEALED, 7, 42, 10, 99, 3, 8192, 12288, 4096, 16384)
    assert SlotHeader.unpack(h.pack()) == h
    with pytest.raises(LayoutError, match="magic"):
        SlotHeader.unpack(b"X" * 128)
    bad_state = bytearray(h.pack())
    bad_state[12] = 9
    with pytest.raises(LayoutError, match="state 9"):
        SlotHeader.unpack(bytes(bad_state))
    with pytest.raises(LayoutError, match="inconsistent"):
        SlotHeader.unpack(SlotHeader(SlotState.COMPLETE, 1, 1, 10, 0, 1, 8192, 12288, 8192, 16384).pack())
