"""Sharded steps saved rank by rank (local shards + layout) load resharded through DCP, in one process."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.tensor import Partial, Replicate

from dlrover.common import modules_loaded_by
from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.errors import LayoutError
from dlrover.flashckpt.payloads import payload_from_state
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.shard_local import ShardLocalReader, rank_shards, shard_metadata
from dlrover.flashckpt.shard_tree import RANK_FILES_LOADABLE, rank_files_refusal
from dlrover.flashckpt.sharded_state import chunk_offsets
from dlrover.flashckpt.storage import InMemoryStorage, Storage
from dlrover.flashckpt.storage_loader import read_rank_file, read_step_manifest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


def _rows(global_rows: int, cuts: list[int]) -> list[tuple[int, int]]:
    """Row ranges of the saved ranks: consecutive, covering [0, global_rows), some maybe empty."""
    bounds = [0, *sorted(min(c, global_rows) for c in cuts), global_rows]
    return list(itertools.pairwise(bounds))


def _save_rank_by_rank(
    storage: Storage, step: int, tensors: dict[str, torch.Tensor], rows: list[tuple[int, int]]
) -> None:
    """What a node saver persists: each rank's rows of every tensor, its layout, and a plain tensor."""
    world = len(rows)
    for rank, (lo, hi) in enumerate(rows):
        shards = {
            f"model.{name}": {
                "shape": list(t.shape),
                "placements": ["Shard(dim=0)"],
                "mesh": [world],
                "mesh_dims": [],
                "offsets": [lo] + [0] * (t.dim() - 1),
            }
            for name, t in tensors.items()
        }
        state = {
            "model": {name: t[lo:hi].clone() for name, t in tensors.items()},
            "counter": torch.tensor(step),  # plain: the same on every rank
            "step": step,
        }
        staged = {"sharding": {"world_size": world, "shards": shards}, "state": state}
        persist_rank(storage, payload_from_state(step, rank, world, staged))
    assert Committer(storage).try_commit(step, world).commit


