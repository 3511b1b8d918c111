"""The JSON tree encoding and the slot header: exact round trips and clear errors."""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch
from flashckpt_testlib import same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover.flashckpt.errors import LayoutError, StateStructureError
from dlrover.flashckpt.layout import ALIGN, SlotHeader, SlotState, TreeJsonMemo, decode_manifest, encode_manifest
from dlrover.flashckpt.planner import plan_layout
from dlrover.flashckpt.restore import apply_values, match_targets, tie_conflicts
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


def test_subclasses_encode_as_their_base_types_and_leaves_leave_autograd() -> None:
    class Colour(enum.IntEnum):
        RED = 3

    class Name(str):
        pass

    weight = torch.nn.Parameter(torch.ones(2))
    computed = weight * 2  # part of a graph
    plain = torch.zeros(3)
    state = OrderedDict([(Name("k"), Colour.RED), ("f", np.float64(0.5)), ("p", weight), ("g", computed), ("t", plain)])
    flat = flatten_state(state)
    assert flat.tree == {
        "dict": [
            [{"str": "k"}, {"int": 3}],
            [{"str": "f"}, {"float": 0.5}],
            [{"str": "p"}, {"tensor": 0}],
            [{"str": "g"}, {"tensor": 1}],
            [{"str": "t"}, {"tensor": 2}],
        ]
    }
    assert type(flat.tree["dict"][0][1]["int"]) is int
    leaves = [leaf.tensor for leaf in flat.leaves]
    assert [t.requires_grad for t in leaves] == [False, False, False]
    assert type(leaves[0]) is torch.Tensor  # a Parameter is stored as the plain tensor it holds
    assert leaves[0].data_ptr() == weight.data_ptr()
    assert leaves[2] is plain  # outside autograd already: no new tensor object is made


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
    plan = match_targets(target, flat.tree, specs)
    for (dst,), leaf in zip(plan.places, flat.leaves, strict=True):
        dst.copy_(leaf.tensor)
    out = apply_values(target, flat.tree)
    assert out is target
    assert isinstance(out["p"], Point)
    assert out["p"].y == 5
    assert out["n"] == [1, 2]
    assert torch.equal(out["p"].x, torch.ones(2))


def test_exact_aliases_are_one_leaf_and_other_views_are_not() -> None:
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight  # tied, as language models tie their input and output embeddings
    base = torch.arange(12.0).reshape(3, 4)
    cplx = torch.ones(2, dtype=torch.complex64)
    state = {
        "emb": emb.state_dict()["weight"],  # state_dict() detaches: new objects, same memory
        "head": head.state_dict()["weight"],
        "same": base,
        "again": base,
        "slice": base[1:],  # overlaps `base` but is not it
        "t": base.t(),  # same memory, other strides
        "bytes": base.view(torch.int32),  # same memory, other dtype
        "c": cplx,
        "conj": cplx.conj(),  # same memory, conjugate bit
        "e1": torch.empty(0),
        "e2": torch.empty(0),
    }
    flat = flatten_state(state)
    index = {key: node["tensor"] for key_node, node in flat.tree["dict"] for key in [decode_scalar(key_node)]}
    assert index["emb"] == index["head"] == 0
    assert index["same"] == index["again"] == 1
    distinct = [index[k] for k in ("same", "slice", "t", "bytes", "c", "conj", "e1", "e2")]
    assert len(set(distinct)) == len(distinct)
    assert len(flat.leaves) == 1 + len(distinct)
    assert [leaf.path for leaf in flat.leaves][:2] == [("emb",), ("same",)]
    # A fresh rebuild keeps the ties: one tensor at both places.
    rebuilt = build_tree(flat.tree, [leaf.tensor.clone() for leaf in flat.leaves])
    assert rebuilt["emb"] is rebuilt["head"]
    assert rebuilt["same"] is rebuilt["again"]
    assert rebuilt["same"] is not rebuilt["slice"]


