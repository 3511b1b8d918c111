"""Sharded checkpoints in storage: a standard DCP directory per step, plus our checksums and commit.

Layout (beside the plain format's ``tracker.json``; one checkpoint directory holds one kind)::

    <root>/tracker.json              {"format": "dlrover-flashckpt/tracker", "version": 1,
                                      "step": 200, "world_size": 2}  (world size that saved it)
    <root>/<step>/.metadata          written by torch.distributed.checkpoint (its own format)
    <root>/<step>/__0_0.distcp ...   DCP data files (any number, any names DCP picks)
    <root>/<step>/rank_00000.done    rank 0's done marker: {"format": "dlrover-flashckpt/dcp-done",
                                      "step", "rank", "files": {name: {"bytes", "crc32"}}}
    <root>/<step>/manifest.json      written by the coordinator once every rank is done:
                                      {"format": "dlrover-flashckpt/dcp-checkpoint", "step",
                                       "world_size", "files": {name: {"bytes", "crc32"}},
                                       "tree": the state's JSON tree (non-tensor values),
                                       "tensor_keys": the DCP key of each tree tensor index,
                                       "sharding": world size and each DTensor's layout}

``<root>/<step>`` without ``manifest.json`` is never loaded. Every DCP file's CRC-32 (zlib) is in
the manifest; loaders check it before DCP reads a byte (DCP itself has no checksums, and its
``.metadata`` is a pickle: checking it first means we only ever unpickle the bytes we wrote).
Non-tensor values are kept out of DCP and stored in the manifest's JSON tree. A user reads the
tensors with plain ``torch.distributed.checkpoint.load`` (keys are dict paths joined by ``.``,
as DCP's planner flattens nested dicts) and the other values from ``manifest.json``.

After a save each rank checksums the data files it wrote itself (DCP names them ``__<rank>_<n>.distcp``),
so on a shared filesystem it reads back pages its own node still caches rather than a peer's over
the network; any other file (``.metadata``, or names DCP may pick in a later version) is taken by
the ranks in turns. Loading verifies the files in turns (file i by rank ``i % world_size``).
When DCP wrote into per-rank staging directories (an object store, see `dcp_site`), a rank holds
only its own files; `checksum_owners` then picks each file's owner among the ranks holding it.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlrover.flashckpt.checksum import crc32_region
from dlrover.flashckpt.ckpt_format import FORMAT_VERSION, load_json, manifest_path
from dlrover.flashckpt.errors import ChecksumError, LayoutError, StorageError

__all__ = [
    "DCP_CHECKPOINT_FORMAT",
    "DCP_DONE_FORMAT",
    "FileSum",
    "checksum_file",
    "checksum_owners",
    "dcp_files",
    "dcp_names",
    "done_doc",
    "manifest_doc",
    "parse_manifest",
    "staged_owners",
    "verify_file",
]

DCP_CHECKPOINT_FORMAT = "dlrover-flashckpt/dcp-checkpoint"
DCP_DONE_FORMAT = "dlrover-flashckpt/dcp-done"

FileSum = dict[str, int]  # {"bytes": n, "crc32": c}


def _ours(name: str) -> bool:
    return name == "manifest.json" or (name.startswith("rank_") and name.endswith(".done")) or ".tmp-" in name


def dcp_names(names: Iterable[str]) -> list[str]:
    """The names of DCP's files among a step directory's entries (ours left out), sorted."""
    return sorted(n for n in names if not _ours(n))


def dcp_files(directory: Path) -> list[str]:
    """The names of DCP's files in a step directory (ours excluded), sorted.

    Raises:
        StorageError: the directory cannot be listed.
    """
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise StorageError(f"cannot list {directory}: {e}") from None
    return dcp_names(n for n in names if (directory / n).is_file())


_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp")


def checksum_owners(
    names: list[str], world_size: int, holders: Mapping[str, Collection[int]] | None = None
) -> dict[str, int]:
    """Which rank checksums (and, for an object store, uploads) each of a step's DCP files.

    A data file DCP's ``FileSystemWriter`` names after a rank of this world goes to that rank (it
    wrote it); every other file goes to the ranks in turns. Each file gets exactly one rank, and
    every rank computes the same answer from the same listing.

    Args:
        names: the step's DCP files (`dcp_files`), in the same order on every rank.
        world_size: the ranks that saved the step.
        holders: the ranks that hold each file (None: every rank sees every file, as in a shared
            directory). With per-rank staging directories a rank can only read what it holds, so
            a file goes to one of its holders: the rank it is named after if that one holds it,
            else its holders in turns.

    Raises:
        LayoutError: (with `holders`) a file is held by no rank of this world.
    """
    owners: dict[str, int] = {}
    turn = 0
    for name in names:
        if holders is None:
            can: list[int] | range = range(world_size)
        else:
            can = sorted({r for r in holders.get(name, ()) if 0 <= r < world_size})
            if not can:
                raise LayoutError(f"{name} is held by no rank of a world of {world_size}")
        m = _RANK_FILE.fullmatch(name)
        if m is not None and int(m.group(1)) in can:
            owners[name] = int(m.group(1))
        else:
            owners[name] = can[turn % len(can)]
            turn += 1
    return owners


def staged_owners(listings: Sequence[Iterable[str]], world_size: int) -> dict[str, int]:
    """Which rank uploads each file when every rank staged its own part of a step.

    Args:
        listings: the DCP files each rank holds in its staging directory, by rank.
        world_size: the ranks that saved the step (``len(listings)``).

    Returns:
        Every file any rank holds, mapped to exactly one of the ranks holding it (see
        `checksum_owners`), so each file is uploaded once.

    Raises:
        LayoutError: `listings` does not have one entry per rank.
    """
    if len(listings) != world_size:
        raise LayoutError(f"expected the listings of {world_size} ranks, got {len(listings)}")
    holders: dict[str, list[int]] = {}
    for rank, listing in enumerate(listings):
        for name in listing:
            holders.setdefault(name, []).append(rank)
    return checksum_owners(sorted(holders), world_size, holders)


def checksum_file(path: Path) -> FileSum:
    """Size and CRC-32 of a file (mapped, so the page cache is read without a copy).

    Raises:
        StorageError: the file cannot be read.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return {"bytes": 0, "crc32": 0}
            with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
                return {"bytes": size, "crc32": crc32_region(mm, 0, size)}
    except (OSError, ValueError) as e:
        raise StorageError(f"cannot read {path}: {e}") from None


