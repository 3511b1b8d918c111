"""Restore a snapshot into an existing state, in place. Pure apart from the tensor copies.

Restoring is two passes so that a mismatch changes nothing: `match_targets` walks the existing
state beside the snapshot's tree and checks every container, key, shape and dtype; only then does
the caller copy bytes into the matched tensors, and `apply_values` writes the snapshot's non-tensor
leaves into the existing containers (tuples, being immutable, are rebuilt).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, MutableSequence
from typing import Any

import attrs
import numpy as np
import torch

from dlrover.flashckpt.dtypes import dtype_name
from dlrover.flashckpt.errors import StateStructureError
from dlrover.flashckpt.layout import TensorSpec
from dlrover.flashckpt.tree import alias_key, decode_scalar, path_name

__all__ = ["TargetPlan", "apply_values", "match_targets", "tie_conflicts"]

JsonNode = dict[str, Any]


def _kind(node: Any, path: tuple[Any, ...]) -> tuple[str, Any]:
    if not isinstance(node, dict) or len(node) != 1:
        raise StateStructureError(f"malformed tree node at {path_name(path)!r}")
    ((kind, value),) = node.items()
    return kind, value


def _check_dict(obj: Any, value: Any, where: str) -> list[tuple[Any, Any]]:
    if not isinstance(obj, Mapping):
        raise StateStructureError(f"at {where!r} the snapshot has a dict, the state a {type(obj).__name__}")
    keys = [decode_scalar(k) for k, _ in value]
    if set(keys) != set(obj.keys()):
        missing = sorted(map(repr, set(keys) - set(obj.keys())))
        extra = sorted(map(repr, set(obj.keys()) - set(keys)))
        raise StateStructureError(
            f"at {where!r} the keys differ: missing from the state {missing}, not in the snapshot {extra}"
        )
    return [(key, child) for key, (_, child) in zip(keys, value, strict=True)]


def _check_sequence(obj: Any, kind: str, value: list[Any], where: str) -> None:
    if not isinstance(obj, list | tuple) or isinstance(obj, torch.Size):
        raise StateStructureError(f"at {where!r} the snapshot has a {kind}, the state a {type(obj).__name__}")
    if len(obj) != len(value):
        raise StateStructureError(f"at {where!r} the snapshot has {len(value)} items, the state {len(obj)}")


def _check_tensor(obj: Any, kind: str, spec: TensorSpec, where: str) -> torch.Tensor:
    if kind == "ndarray":
        if not isinstance(obj, np.ndarray) or not obj.flags.writeable or not obj.flags.c_contiguous:
            raise StateStructureError(f"at {where!r} the state needs a writable contiguous ndarray")
        tensor = torch.from_numpy(obj)
    elif isinstance(obj, torch.Tensor):
        tensor = obj
    else:
        raise StateStructureError(f"at {where!r} the snapshot has a tensor, the state a {type(obj).__name__}")
    if tuple(tensor.shape) != spec.shape or dtype_name(tensor.dtype) != spec.dtype:
        raise StateStructureError(
            f"at {where!r} the snapshot has {spec.dtype}{list(spec.shape)}, "
            f"the state {dtype_name(tensor.dtype)}{list(tensor.shape)}"
        )
    return tensor


@attrs.frozen
class TargetPlan:
    """Where each tensor of a snapshot goes in an existing state (see `match_targets`).

    Attributes:
        places: for each tensor index, the target tensors it writes (NumPy arrays as CPU tensor
            views of their memory); empty when an earlier index writes the same memory.
        shadowed: (index, earlier index) for every tensor one of whose places is the same memory
            as an earlier tensor's: the state ties them, the snapshot stored them apart. Its
            values are not written there; where they differ from the earlier tensor's, the
            caller says so.
    """

    places: list[list[torch.Tensor]]
    shadowed: tuple[tuple[int, int], ...]


def match_targets(target: Any, tree: JsonNode, specs: tuple[TensorSpec, ...]) -> TargetPlan:
    """Pair every tensor of a snapshot with the existing tensors it restores into.

    A snapshot tensor named at several places of the tree (tied weights saved once) restores into
    the tensor at each place. Places holding the same memory (the state's own ties) are written
    once: by the first snapshot tensor in tree order that names them, so a snapshot that stored
    tied tensors apart restores deterministically.

    Args:
        target: the existing state (same nesting as the saved one).
        tree: the snapshot's JSON tree.
        specs: the snapshot's tensor specs (dtype and shape are checked).

    Returns:
        The places of every tensor, and the tensors shadowed by an earlier one.

    Raises:
        StateStructureError: the structures differ; the message names the first differing path.
    """
    found: list[list[torch.Tensor]] = [[] for _ in specs]
    placed = [False] * len(specs)
    claimed: dict[Any, int] = {}
    shadowed: dict[int, int] = {}

    def place(index: int, tensor: torch.Tensor) -> None:
        placed[index] = True
        key = alias_key(tensor)
        if key is None:
            key = ("object", id(tensor))
        if key not in claimed:
            claimed[key] = index
            found[index].append(tensor)
        elif claimed[key] != index:
            shadowed.setdefault(index, claimed[key])

    def visit(obj: Any, node: Any, path: tuple[Any, ...]) -> None:
        kind, value = _kind(node, path)
        where = path_name(path)
        if kind == "dict":
            for key, child in _check_dict(obj, value, where):
                visit(obj[key], child, (*path, key))
        elif kind in ("list", "tuple") and isinstance(value, list):
            _check_sequence(obj, kind, value, where)
            for i, (item, child) in enumerate(zip(obj, value, strict=True)):
                visit(item, child, (*path, i))
        elif kind in ("tensor", "ndarray"):
            if not isinstance(value, int) or not 0 <= value < len(specs):
                raise StateStructureError(f"at {where!r} the tree references a missing tensor {value!r}")
            place(value, _check_tensor(obj, kind, specs[value], where))
        elif isinstance(obj, torch.Tensor | np.ndarray | Mapping | list) or (
            isinstance(obj, tuple) and not isinstance(obj, torch.Size)
        ):
            raise StateStructureError(f"at {where!r} the snapshot has a {kind} value, the state a {type(obj).__name__}")

    visit(target, tree, ())
    missing = [i for i, ok in enumerate(placed) if not ok]
    if missing:
        raise StateStructureError(f"snapshot tensors {[specs[i].name for i in missing]} have no place in the state")
    return TargetPlan(found, tuple(shadowed.items()))


def tie_conflicts(plan: TargetPlan, specs: tuple[TensorSpec, ...], differ: Callable[[int, int], bool]) -> str | None:
    """A sentence naming the shadowed tensors whose values were not kept, or None.

    Args:
        plan: from `match_targets`.
        specs: the snapshot's tensor specs (for their names).
        differ: whether snapshot tensors ``j`` and ``i`` hold different values.
    """
    lost = [(j, i) for j, i in plan.shadowed if differ(j, i)]
    if not lost:
        return None
    pairs = ", ".join(f"{specs[j].name!r} (kept {specs[i].name!r})" for j, i in lost)
    return (
        f"the state ties tensors the snapshot holds apart with different values; their memory keeps the "
        f"first one's: {pairs}"
    )


def apply_values(target: Any, tree: JsonNode) -> Any:
    """Write the snapshot's non-tensor leaves into `target` (already checked by `match_targets`).

    Dicts and lists are updated in place; tuples are rebuilt with the same type.

    Returns:
        The restored state: `target` itself unless its root is a tuple or a scalar.
    """
    kind, value = _kind(tree, ())
    if kind == "dict" and isinstance(target, MutableMapping):
        for key_node, child in value:
            key = decode_scalar(key_node)
            target[key] = apply_values(target[key], child)
        return target
    if kind in ("list", "tuple") and isinstance(target, list | tuple):
        items = [apply_values(item, child) for item, child in zip(target, value, strict=True)]
        if isinstance(target, MutableSequence):
            target[:] = items
            return target
        if hasattr(target, "_make"):
            return target._make(items)
        return type(target)(items)
    if kind in ("tensor", "ndarray"):
        return target
    return decode_scalar(tree)