def _reader(storage: Storage, step: int) -> ShardLocalReader:
    man = read_step_manifest(storage, step)
    files = [read_rank_file(storage, step, r, man) for r in range(man["world_size"])]
    metadata, where = shard_metadata(rank_shards(f.rank, f.path, f.data_start, f.tree, f.specs) for f in files)
    return ShardLocalReader(storage, metadata, where)


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(0, 9),
    cols=st.integers(1, 3),
    cuts=st.lists(st.integers(0, 9), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_any_row_split_loads_whole_bit_for_bit(
    dtype: torch.dtype, rows: int, cols: int, cuts: list[int], seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    full = torch.randint(0, 100, (rows, cols), generator=gen).to(dtype)
    vector = torch.randint(0, 100, (rows,), generator=gen).to(dtype)
    storage = InMemoryStorage()
    _save_rank_by_rank(storage, 4, {"w": full, "v": vector}, _rows(rows, cuts))
    target = {"model.w": torch.zeros_like(full), "model.v": torch.zeros_like(vector), "counter": torch.tensor(0)}
    dcp_load(target, storage_reader=_reader(storage, 4), no_dist=True)
    assert torch.equal(target["model.w"], full)
    assert torch.equal(target["model.v"], vector)
    assert int(target["counter"]) == 4


def test_a_missing_rank_part_is_refused_not_loaded_with_a_hole() -> None:
    storage = InMemoryStorage()
    full = torch.arange(12.0).reshape(6, 2)
    _save_rank_by_rank(storage, 1, {"w": full}, [(0, 2), (2, 4), (4, 6)])
    man = read_step_manifest(storage, 1)
    files = [read_rank_file(storage, 1, r, man) for r in (0, 2)]  # rank 1's file is lost
    with pytest.raises(LayoutError, match=r"'model\.w': the saved chunks leave a gap along dimension 0 at 2"):
        shard_metadata(rank_shards(f.rank, f.path, f.data_start, f.tree, f.specs) for f in files)


def test_layouts_that_cannot_be_read_back_are_refused() -> None:
    storage = InMemoryStorage()
    _save_rank_by_rank(storage, 1, {"w": torch.ones(4, 2)}, [(0, 2), (2, 4)])
    man = read_step_manifest(storage, 1)
    f = read_rank_file(storage, 1, 1, man)
    good = rank_shards(f.rank, f.path, f.data_start, f.tree, f.specs)
    (w,) = [c for c in good.chunks if c.key == "model.w"]
    outside = attrs.evolve(good, chunks=(attrs.evolve(w, offsets=(3, 0)),))
    with pytest.raises(LayoutError, match="lies outside"):
        shard_metadata([outside])
    one_row = attrs.evolve(w.spec, shape=(1, 2), nbytes=8)
    clash = attrs.evolve(good, rank=0, chunks=(attrs.evolve(w, offsets=(2, 0), global_shape=(8, 2)),))
    other = attrs.evolve(good, rank=1, chunks=(attrs.evolve(w, offsets=(2, 0), spec=one_row, global_shape=(8, 2)),))
    with pytest.raises(LayoutError, match="ranks 0 and 1 saved different chunks"):
        shard_metadata([clash, other])


def test_chunks_that_overlap_or_leave_gaps_are_refused_whatever_their_sizes_add_up_to() -> None:
    storage = InMemoryStorage()
    _save_rank_by_rank(storage, 1, {"w": torch.arange(4.0).reshape(4, 1)}, [(0, 2), (2, 4)])
    man = read_step_manifest(storage, 1)
    files = [read_rank_file(storage, 1, r, man) for r in (0, 1)]
    ranks = [rank_shards(f.rank, f.path, f.data_start, f.tree, f.specs) for f in files]
    (w1,) = [c for c in ranks[1].chunks if c.key == "model.w"]
    # Rank 1's two rows placed at row 1: 4 elements in all, but rows 1 overlap and row 3 is a gap.
    shifted = attrs.evolve(ranks[1], chunks=(attrs.evolve(w1, offsets=(1, 0)),))
    with pytest.raises(LayoutError, match=r"'model\.w': the saved chunks overlap along dimension 0"):
        shard_metadata([ranks[0], shifted])
    # A 2-D grid missing one box: its extents still partition both dimensions.
    box = attrs.evolve(w1, global_shape=(4, 2), spec=attrs.evolve(w1.spec, shape=(2, 1), nbytes=8))
    three = [
        attrs.evolve(ranks[0], rank=r, chunks=(attrs.evolve(box, offsets=o),))
        for r, o in enumerate([(0, 0), (0, 1), (2, 0)])
    ]
    with pytest.raises(LayoutError, match="3 chunks saved of the 4 its layout needs"):
        shard_metadata(three)


def test_a_dtensor_no_rank_can_place_is_refused() -> None:
    storage = InMemoryStorage()
    _save_rank_by_rank(storage, 1, {"w": torch.ones(2, 2)}, [(0, 1), (1, 2)])
    man = read_step_manifest(storage, 1)
    files = [read_rank_file(storage, 1, r, man) for r in (0, 1)]
    ranks = [rank_shards(f.rank, f.path, f.data_start, f.tree, f.specs) for f in files]
    blind = [
        attrs.evolve(r, chunks=tuple(c for c in r.chunks if c.key != "model.w"), unreadable=("model.w",)) for r in ranks
    ]
    with pytest.raises(LayoutError, match=r"'model\.w': no rank saved a chunk of it that can be placed"):
        shard_metadata(blind)


def test_only_plain_shard_and_replicate_placements_get_offsets() -> None:
    # A partial value is not the tensor's, so no box of the whole tensor holds it: asked of the
    # placements before anything else, so a stand-in with placements is enough here.
    stand_in = SimpleNamespace(placements=(Replicate(), Partial()))
    assert chunk_offsets("w", stand_in) is None  # type: ignore[arg-type]


def _staged_payload(
    offsets: list[int] | None, local_rows: int, loadable: bool | None = True
) -> tuple[dict[str, object], tuple[object, ...]]:
    """One rank's tree and specs, as the stager stages a sharded state: a DTensor ``model.w``
    (its layout's offsets as given), a plain tensor ``bias`` and a non-tensor leaf."""
    layout = {"shape": [4, 2], "placements": ["S(0)"], "mesh": [2], "mesh_dims": [], "offsets": offsets}
    sharding: dict[str, object] = {"world_size": 2, "shards": {"model.w": layout}}
    if loadable is not None:
        sharding[RANK_FILES_LOADABLE] = loadable
    state = {"model": {"w": torch.ones(local_rows, 2)}, "bias": torch.zeros(3), "step": 1}
    payload = payload_from_state(1, 0, 2, {"sharding": sharding, "state": state})
    return payload.tree, payload.specs


def test_the_saver_tells_unloadable_rank_files_from_the_tree_alone() -> None:
    assert rank_files_refusal(*_staged_payload([0, 0], 2)) is None  # placed
    assert rank_files_refusal(*_staged_payload([0, 0], 2, loadable=None)) is None  # no flag: offsets decide
    refusal = rank_files_refusal(*_staged_payload([0, 0], 2, loadable=False))
    assert refusal is not None
    assert "not all placed by Shard or Replicate" in refusal  # the same on every rank, whatever it holds
    refusal = rank_files_refusal(*_staged_payload(None, 2))
    assert refusal is not None
    assert "['model.w']" in refusal
    assert rank_files_refusal(*_staged_payload(None, 0)) is None  # this rank holds no part of it
    # A plain state (no sharding description), or one that only looks like it, is not sharded.
    plain = payload_from_state(1, 0, 1, {"w": torch.ones(2), "sharding": {"shards": 3}})
    assert rank_files_refusal(plain.tree, plain.specs) is None
    assert rank_files_refusal({"list": []}, ()) is None
    assert modules_loaded_by("import dlrover.flashckpt.shard_tree", ["torch"]) == []  # the agent's saver uses it


class _Planner:
    """The two calls a StorageReader makes of DCP's load planner, over targets of our own."""

    def __init__(self, targets: dict[str, torch.Tensor]) -> None:
        self.targets = targets
        self.committed: list[str] = []

    def resolve_tensor(self, item: ReadItem) -> torch.Tensor:
        t = self.targets[item.dest_index.fqn]
        for dim, (o, n) in enumerate(zip(item.dest_offsets, item.lengths, strict=True)):
            t = t.narrow(dim, o, n)
        return t

    def commit_tensor(self, item: ReadItem, tensor: torch.Tensor) -> None:
        self.committed.append(item.dest_index.fqn)


class _CountingStorage(InMemoryStorage):
    """Records the bytes each `read_into` asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[int] = []

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        self.read.append(len(buf.cast("B")))
        super().read_into(path, offset, buf)


def test_the_reader_copies_row_runs_and_other_parts_of_a_chunk() -> None:
    storage = _CountingStorage()
    full = torch.arange(24, dtype=torch.float32).reshape(8, 3)
    _save_rank_by_rank(storage, 1, {"w": full}, [(0, 4), (4, 8)])
    reader = _reader(storage, 1)
    storage.read.clear()
    second = MetadataIndex("model.w", torch.Size([4, 0]))  # rank 1's chunk: rows 4..7

    def item(dest: str, dest_at: tuple[int, int], at: tuple[int, int], lengths: tuple[int, int]) -> ReadItem:
        return ReadItem(
            LoadItemType.TENSOR, MetadataIndex(dest), torch.Size(dest_at), second, torch.Size(at), torch.Size(lengths)
        )

    targets = {
        "rows": torch.zeros(3, 3),  # rows 5..7 of the whole tensor: a run of whole rows of the chunk
        "cols": torch.zeros(2, 2),  # rows 4..5, columns 1..2: cut from those two rows
        "wider": torch.zeros(2, 3, dtype=torch.float64),  # whole rows into another dtype
    }
    plan = LoadPlan(
        [
            item("rows", (0, 0), (1, 0), (3, 3)),
            item("cols", (0, 0), (0, 1), (2, 2)),
            item("wider", (0, 0), (2, 0), (2, 3)),
        ]
    )
    planner = _Planner(targets)
    reader.read_data(plan, planner).wait()  # type: ignore[arg-type]
    assert torch.equal(targets["rows"], full[5:8])
    assert torch.equal(targets["cols"], full[4:6, 1:3])
    assert torch.equal(targets["wider"], full[6:8].double())
    assert planner.committed == ["rows", "cols", "wider"]
    row = 3 * 4  # bytes of one float32 row of three
    assert storage.read == [3 * row, 2 * row, 2 * row]  # each part's rows alone, never the chunk
    missing = ReadItem(
        LoadItemType.TENSOR,
        MetadataIndex("rows"),
        torch.Size([0, 0]),
        MetadataIndex("model.w", torch.Size([2, 0])),
        torch.Size([0, 0]),
        torch.Size([1, 3]),
    )
    with pytest.raises(LayoutError, match="holds no chunk at"):
        reader.read_data(LoadPlan([missing]), planner)  # type: ignore[arg-type]
