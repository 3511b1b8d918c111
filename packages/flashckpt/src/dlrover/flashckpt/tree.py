"""Flatten a nested training state into tensor leaves and a JSON tree, and build it back.

The tree is pure JSON, so a checkpoint can be read without this package and loading never executes
code from data (no pickle). Every node is a JSON object with exactly one key, naming its kind:

==================  ===========================================================================
node                meaning
==================  ===========================================================================
``{"dict": [[k, v], ...]}``  a mapping; keys and values are nodes, insertion order kept
``{"list": [...]}``          a list
``{"tuple": [...]}``         a tuple (a namedtuple is rebuilt only when restoring into one)
``{"tensor": i}``            a ``torch.Tensor``; ``i`` indexes the manifest's tensor table
``{"ndarray": i}``           a ``numpy.ndarray`` stored like a tensor (NumPy RNG states hold these)
``{"none": null}``           ``None``
``{"bool": b}``              a bool
``{"int": n}``               an int (JSON integers have no size limit in Python)
``{"float": x}``             a float; ``"nan"``, ``"inf"`` and ``"-inf"`` as strings, others exact
``{"str": s}``               a str
``{"bytes": "<base64>"}``    bytes
``{"size": [...]}``          a ``torch.Size``
``{"dtype": "float32"}``     a ``torch.dtype``
==================  ===========================================================================

A tensor that is an exact alias of an earlier one (tied weights: the same memory seen with the same
dtype, shape, strides and offset) is stored once, and both places in the tree name its index, as
``torch.save`` keeps them; a fresh load rebuilds them as one tensor. Views that overlap without being
identical (a slice of another tensor) are stored once each.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import torch

from dlrover.flashckpt.errors import StateStructureError

__all__ = ["MAX_DEPTH", "FlatState", "TensorLeaf", "alias_key", "build_tree", "flatten_state", "path_name"]

JsonNode = dict[str, Any]


@attrs.frozen
class TensorLeaf:
    """One tensor of a flattened state.

    Attributes:
        path: the keys leading to the tensor, for messages and readable file names.
        tensor: the tensor itself (a NumPy array is viewed as a CPU tensor).
        is_ndarray: whether the leaf was a NumPy array and is rebuilt as one.
    """

    path: tuple[Any, ...]
    tensor: torch.Tensor
    is_ndarray: bool = False


@attrs.frozen
class FlatState:
    """A state split into its JSON tree and its tensor leaves, in tree order.

    Attributes:
        tree: the JSON tree.
        leaves: the tensors, indexed as the tree's ``tensor`` and ``ndarray`` nodes name them.
        negative_zero: some float of the tree (a value or a key) is ``-0.0``. It equals ``0.0``,
            yet encodes differently, so equal trees encode to the same JSON only when neither
            holds one (see `dlrover.flashckpt.layout.TreeJsonMemo`).
    """

    tree: JsonNode
    leaves: tuple[TensorLeaf, ...]
    negative_zero: bool = False


def path_name(path: tuple[Any, ...]) -> str:
    """A readable name for a leaf path, e.g. ``model/layer.weight`` or ``optim/state/0/exp_avg``."""
    return "/".join(_part_name(p) for p in path) if path else "<root>"


def _part_name(part: Any) -> str:
    # An int too long for str() (a refused key) is named by its size.
    if isinstance(part, int) and part.bit_length() > _MAX_INT_BITS:
        return f"<int of {part.bit_length()} bits>"
    return str(part)


def _encode_float(value: float) -> JsonNode:
    if math.isnan(value):
        return {"float": "nan"}
    if math.isinf(value):
        return {"float": "inf" if value > 0 else "-inf"}
    return {"float": float(value)}


# Checked in order: bool before int (bool is an int), torch.Size before any tuple handling.
_ENCODERS: tuple[tuple[type | tuple[type, ...], Any], ...] = (
    (type(None), lambda v: {"none": None}),
    (bool, lambda v: {"bool": v}),
    (int, lambda v: {"int": int(v)}),
    (float, _encode_float),
    (str, lambda v: {"str": str.__str__(v)}),  # the value itself: a subclass's __eq__ or __str__ may differ
    ((bytes, bytearray), lambda v: {"bytes": base64.b64encode(bytes(v)).decode("ascii")}),
    (torch.Size, lambda v: {"size": [int(d) for d in v]}),
    (torch.dtype, lambda v: {"dtype": str(v).removeprefix("torch.")}),
)


# Exact types the walk encodes without the ordered isinstance chain (subclasses take the chain).
_FAST_SCALARS: dict[type, Any] = {
    type(None): lambda v: {"none": None},
    bool: lambda v: {"bool": v},
    float: _encode_float,
    str: lambda v: {"str": v},
}

# Every state `flatten_state` accepts must encode to JSON and parse back in any process (the
# stager encodes its manifest while the copy runs, when the slot can no longer be left as it was):
# Python parses ints of up to 4300 digits by default, and its JSON encoder recurses per level.
MAX_DEPTH = 100
"""The deepest nesting of containers a state may have."""
_MAX_INT_BITS = 14_000  # 4214 decimal digits


def _encode_scalar(value: Any, path: tuple[Any, ...]) -> JsonNode:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
        raise StateStructureError(
            f"int of {value.bit_length()} bits at {path_name(path)!r} cannot be checkpointed: "
            f"ints of up to {_MAX_INT_BITS} bits (4214 digits) can"
        )
    for types, encode in _ENCODERS:
        if isinstance(value, types):
            node: JsonNode = encode(value)
            return node
    raise StateStructureError(
        f"unsupported leaf of type {type(value).__qualname__} at {path_name(path)!r}: "
        "only tensors, ndarrays, dicts, lists, tuples, None, bool, int, float, str, bytes, "
        "torch.Size and torch.dtype can be checkpointed"
    )


def alias_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two tensors the same values in the same memory, or None when it cannot be told.

    Equal keys mean one tensor's bytes are the other's: same device, memory, offset, shape,
    strides, dtype and conjugate/negative bits. Empty tensors, meta tensors and tensors without
    a plain storage (wrapper subclasses) never alias.
    """
    ptr = _address(tensor)
    if ptr == 0 or tensor.numel() == 0:
        return None
    return (tensor.device, ptr, tensor.shape, tensor.stride(), tensor.dtype, tensor.is_conj(), tensor.is_neg())


