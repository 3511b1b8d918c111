"""Split a sharded training state (DTensor leaves) into what each part of a checkpoint needs.

A state from ``torch.distributed.checkpoint.state_dict.get_state_dict`` on an FSDP2
(``fully_shard``) model, or any nested dict holding ``DTensor`` leaves, is split three ways:

* the **local** state: the same nesting with every ``DTensor`` replaced by its local shard (a view
  of the same memory, so restoring into it restores into the model) - this is what the stager
  copies into shared memory;
* the **DCP** state: a flat ``{key: tensor}`` dict of every tensor leaf (``DTensor`` kept as is,
  so ``torch.distributed.checkpoint`` knows its global shape and can reshard on load), keys being
  the dict path joined with ``.`` as DCP's own planner flattens nested dicts; non-tensor leaves are
  left out of DCP (they go to our JSON manifest, so loading never unpickles them);
* the **sharding** description: per ``DTensor`` key its global shape, placements and mesh shape,
  plus the world size - two snapshots can be exchanged shard for shard only when these match.

Pure apart from reading tensor attributes; no collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch.distributed.checkpoint.default_planner import create_default_local_save_plan
from torch.distributed.tensor import DTensor, Replicate, Shard

from dlrover.flashckpt.errors import StateStructureError
from dlrover.flashckpt.tree import path_name

__all__ = [
    "ShardInfo",
    "ShardedSplit",
    "boxed_placements",
    "chunk_offsets",
    "dcp_grouped",
    "rejoin",
    "skeleton",
    "split_sharded",
]


@attrs.frozen
class ShardInfo:
    """How one DTensor is laid out over the ranks (live objects, for rebuilding it from a shard).

    Attributes:
        mesh: the device mesh.
        placements: the DTensor's placements.
        shape: the global shape.
        stride: the global stride.
    """

    mesh: Any
    placements: tuple[Any, ...]
    shape: torch.Size
    stride: tuple[int, ...]

    @property
    def boxed(self) -> bool:
        """See `boxed_placements`."""
        return boxed_placements(self.placements)

    def describe(self) -> dict[str, Any]:
        """A JSON description; equal descriptions mean equal local shards on every rank."""
        return {
            "shape": [int(d) for d in self.shape],
            "placements": [str(p) for p in self.placements],
            "mesh": [int(d) for d in self.mesh.shape],
            "mesh_dims": [str(n) for n in (self.mesh.mesh_dim_names or ())],
        }


@attrs.frozen
class ShardedSplit:
    """The three views of a sharded state (see the module docstring).

    Attributes:
        local: the state with each DTensor replaced by its local shard.
        dcp: every tensor leaf by DCP key (DTensors kept).
        shards: the layout of each DTensor leaf, by DCP key.
        keys: the DCP key of each tensor leaf, in depth-first order.
    """

    local: Any
    dcp: dict[str, torch.Tensor]
    shards: dict[str, ShardInfo]
    keys: tuple[str, ...]

    def describe(
        self, world_size: int, describe_shard: Callable[[str, ShardInfo], dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """JSON metadata staged beside the local state: world size and every DTensor's layout.

        Args:
            world_size: the job's.
            describe_shard: the layout of one DTensor by key (default `ShardInfo.describe`); the
                checkpointer's adds where the shard lies, and remembers layouts it has seen.
        """
        one = describe_shard or (lambda _key, info: info.describe())
        return {"world_size": world_size, "shards": {k: one(k, info) for k, info in sorted(self.shards.items())}}


def _key_part(key: Any, path: tuple[Any, ...]) -> str:
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise StateStructureError(
            f"key {key!r} at {path_name(path)!r}: sharded states need str or int keys (DCP names tensors by them)"
        )
    return str(key)


def split_sharded(state: Any) -> ShardedSplit:
    """Split `state` into its local, DCP and sharding views.

    Args:
        state: nested dicts, lists and tuples whose leaves are tensors (``DTensor`` or plain),
            NumPy arrays or JSON-able scalars (see `dlrover.flashckpt.tree`).

    Returns:
        The split; the local view shares memory with the state's tensors.

    Raises:
        StateStructureError: the state is not a dict, a leaf is a ``ShardedTensor`` (use a DTensor state dict: FSDP2, or
            FSDP1 built with a ``device_mesh``), a key is not a str or int, or two leaves map to the
            same DCP key.
    """
    dcp: dict[str, torch.Tensor] = {}
    shards: dict[str, ShardInfo] = {}
    keys: list[str] = []

    def add(obj: Any, tensor: torch.Tensor, path: tuple[Any, ...]) -> Any:
        key = ".".join(_key_part(p, path) for p in path)
        if key in dcp:
            raise StateStructureError(f"two tensors of the state map to the DCP key {key!r}")
        dcp[key] = tensor
        keys.append(key)
        if isinstance(tensor, DTensor):
            shards[key] = ShardInfo(tensor.device_mesh, tuple(tensor.placements), tensor.shape, tuple(tensor.stride()))
            return tensor.to_local()
        return obj

    def visit(obj: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            if type(obj).__name__ == "ShardedTensor":
                raise StateStructureError(
                    f"ShardedTensor at {path_name(path)!r} is not supported: use a DTensor state dict "
                    "(FSDP2 fully_shard, or FSDP1 built with a device_mesh)"
                )
            return add(obj, obj, path)
        if isinstance(obj, np.ndarray):
            # Staged as an ndarray (the tree keeps its kind); DCP sees a tensor sharing its memory.
            return add(obj, torch.from_numpy(obj), path)
        if isinstance(obj, Mapping):
            return {k: visit(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [visit(v, (*path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not isinstance(obj, torch.Size):
            items = [visit(v, (*path, i)) for i, v in enumerate(obj)]
            return obj._make(items) if hasattr(obj, "_make") else tuple(items)
        return obj

    if not isinstance(state, Mapping):
        raise StateStructureError(f"a sharded state is a dict (DCP saves dicts), not a {type(state).__name__}")
    local = visit(state, ())
    return ShardedSplit(local, dcp, shards, tuple(keys))


def boxed_placements(placements: Sequence[Any]) -> bool:
    """Whether each rank's shard is one box of the whole tensor: placed by exactly `Shard` or
    `Replicate`. A strided shard's rows are not contiguous in the whole tensor, and a partial value
    is not the tensor's; only boxed shards can be read back from per-rank files (`shard_local`)."""
    return all(type(p) in (Shard, Replicate) for p in placements)