def verify_file(path: Path, expected: FileSum) -> None:
    """Check a file against its recorded size and CRC-32.

    Raises:
        ChecksumError: the file is missing, truncated, extended or changed; the message names it.
        StorageError: the file cannot be examined or read (the message names it).
    """
    if not path.is_file():
        raise ChecksumError(f"{path} is missing")
    try:
        size = path.stat().st_size
    except OSError as e:  # removed since is_file, or unreadable metadata: a storage failure
        raise StorageError(f"cannot stat {path}: {e}") from None
    if size != expected.get("bytes"):
        raise ChecksumError(f"{path} has {size} bytes, the manifest says {expected.get('bytes')} (truncated?)")
    got = checksum_file(path)
    if got["crc32"] != expected.get("crc32"):
        raise ChecksumError(f"{path} does not match its checksum in the manifest")


def done_doc(step: int, rank: int, files: dict[str, FileSum]) -> dict[str, Any]:
    """A rank's done marker: the files it checksummed."""
    return {"format": DCP_DONE_FORMAT, "version": FORMAT_VERSION, "step": step, "rank": rank, "files": files}


def manifest_doc(
    step: int,
    *,
    world_size: int,
    done: list[dict[str, Any]],
    listed: list[str],
    tree: dict[str, Any],
    tensor_keys: list[str],
    sharding: dict[str, Any],
) -> dict[str, Any]:
    """The step's manifest from every rank's done marker.

    Args:
        step: the step.
        world_size: ranks that saved it.
        done: the done markers (parsed).
        listed: DCP's files in the step directory; each must have exactly one checksum.
        tree: the state's JSON tree.
        tensor_keys: the DCP key of each tensor index of the tree.
        sharding: the world size and DTensor layouts the state was saved with.

    Raises:
        LayoutError: a file has no checksum, two, or a checksum names a file that is not there.
    """
    files: dict[str, FileSum] = {}
    for doc in done:
        for name, fs in doc["files"].items():
            if name in files:
                raise LayoutError(f"step {step}: {name} was checksummed twice")
            files[name] = {"bytes": int(fs["bytes"]), "crc32": int(fs["crc32"])}
    if sorted(files) != sorted(listed):
        missing = sorted(set(listed) - set(files))
        extra = sorted(set(files) - set(listed))
        raise LayoutError(f"step {step}: files without a checksum {missing}, checksums without a file {extra}")
    return {
        "format": DCP_CHECKPOINT_FORMAT,
        "version": FORMAT_VERSION,
        "step": step,
        "world_size": world_size,
        "files": dict(sorted(files.items())),
        "tree": tree,
        "tensor_keys": tensor_keys,
        "sharding": sharding,
    }


def parse_manifest(raw: bytes, step: int) -> dict[str, Any]:
    """Parse and check a step's manifest.

    Raises:
        LayoutError: it is not a sharded-checkpoint manifest or lacks a field.
    """
    what = manifest_path(step)
    doc = load_json(raw, DCP_CHECKPOINT_FORMAT, what)
    for field, kind in (("files", dict), ("tree", dict), ("tensor_keys", list), ("world_size", int)):
        if not isinstance(doc.get(field), kind):
            raise LayoutError(f"{what} lacks {field!r}")
    if doc.get("step") != step:
        raise LayoutError(f"{what} names step {doc.get('step')!r}")
    return doc
