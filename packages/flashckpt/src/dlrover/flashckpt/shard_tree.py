"""Reading a sharded snapshot's JSON tree without torch: what a node saver needs to know of it.

`ShardedCheckpointer` stages ``{"sharding": <description>, "state": <local state>}``; the
description names, per DTensor (by DCP key), its global shape, its placements and where this
rank's chunk starts in the whole tensor, or ``None`` there when it has no place (see
`sharded_state.chunk_offsets`). The saver runs in the agent, which never imports torch, and must
refuse to write a step that could not be loaded again; `rank_files_refusal` tells it so from the
tree alone. `shard_local` reads the same tree when loading.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from dlrover.flashckpt.errors import StateStructureError
from dlrover.flashckpt.layout import TensorSpec

__all__ = ["RANK_FILES_LOADABLE", "JsonNode", "rank_files_refusal", "sharded_parts", "tensor_keys"]

JsonNode = dict[str, Any]

# The sharding description's flag: whether a node saver's per-rank files of the state can be
# loaded again (every DTensor placed by exactly Shard or Replicate); the same on every rank.
RANK_FILES_LOADABLE = "rank_files_loadable"


def _only(node: Any) -> tuple[str, Any]:
    if not isinstance(node, dict) or len(node) != 1:
        raise StateStructureError(f"malformed tree node {node!r}")
    ((kind, value),) = node.items()
    return kind, value


def _entries(node: Any) -> list[tuple[Any, Any]]:
    kind, value = _only(node)
    if kind != "dict" or not isinstance(value, list) or not all(isinstance(e, list) and len(e) == 2 for e in value):
        raise StateStructureError(f"expected a dict node, got {node!r}")
    return [(k, v) for k, v in value]


def sharded_parts(tree: JsonNode) -> tuple[JsonNode, JsonNode]:
    """(the ``state`` node, the ``sharding`` node) of a sharded snapshot's tree, both undecoded.

    Raises:
        StateStructureError: the tree is not a sharded snapshot's.
    """
    parts = {}
    for key, node in _entries(tree) if isinstance(tree, dict) and "dict" in tree else []:
        if key in ({"str": "state"}, {"str": "sharding"}):
            parts[key["str"]] = node
    if set(parts) != {"state", "sharding"}:
        raise StateStructureError("the rank's tree is not a sharded snapshot's (no 'state' and 'sharding')")
    return parts["state"], parts["sharding"]


def _key_part(node: Any) -> str:
    kind, value = _only(node)
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise StateStructureError(f"key {node!r} of a sharded state is not a str or int")


def tensor_keys(node: JsonNode, path: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """(DCP key, tensor index) of every tensor node under `node`, depth first.

    DCP names a value by its path of keys joined with ``.``.

    Raises:
        StateStructureError: a malformed node, or a key that is not a str or int.
    """
    kind, value = _only(node)
    if kind == "dict":
        for k, child in _entries(node):
            yield from tensor_keys(child, (*path, _key_part(k)))
    elif kind in ("list", "tuple"):
        for i, child in enumerate(value):
            yield from tensor_keys(child, (*path, str(i)))
    elif kind in ("tensor", "ndarray"):
        yield ".".join(path), value


def _field(entries: list[tuple[Any, Any]], name: str) -> Any:
    return next((v for k, v in entries if k == {"str": name}), None)


def rank_files_refusal(tree: JsonNode, specs: Sequence[TensorSpec]) -> str | None:
    """Why a node saver must not write this rank's snapshot in the per-rank format, or None.

    A sharded snapshot whose description says its rank files cannot be loaded again
    (`RANK_FILES_LOADABLE` false), or one with a DTensor whose local part holds elements but has
    no place in the whole tensor (no offsets), would make a step that never loads. A snapshot
    that is not a sharded one (a plain state's tree) is always written.

    Args:
        tree: the rank's tree.
        specs: the rank's tensors, indexed as the tree's tensor nodes.
    """
    try:
        state, sharding = sharded_parts(tree)
        keys = list(tensor_keys(state))
        fields = _entries(sharding)
        shards_node = _field(fields, "shards")
        shards = {_key_part(k): v for k, v in _entries(shards_node)} if shards_node is not None else {}
    except StateStructureError:
        return None
    if _field(fields, RANK_FILES_LOADABLE) == {"bool": False}:
        return "its DTensors are not all placed by Shard or Replicate alone"
    stray = []
    for key, index in keys:
        layout = shards.get(key)
        if layout is None or not isinstance(index, int) or not 0 <= index < len(specs):
            continue  # a plain tensor, or a tree the loader refuses on its own
        try:
            offsets = _field(_entries(layout), "offsets")
        except StateStructureError:
            continue
        if offsets == {"none": None} and math.prod(specs[index].shape) > 0:
            stray.append(key)
    if stray:
        more = " and more" if len(stray) > 3 else ""
        return f"its DTensors {stray[:3]}{more} have no place in the whole tensor"
    return None