def chunk_offsets(key: str, tensor: DTensor) -> list[int] | None:
    """Where this rank's local shard of `tensor` starts in the global tensor, per dimension.

    Asked of DCP's own save planning (``create_default_local_save_plan``, public), so the offsets
    are the ones DCP would write for this shard. None when the shard cannot be read back as one
    box of the whole tensor from this rank's local tensor alone: a placement other than exactly
    `Shard` or `Replicate` (a strided shard's rows are not contiguous in the whole tensor; a
    partial value is not the tensor's), a rank outside the tensor's mesh, or a planned box of
    another size than the local tensor.
    """
    if not boxed_placements(tensor.placements):
        return None
    items = [i for i in create_default_local_save_plan({key: tensor}, False).items if i.tensor_data is not None]
    if len(items) != 1:
        return None
    data = items[0].tensor_data
    assert data is not None
    if tuple(data.chunk.sizes) != tuple(tensor.to_local().shape):
        return None
    return [int(o) for o in data.chunk.offsets]


def dcp_grouped(flat: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """`flat` with its keys grouped by their part before the first ``.``: the same DCP keys.

    ``torch.distributed.checkpoint.save`` names a value by its path joined with ``.``, so
    ``{"model": {"0.weight": t}}`` is saved under ``model.0.weight`` exactly as
    ``{"model.0.weight": t}`` is, and is loaded by a flat or a nested template alike. The grouping
    matters for speed alone: ``save`` makes a logged call per *top-level* entry (about 0.1 ms each
    on the 2-core development machine: 0.05-0.1 s for the ~700 tensors of the 1 GB FSDP2 + AdamW
    state of ``benchmarks/flashckpt_sharded.py``), as much as the rest of its planning. One
    difference shows: a reader *without* a template (``dcp_to_torch_save``) rebuilds the nesting
    of the save, ``{"model": {"0.weight": t}}``, where checkpoints written before this grouping
    give the flat ``{"model.0.weight": t}``; `ShardedCheckpointer` always loads with a template.

    Args:
        flat: tensors by DCP key (see `ShardedSplit.dcp`).

    Returns:
        A dict of tensors and one-level dicts of tensors with the same joined keys; `flat` itself
        (copied) when a key is also the head of another (``"a"`` and ``"a.b"``), which cannot be
        grouped.
    """
    top: dict[str, Any] = {}
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in flat.items():
        head, dot, rest = key.partition(".")
        if dot:
            groups.setdefault(head, {})[rest] = tensor
        else:
            top[key] = tensor
    if not groups.keys().isdisjoint(top):
        return dict(flat)
    top.update(groups)
    return top


def rejoin(live: Any, values: Any) -> Any:
    """The live state with its non-tensor leaves taken from `values` (same nesting).

    Tensor leaves (DTensor or plain) of `live` are kept: they were restored in place. Dicts and
    lists of `live` are updated in place; tuples are rebuilt.

    Raises:
        StateStructureError: the nestings differ.
    """

    def visit(a: Any, b: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(a, torch.Tensor | np.ndarray):
            return a
        if isinstance(a, Mapping):
            if not isinstance(b, Mapping) or set(a) != set(b):
                raise StateStructureError(f"at {path_name(path)!r} the restored state has other keys")
            for k in list(a):
                a[k] = visit(a[k], b[k], (*path, k))  # type: ignore[index]
            return a
        if isinstance(a, list | tuple) and not isinstance(a, torch.Size):
            if not isinstance(b, list | tuple) or len(a) != len(b):
                raise StateStructureError(f"at {path_name(path)!r} the restored state has another length")
            items = [visit(x, y, (*path, i)) for i, (x, y) in enumerate(zip(a, b, strict=True))]
            if isinstance(a, list):
                a[:] = items
                return a
            return a._make(items) if hasattr(a, "_make") else tuple(items)
        return b

    return visit(live, values, ())


def skeleton(node: Any) -> Any:
    """A tree (see `dlrover.flashckpt.tree`) with values erased: kinds, keys and nesting only.

    Two states with equal skeletons have the same containers, keys and leaf kinds, so the
    non-tensor values of one can be written into the other.
    """
    if not isinstance(node, dict) or len(node) != 1:
        return ("?", repr(node))
    ((kind, value),) = node.items()
    if kind == "dict" and isinstance(value, list):
        return ("dict", tuple((repr(k), skeleton(v)) for k, v in value))
    if kind in ("list", "tuple") and isinstance(value, list):
        return (kind, tuple(skeleton(v) for v in value))
    if kind in ("tensor", "ndarray"):
        return (kind,)
    return ("scalar",)