def _address(tensor: torch.Tensor) -> int:
    """The first element's address (storage and offset in one call: `untyped_storage()` builds a
    Python object each time), or 0 where a tensor has none: meta tensors answer 0, and tensors
    without a plain storage (wrapper subclasses) raise, which is their answer."""
    try:
        return int(tensor.data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


def flatten_state(state: Any) -> FlatState:
    """Split `state` into a JSON tree and its tensor leaves.

    Args:
        state: nested dicts (any key of a supported scalar type), lists and tuples whose leaves are
            tensors, NumPy arrays or scalars listed in the module docstring.

    Returns:
        The tree and the leaves, leaves in depth-first order; an exact alias of an earlier tensor
        (see `alias_key`) adds no leaf, its tree node names the earlier leaf's index.

    Raises:
        StateStructureError: a leaf has an unsupported type or value (a sparse or nested tensor,
            an int of over 14,000 bits), a structure is cyclic or nests deeper than `MAX_DEPTH`;
            the message names the path.
    """
    leaves: list[TensorLeaf] = []
    by_address: dict[int, list[tuple[torch.Tensor, int]]] = {}
    active: set[int] = set()
    negative_zero = False

    def scalar(node: JsonNode) -> JsonNode:
        nonlocal negative_zero
        negative_zero = negative_zero or _holds_negative_zero(node)
        return node

    # A save walks the whole state before its copy can start, so this walk is on the blocking
    # path: the common types are tested by exact type first (an isinstance against the Mapping
    # ABC, or the chain of scalar encoders, costs several times more per node).
    def visit(obj: Any, path: tuple[Any, ...]) -> JsonNode:
        kind = type(obj)
        if kind is torch.Tensor or isinstance(obj, torch.Tensor):
            return visit_tensor(obj, kind, path)
        if kind is dict or kind is list or kind is tuple:
            return visit_container(obj, kind, path)
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise StateStructureError(f"object ndarray at {path_name(path)!r} cannot be checkpointed")
            leaves.append(TensorLeaf(path, torch.from_numpy(np.ascontiguousarray(obj)), is_ndarray=True))
            return {"ndarray": len(leaves) - 1}
        if isinstance(obj, Mapping | list | tuple) and not isinstance(obj, torch.Size):
            return visit_container(
                obj, dict if isinstance(obj, Mapping) else list if isinstance(obj, list) else tuple, path
            )
        if kind is int and obj.bit_length() <= _MAX_INT_BITS:
            return {"int": obj}
        fast = _FAST_SCALARS.get(kind)
        return scalar(fast(obj) if fast is not None else _encode_scalar(obj, path))

    def visit_tensor(obj: torch.Tensor, kind: type, path: tuple[Any, ...]) -> JsonNode:
        if obj.layout is not torch.strided or obj.is_nested:
            raise StateStructureError(
                f"{'nested' if obj.is_nested else obj.layout} tensor at {path_name(path)!r} cannot be "
                "checkpointed: only dense (strided) tensors can; convert it first (e.g. to_dense())"
            )
        # Tensors are bucketed by address, and full alias keys are compared only within a
        # bucket: most tensors have an address of their own, and a key costs ten calls.
        address = _address(obj)
        if address:
            bucket = by_address.setdefault(address, [])
            if bucket:
                key = alias_key(obj)
                for earlier, index in bucket:
                    if key is not None and alias_key(earlier) == key:
                        return {"tensor": index}
            bucket.append((obj, len(leaves)))
        # Detaching makes a new tensor object; one outside autograd is copied as it is.
        plain = obj if kind is torch.Tensor and not obj.requires_grad else obj.detach()
        leaves.append(TensorLeaf(path, plain))
        return {"tensor": len(leaves) - 1}

    def visit_container(obj: Any, kind: type, path: tuple[Any, ...]) -> JsonNode:
        if len(path) >= MAX_DEPTH:
            raise StateStructureError(f"the state nests deeper than {MAX_DEPTH} levels at {path_name(path)!r}")
        if id(obj) in active:
            raise StateStructureError(f"cyclic structure at {path_name(path)!r}")
        active.add(id(obj))
        try:
            if kind is dict:
                return {
                    "dict": [
                        [{"str": k} if type(k) is str else scalar(_encode_key(k, path)), visit(v, (*path, k))]
                        for k, v in obj.items()
                    ]
                }
            children = [visit(v, (*path, i)) for i, v in enumerate(obj)]
            return {"list": children} if kind is list else {"tuple": children}
        finally:
            active.discard(id(obj))

    tree = visit(state, ())
    return FlatState(tree, tuple(leaves), negative_zero)


def _holds_negative_zero(node: JsonNode) -> bool:
    """Whether a scalar node (a tuple of scalars, as a dict key, included) holds ``-0.0``."""
    value = node.get("float")
    if type(value) is float:
        return value == 0.0 and math.copysign(1.0, value) < 0
    items = node.get("tuple")
    return items is not None and any(_holds_negative_zero(item) for item in items)


def _encode_key(key: Any, path: tuple[Any, ...]) -> JsonNode:
    if isinstance(key, tuple):
        return {"tuple": [_encode_key(k, path) for k in key]}
    return _encode_scalar(key, (*path, key))


def _decode_float(value: Any) -> float | None:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _decode_dtype(value: Any) -> torch.dtype | None:
    dtype = getattr(torch, value, None) if isinstance(value, str) else None
    return dtype if isinstance(dtype, torch.dtype) else None


_INVALID = object()

# Each decoder returns the value, or _INVALID when the node's payload has the wrong type.
_DECODERS: dict[str, Any] = {
    "none": lambda v: None if v is None else _INVALID,
    "bool": lambda v: v if isinstance(v, bool) else _INVALID,
    "int": lambda v: v if isinstance(v, int) and not isinstance(v, bool) else _INVALID,
    "float": lambda v: _INVALID if (f := _decode_float(v)) is None else f,
    "str": lambda v: v if isinstance(v, str) else _INVALID,
    "bytes": lambda v: base64.b64decode(v.encode("ascii"), validate=True) if isinstance(v, str) else _INVALID,
    "size": lambda v: torch.Size(int(d) for d in v) if isinstance(v, list) else _INVALID,
    "dtype": lambda v: _INVALID if (d := _decode_dtype(v)) is None else d,
    "tuple": lambda v: tuple(decode_scalar(x) for x in v) if isinstance(v, list) else _INVALID,
}


def decode_scalar(node: JsonNode) -> Any:
    """Decode a non-container, non-tensor node (a tuple of scalars, as a dict key, included).

    Raises:
        StateStructureError: the node is not a known scalar node.
    """
    if not isinstance(node, dict) or len(node) != 1:
        raise StateStructureError(f"malformed tree node {node!r}: expected an object with one key")
    ((kind, value),) = node.items()
    decoder = _DECODERS.get(kind)
    try:
        result = _INVALID if decoder is None else decoder(value)
    except (ValueError, TypeError):  # bad base64, non-integer sizes
        result = _INVALID
    if result is _INVALID:
        raise StateStructureError(f"malformed tree node {node!r}")
    return result


def build_tree(node: JsonNode, tensors: list[torch.Tensor], ndarray_as_numpy: bool = True) -> Any:
    """Rebuild a state from its tree and its tensors (indexed as in the tree).

    Args:
        node: the JSON tree produced by `flatten_state`.
        tensors: the tensor of each leaf index.
        ndarray_as_numpy: rebuild ``ndarray`` leaves as NumPy arrays (sharing memory with the tensor).

    Raises:
        StateStructureError: the tree is malformed or references a missing tensor.
    """
    if not isinstance(node, dict) or len(node) != 1:
        raise StateStructureError(f"malformed tree node {node!r}: expected an object with one key")
    ((kind, value),) = node.items()
    if kind == "dict":
        return {decode_scalar(k): build_tree(v, tensors, ndarray_as_numpy) for k, v in value}
    if kind == "list":
        return [build_tree(v, tensors, ndarray_as_numpy) for v in value]
    if kind == "tuple" and isinstance(value, list):
        return tuple(build_tree(v, tensors, ndarray_as_numpy) for v in value)
    if kind in ("tensor", "ndarray"):
        if not isinstance(value, int) or not 0 <= value < len(tensors):
            raise StateStructureError(f"tree references tensor {value!r} but only {len(tensors)} exist")
        t = tensors[value]
        return t.numpy() if kind == "ndarray" and ndarray_as_numpy else t
    return decode_scalar(node)