def test_restoring_ties_into_tied_and_untied_states() -> None:
    w = torch.arange(6.0)
    saved = {"a": w, "b": w}
    flat = flatten_state(saved)
    specs = plan_layout(flat, 0).specs
    assert len(specs) == 1
    # Into a state that keeps the tie: its memory is written once.
    tied = torch.zeros(6)
    plan = match_targets({"a": tied, "b": tied.detach()}, flat.tree, specs)
    assert (plan.places, plan.shadowed) == ([[tied]], ())
    # Into a state whose tensors are apart: each place is written.
    a, b = torch.zeros(6), torch.zeros(6)
    (places,) = match_targets({"a": a, "b": b}, flat.tree, specs).places
    assert [p is t for p, t in zip(places, (a, b), strict=True)] == [True, True]
    # A snapshot that stored tied tensors apart: the first in tree order writes the shared memory.
    untied = flatten_state({"a": torch.ones(6), "b": torch.full((6,), 2.0)})
    untied_specs = plan_layout(untied, 0).specs
    plan = match_targets({"a": tied, "b": tied}, untied.tree, untied_specs)
    assert (plan.places, plan.shadowed) == ([[tied], []], ((1, 0),))
    # ... and says so when the values it did not keep differ from those it kept.
    assert tie_conflicts(plan, untied_specs, lambda j, i: False) is None
    conflict = tie_conflicts(plan, untied_specs, lambda j, i: True)
    assert conflict is not None
    assert "'b' (kept 'a')" in conflict
    # A tensor of the snapshot with no place at all is still refused.
    with pytest.raises(StateStructureError, match="no place"):
        match_targets(
            {"a": tied, "b": tied},
            {"dict": [[{"str": "a"}, {"tensor": 0}], [{"str": "b"}, {"tensor": 0}]]},
            plan_layout(untied, 0).specs,
        )


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


class _Text(str):
    """A str whose equality and text say something other than its value."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return "other"


def _plain_json(tree: dict[str, object]) -> str:
    return json.dumps(tree, separators=(",", ":"), allow_nan=False)


def test_the_tree_memo_reuses_repeated_entries_and_encodes_what_changed_byte_for_byte() -> None:
    weight = torch.ones(2)
    states = [
        {"model": {"w": weight}, "optim": {"lr": 0.1, "wd": 0.0}, "step": 1},
        {"model": {"w": weight}, "optim": {"lr": 0.1, "wd": 0.0}, "step": 2},
        {"model": {"w": weight}, "optim": {"lr": 0.1, "wd": -0.0}, "step": 3},  # equal, yet not the same text
        {"model": {"w": weight}, "optim": {"lr": 0.1, "wd": 0.0}, "step": 4},
        {"model": {"w": weight}, "optim": {-0.0: "key", (1, -0.0): "tuple key"}, "step": 5},
        {"model": {"w": weight}, "optim": {0.0: "key", (1, 0.0): "tuple key"}, "step": 6},
        {"model": {"w": weight}, "optim": {"name": _Text("value")}, "step": 7},
        {"model": {"w": weight}, "optim": {"name": "value!"}, "step": 8},
        {"model": {"w": weight}, "extra": [np.float64(-0.0)], "step": 9},
        {"model": {"w": weight}, "extra": [np.float64(0.0)], "step": 10},
        {"step": 11},
    ]
    memo = TreeJsonMemo()
    for state in states:
        flat = flatten_state(state)
        assert memo.encode(flat.tree, flat.negative_zero) == _plain_json(flat.tree)
    assert flatten_state({"a": [1, (2, -0.0)]}).negative_zero
    assert flatten_state({(0, -0.0): 1}).negative_zero
    assert not flatten_state({"a": [0.0, 1.5, "-0.0"]}).negative_zero


def test_the_tree_memo_encodes_a_tree_that_is_not_a_mapping_whole() -> None:
    memo = TreeJsonMemo()
    for state in ([1, 2.5], [1, -0.0], (torch.zeros(1), None), {"a": 1}):
        flat = flatten_state(state)
        assert memo.encode(flat.tree, flat.negative_zero) == _plain_json(flat.tree)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, -0.0, 1.0, -1.5, math.inf, math.nan]),
    st.sampled_from(["", "a", "-0.0"]),
)
_KEYS = st.one_of(st.sampled_from(["a", "b"]), st.sampled_from([0, 0.0, -0.0]), st.tuples(st.sampled_from([0.0, -0.0])))
# Small on purpose: consecutive states then often repeat an entry, or differ only in a zero's sign.
_VALUES = st.recursive(
    st.sampled_from([0.0, -0.0, 1]) | _SCALARS,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(_KEYS, inner, max_size=2),
    max_leaves=3,
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["model", "step"]), _VALUES, max_size=2), min_size=2, max_size=8))
def test_the_tree_memo_gives_what_json_gives_for_any_sequence_of_states(states: list[dict[str, object]]) -> None:
    memo = TreeJsonMemo()
    for state in states:
        flat = flatten_state(state)
        assert memo.encode(flat.tree, flat.negative_zero) == _plain_json(flat.tree)
