"""Check a sharded step that was saved rank by rank before loading it. Collective.

A node saver persists a sharded snapshot in the plain per-rank format (see `shard_local`). To
load it, every rank needs every saved rank's manifest (DCP's planning needs all the chunks), and
every byte must be verified before any reaches the training state. The work is split over the
group: rank ``i`` reads, checks and verifies the saved ranks ``j`` with ``j % size == i``, then
one exchange (`RankGroup.gather_bytes`) hands every rank the checked manifests and every rank's
verdict. Verifying a step thus reads each file once in all, however many ranks load it.
"""

from __future__ import annotations

import json

import attrs

from dlrover.flashckpt.ckpt_format import dump_json, manifest_path, safetensors_path
from dlrover.flashckpt.collectives import RankGroup
from dlrover.flashckpt.errors import ChecksumError, LayoutError, StorageError
from dlrover.flashckpt.layout import TensorSpec
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage_loader import RankFile, parse_step_manifest, read_rank_file, verify_tensor

__all__ = ["PerRankCheck", "check_per_rank_step"]


def _encode(files: list[RankFile], error: str | None, damaged: bool) -> bytes:
    return dump_json(
        {
            "error": error,
            "damaged": damaged,
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


def _decode(raw: bytes, step: int) -> tuple[list[RankFile], str | None, bool]:
    doc = json.loads(raw)
    files = [
        RankFile(
            int(f["rank"]),
            safetensors_path(step, int(f["rank"])),  # named here, never taken from a peer
            int(f["data_start"]),
            f["tree"],
            tuple(TensorSpec.from_json(t) for t in f["tensors"]),
            tuple(int(c) for c in f["crcs"]),
        )
        for f in doc["files"]
    ]
    error = doc.get("error")
    return files, error if isinstance(error, str) else None, bool(doc.get("damaged"))


def _check_mine(
    storage: Storage, step: int, raw: bytes | None, rank: int, size: int
) -> tuple[list[RankFile], str | None, bool]:
    """This rank's share: the saved ranks it reads and verifies, or the first problem found (and
    whether it is damage: a checksum or size that does not match)."""
    try:
        if raw is None:
            raise StorageError(f"{manifest_path(step)} cannot be read")
        man = parse_step_manifest(raw, step)
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
        return files, None, False
    except ChecksumError as e:
        return [], str(e), True
    except Exception as e:  # this rank's verdict, gathered below: raising here would strand the others
        return [], f"{type(e).__name__}: {e}", False


@attrs.frozen
class PerRankCheck:
    """The outcome of `check_per_rank_step`, the same on every rank.

    Attributes:
        files: every saved rank's checked file, by rank (empty when there is a problem).
        problem: the first problem found, in rank order, or None.
        damaged: the problem is a file that does not match its checksum or size.
    """

    files: list[RankFile]
    problem: str | None = None
    damaged: bool = False


def check_per_rank_step(storage: Storage, group: RankGroup, step: int, raw: bytes | None) -> PerRankCheck:
    """Read and verify every saved rank's files of `step`, the work split over `group`. Collective.

    `raw` is the step's manifest as this rank read it (None: it could not).

    Every rank of `group` must call it for the same step; none raises for what it finds.
    """
    files, error, damaged = _check_mine(storage, step, raw, group.rank, group.size)
    everything = group.gather_bytes(_encode(files, error, damaged))
    found: list[RankFile] = []
    for payload in everything:
        theirs, problem, broken = _decode(payload, step)
        if problem is not None:
            return PerRankCheck([], problem, broken)
        found.extend(theirs)
    return PerRankCheck(sorted(found, key=lambda f: f.rank))
