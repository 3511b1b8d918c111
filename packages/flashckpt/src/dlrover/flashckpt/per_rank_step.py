"""Check a sharded step that was saved rank by rank before loading it. Collective.

A node saver persists a sharded snapshot in the plain per-rank format (see `shard_local`). To
load it, every rank needs every saved rank's manifest (DCP's planning needs all the chunks), and
every byte must be verified before any reaches the training state. The work is split over the
group: rank ``i`` reads, checks and verifies the saved ranks ``j`` with ``j % size == i``, then
one `RankGroup.gather_bytes` hands every rank the checked manifests and every rank's verdict. A
step thus costs one read of each file in all, however many ranks load it.
"""

from __future__ import annotations

import json

from dlrover.flashckpt.ckpt_format import dump_json
from dlrover.flashckpt.collectives import RankGroup
from dlrover.flashckpt.errors import ChecksumError, LayoutError, StateStructureError, StorageError
from dlrover.flashckpt.layout import TensorSpec
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage_loader import RankFile, read_rank_file, read_step_manifest, verify_tensor

__all__ = ["check_per_rank_step"]


def _encode(files: list[RankFile], error: str | None) -> bytes:
    return dump_json(
        {
            "error": error,
            "files": [
                {
                    "rank": f.rank,
                    "path": f.path,
                    "data_start": f.data_start,
                    "tree": f.tree,
                    "tensors": [s.to_json() for s in f.specs],
                    "crcs": list(f.crcs),
                }
                for f in files
            ],
        }
    )


def _decode(raw: bytes) -> tuple[list[RankFile], str | None]:
    doc = json.loads(raw)
    files = [
        RankFile(
            int(f["rank"]),
            str(f["path"]),
            int(f["data_start"]),
            f["tree"],
            tuple(TensorSpec.from_json(t) for t in f["tensors"]),
            tuple(int(c) for c in f["crcs"]),
        )
        for f in doc["files"]
    ]
    error = doc.get("error")
    return files, error if isinstance(error, str) else None


def _check_mine(storage: Storage, step: int, rank: int, size: int) -> tuple[list[RankFile], str | None]:
    """This rank's share: the saved ranks it reads and verifies, or the first problem found."""
    try:
        man = read_step_manifest(storage, step)
        world = man.get("world_size")
        if not isinstance(world, int) or world < 1:
            raise LayoutError(f"step {step}'s manifest has no valid world_size ({world!r})")
        files = []
        for saved in range(rank, world, size):
            rf = read_rank_file(storage, step, saved, man)
            for i in range(len(rf.specs)):
                verify_tensor(storage, rf, i)
            files.append(rf)
        if rank == 0:
            # Rank 0 also vouches for the count: a manifest listing fewer ranks than its world size.
            listed = {e.get("rank") for e in man.get("ranks", []) if isinstance(e, dict)}
            if listed != set(range(world)):
                raise LayoutError(f"step {step}'s manifest lists ranks {sorted(map(str, listed))}, not 0..{world - 1}")
        return files, None
    except (ChecksumError, LayoutError, StorageError, StateStructureError, KeyError, TypeError, ValueError) as e:
        return [], str(e) or type(e).__name__


def check_per_rank_step(storage: Storage, group: RankGroup, step: int) -> tuple[list[RankFile], str | None]:
    """Every saved rank's checked file description, or the problem (the same on every rank).

    Collective: every rank of `group` must call it for the same step.

    Returns:
        (the files by saved rank, None) when every file is whole; ([], the first problem, in rank
        order) otherwise: a missing or damaged file, a bad manifest.
    """
    files, error = _check_mine(storage, step, group.rank, group.size)
    everything = group.gather_bytes(_encode(files, error))
    found: list[RankFile] = []
    for raw in everything:
        theirs, problem = _decode(raw)
        if problem is not None:
            return [], problem
        found.extend(theirs)
    return sorted(found, key=lambda f: f.rank), None
