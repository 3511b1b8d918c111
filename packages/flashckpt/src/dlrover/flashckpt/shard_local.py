"""Read a sharded step written rank by rank, resharded, through DCP's public load API.

A node saver persists a sharded snapshot without the training processes (they may be dead): each
rank's local shards go to its own safetensors file and rank manifest, exactly as a plain
checkpoint's do (`persist.persist_rank`), and the staged sharding description travels in the
rank's tree. That description names, per DTensor, its global shape and where this rank's chunk
starts in it (`sharded_state.chunk_offsets`). Such a step is read back here:

* `rank_shards` turns one rank's manifest into the chunks its file holds, keyed by DCP key (the
  dict path joined with ``.``, as `sharded_state.split_sharded` names them);
* `shard_metadata` merges every rank's chunks into DCP's `Metadata` (global shape and chunks per
  key), checking that the chunks of each key cover it exactly once: a step missing a rank's
  chunk is refused, never loaded with a hole;
* `ShardLocalReader` is a ``torch.distributed.checkpoint.StorageReader`` over a `Storage`: DCP's
  load planning works out which part of which saved chunk each rank needs, for any new sharding,
  and the reader copies those parts from the files. Nothing is unpickled: tensors are raw
  little-endian bytes, and the metadata is built from our JSON.

A plain tensor of a sharded state (not a DTensor) is the same on every rank, as DCP assumes; it
is read from the lowest rank that saved it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from dlrover.flashckpt.dtypes import dtype_from_name
from dlrover.flashckpt.errors import LayoutError, StateStructureError
from dlrover.flashckpt.layout import TensorSpec
from dlrover.flashckpt.shard_tree import JsonNode, sharded_parts, tensor_keys
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.tree import build_tree

__all__ = [
    "RankShards",
    "ShardChunk",
    "ShardLocalReader",
    "rank_shards",
    "shard_metadata",
    "state_node_of",
]


@attrs.frozen
class ShardChunk:
    """One box of one tensor, as one rank's file holds it.

    Attributes:
        key: the DCP key.
        offsets: where the box starts in the global tensor.
        spec: the tensor in the rank's file (dtype, local shape, offset in the data section).
        global_shape: the whole tensor's shape.
    """

    key: str
    offsets: tuple[int, ...]
    spec: TensorSpec
    global_shape: tuple[int, ...]


@attrs.frozen
class RankShards:
    """What one saved rank's file holds.

    Attributes:
        rank: the saved rank.
        path: its safetensors file in storage.
        data_start: where the file's data section starts.
        chunks: its boxes, in file order.
        unreadable: DTensors whose local shard is in the file but cannot be placed in the whole
            tensor (no box: a strided or partial layout), or which the rank held no part of.
    """

    rank: int
    path: str
    data_start: int
    chunks: tuple[ShardChunk, ...]
    unreadable: tuple[str, ...] = ()


def state_node_of(tree: JsonNode) -> tuple[JsonNode, dict[str, Any]]:
    """(the ``state`` node, the decoded ``sharding`` description) of a sharded snapshot's tree.

    Raises:
        StateStructureError: the tree is not a sharded snapshot's.
    """
    state, sharding_node = sharded_parts(tree)
    sharding = build_tree(sharding_node, [])
    if not isinstance(sharding, dict) or not isinstance(sharding.get("shards"), dict):
        raise StateStructureError("the sharded snapshot's 'sharding' description is malformed")
    return state, sharding


def rank_shards(rank: int, path: str, data_start: int, tree: JsonNode, specs: tuple[TensorSpec, ...]) -> RankShards:
    """The chunks one saved rank's file holds, from its rank manifest's tree and tensor specs.

    Raises:
        StateStructureError: the tree is not a sharded snapshot's, or names a missing tensor.
    """
    state, sharding = state_node_of(tree)
    shards: Mapping[str, Any] = sharding["shards"]
    chunks = []
    unreadable = []
    for key, index in tensor_keys(state):
        if not isinstance(index, int) or not 0 <= index < len(specs):
            raise StateStructureError(f"rank {rank}: tensor {key!r} names index {index!r} of {len(specs)}")
        spec = specs[index]
        layout = shards.get(key)
        if layout is None:  # a plain tensor: the whole of it
            chunks.append(ShardChunk(key, (0,) * len(spec.shape), spec, spec.shape))
            continue
        offsets = layout.get("offsets")
        shape = layout.get("shape")
        if offsets is None:
            unreadable.append(key)  # no box on this rank (see sharded_state.chunk_offsets)
            continue
        if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != len(spec.shape):
            raise StateStructureError(f"rank {rank}: the layout of {key!r} is malformed: {layout!r}")
        chunks.append(ShardChunk(key, tuple(int(o) for o in offsets), spec, tuple(int(d) for d in shape)))
    return RankShards(rank, path, data_start, tuple(chunks), tuple(unreadable))


def shard_metadata(ranks: Iterable[RankShards]) -> tuple[Metadata, dict[MetadataIndex, tuple[RankShards, ShardChunk]]]:
    """DCP's metadata for a step saved rank by rank, and where each chunk is.

    Identical chunks (replicated placements, plain tensors) are taken from the lowest rank; empty
    chunks hold nothing to read and are left out. The chunks of every tensor must tile it exactly:
    along each dimension their extents partition it, and every box of that grid is saved once
    (DTensor's `Shard` and `Replicate` placements always give such a grid).

    Raises:
        LayoutError: the ranks disagree on a tensor's dtype or global shape, a chunk lies outside
            its tensor, the chunks do not tile it (a rank's part is missing, or two overlap),
            or a DTensor has no readable chunk: loading would leave part of a tensor unwritten
            or written twice.
    """
    first: dict[str, ShardChunk] = {}
    boxes: dict[str, dict[tuple[int, ...], tuple[RankShards, ShardChunk]]] = {}
    unreadable: dict[str, int] = {}
    for rs in sorted(ranks, key=lambda r: r.rank):
        for key in rs.unreadable:
            unreadable.setdefault(key, rs.rank)
        for chunk in rs.chunks:
            seen = first.setdefault(chunk.key, chunk)
            if (chunk.spec.dtype, chunk.global_shape) != (seen.spec.dtype, seen.global_shape):
                raise LayoutError(
                    f"{chunk.key!r}: rank {rs.rank} saved {chunk.spec.dtype}{list(chunk.global_shape)}, "
                    f"a lower rank {seen.spec.dtype}{list(seen.global_shape)}"
                )
            _check_bounds(rs, chunk)
            if math.prod(chunk.spec.shape) == 0:
                continue
            kept = boxes.setdefault(chunk.key, {}).setdefault(chunk.offsets, (rs, chunk))
            if kept[1].spec.shape != chunk.spec.shape:
                raise LayoutError(
                    f"{chunk.key!r}: ranks {kept[0].rank} and {rs.rank} saved different chunks at {list(chunk.offsets)}"
                )
    for key, rank in unreadable.items():
        if key not in first:
            raise LayoutError(
                f"{key!r}: no rank saved a chunk of it that can be placed (rank {rank}'s layout has none)"
            )
    metadata: dict[str, TensorStorageMetadata] = {}
    where: dict[MetadataIndex, tuple[RankShards, ShardChunk]] = {}
    for key, seen in first.items():
        saved = boxes.get(key, {})
        _check_tiling(key, seen.global_shape, [(o, c.spec.shape) for o, (_, c) in saved.items()])
        for offsets, located in saved.items():
            where[MetadataIndex(key, torch.Size(offsets))] = located
        metadata[key] = TensorStorageMetadata(
            properties=TensorProperties(dtype=dtype_from_name(seen.spec.dtype)),
            size=torch.Size(seen.global_shape),
            chunks=[
                ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(c.spec.shape))
                for o, (_, c) in saved.items()
            ],
        )
    return Metadata(state_dict_metadata=dict(metadata)), where


def _check_tiling(key: str, shape: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
    """Refuse chunks (offsets, sizes; none empty, all in bounds) that do not tile `shape` exactly.

    Along each dimension the chunks' extents must partition it (extents that start at the same
    place end at the same place, and the distinct ones follow each other from 0 to the end);
    then distinct chunks, each a box of that grid, tile the tensor exactly when there are as many
    as the grid has boxes. Linear in the chunks, unlike testing every pair for overlap.

    Raises:
        LayoutError: naming the tensor and what is wrong.
    """
    if math.prod(shape) == 0:
        return
    grid = 1
    for dim, size in enumerate(shape):
        extents: dict[int, int] = {}
        for offsets, sizes in chunks:
            end = extents.setdefault(offsets[dim], offsets[dim] + sizes[dim])
            if end != offsets[dim] + sizes[dim]:
                raise LayoutError(f"{key!r}: chunks overlap along dimension {dim} at {offsets[dim]}")
        position = 0
        for start in sorted(extents):
            if start != position:
                what = "overlap" if start < position else "leave a gap"
                raise LayoutError(f"{key!r}: the saved chunks {what} along dimension {dim} at {min(start, position)}")
            position = extents[start]
        if position != size:
            raise LayoutError(f"{key!r}: the saved chunks cover {position} of {size} along dimension {dim}")
        grid *= len(extents)
    if len(chunks) != grid:
        raise LayoutError(
            f"{key!r}: {len(chunks)} chunks saved of the {grid} its layout needs "
            "(a rank's part is missing, or its sharding cannot be read back from per-rank files)"
        )


def _check_bounds(rs: RankShards, chunk: ShardChunk) -> None:
    ends = [o + n for o, n in zip(chunk.offsets, chunk.spec.shape, strict=True)]
    if (
        len(chunk.global_shape) != len(ends)
        or any(o < 0 for o in chunk.offsets)
        or any(e > d for e, d in zip(ends, chunk.global_shape, strict=True))
    ):
        raise LayoutError(
            f"{chunk.key!r}: rank {rs.rank}'s chunk {list(chunk.spec.shape)} at {list(chunk.offsets)} lies outside "
            f"the tensor {list(chunk.global_shape)}"
        )


class ShardLocalReader(StorageReader):
    """A DCP ``StorageReader`` over a step saved rank by rank (see the module docstring).

    Pass it to ``torch.distributed.checkpoint.load(state_dict, storage_reader=...)`` on every
    rank; the planner reshards. A part made of whole rows of a saved chunk is read alone
    (`Storage.read_into`, straight into the target when it can take the bytes); any other part is
    cut from the whole chunk, read once for the items that follow on it. Checksums are the
    caller's to verify before (a damaged byte must make the step fall back, not fail the load
    half way).

    Args:
        storage: where the files are.
        metadata: from `shard_metadata`.
        where: from `shard_metadata`.
    """

    def __init__(
        self,
        storage: Storage,
        metadata: Metadata,
        where: Mapping[MetadataIndex, tuple[RankShards, ShardChunk]],
    ) -> None:
        super().__init__()
        self._storage = storage
        self._metadata = metadata
        self._where = dict(where)

    def reset(self, checkpoint_id: Any = None) -> None:
        """Nothing to reset: the reader is built for one step."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        """Never chosen by a checkpoint id: the reader is built for one step and given explicitly."""
        return False

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The step's metadata, built from its rank manifests."""
        return self._metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Nothing to set up."""

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan as it is."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The plans as they are."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Copy every read item's part of its saved chunk into the planner's target tensor.

        A part made of whole rows of its chunk (a reshard along the first dimension, as FSDP's
        is) is read alone, straight into the target when the target can take the bytes; any
        other part is cut from the run of rows it lies in, read once for the items that follow
        on the same run.

        Raises:
            LayoutError: an item names a chunk the step does not hold, is not a tensor read, or
                asks for another shape than its target's.
            StorageError: a file cannot be read.
        """
        cached: tuple[tuple[MetadataIndex, int, int], torch.Tensor] | None = None
        for item in plan.items:
            if item.type is not LoadItemType.TENSOR:
                raise LayoutError(f"{item.dest_index.fqn!r}: a per-rank sharded step holds tensors only")
            index = MetadataIndex(item.storage_index.fqn, item.storage_index.offset)
            rs, chunk = self._locate(index)
            target = planner.resolve_tensor(item).detach()
            if tuple(target.shape) != tuple(item.lengths):
                raise LayoutError(
                    f"{item.dest_index.fqn!r}: the planner asked for {list(item.lengths)} into {list(target.shape)}"
                )
            if _whole_rows(item.storage_offsets, item.lengths, chunk.spec.shape):
                self._read_rows(rs, chunk, int(item.storage_offsets[0]), target)
            else:
                # The rows the part lies in are one contiguous run of the chunk: read them (once
                # for the items that follow on the same run), then cut the part from them.
                first, count = (int(item.storage_offsets[0]), int(item.lengths[0])) if chunk.spec.shape else (0, 0)
                run = (index, first, count)
                if cached is None or cached[0] != run:
                    cached = (run, self._read_row_run(rs, chunk, first, count))
                source = cached[1]
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
                    source = source.narrow(dim, start - first if dim == 0 else start, length)
                with torch.no_grad():
                    target.copy_(source)
            planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _locate(self, index: MetadataIndex) -> tuple[RankShards, ShardChunk]:
        located = self._where.get(index)
        if located is None:
            raise LayoutError(f"{index.fqn!r}: the step holds no chunk at {list(index.offset or ())}")
        return located

    def _read_row_run(self, rs: RankShards, chunk: ShardChunk, first: int, count: int) -> torch.Tensor:
        """Rows ``first .. first + count`` of `chunk` as a new tensor (a 0-d chunk: all of it)."""
        shape = (count, *chunk.spec.shape[1:]) if chunk.spec.shape else ()
        run = torch.empty(shape, dtype=dtype_from_name(chunk.spec.dtype))
        if not chunk.spec.shape:
            if chunk.spec.nbytes:
                raw = run.reshape(-1).view(torch.uint8).numpy()
                self._storage.read_into(rs.path, rs.data_start + chunk.spec.offset, raw.data)
            return run
        self._read_rows(rs, chunk, first, run)
        return run

    def _read_rows(self, rs: RankShards, chunk: ShardChunk, first: int, target: torch.Tensor) -> None:
        """Read rows ``first ..`` of `chunk` (as many as `target` has) into `target`."""
        dtype = dtype_from_name(chunk.spec.dtype)
        direct = target.device.type == "cpu" and target.dtype == dtype and target.is_contiguous()
        buf = target if direct else torch.empty(target.shape, dtype=dtype)
        if buf.numel():
            row_bytes = chunk.spec.nbytes // chunk.spec.shape[0]
            raw = buf.reshape(-1).view(torch.uint8).numpy()
            self._storage.read_into(rs.path, rs.data_start + chunk.spec.offset + first * row_bytes, raw.data)
        if not direct:
            with torch.no_grad():
                target.copy_(buf)


def _whole_rows(offsets: Sequence[int], lengths: Sequence[int], shape: tuple[int, ...]) -> bool:
    """Whether the part (`offsets`, `lengths`) of a chunk of `shape` is a run of its whole rows."""
    return len(shape) > 0 and all(
        o == 0 and n == d for o, n, d in zip(offsets[1:], lengths[1:], shape[1:], strict=True)
    )
