"""Write one rank's snapshot to storage: safetensors file, JSON manifest, done marker.

The tensor bytes stream from wherever they are (a shared-memory slot, or tensors in this process)
straight into the file. A sealed slot's checksums are written as they are (recomputing them would
only spend CPU the training job may need; bytes damaged in memory after sealing are still caught,
by the loader, which then uses the previous checkpoint); with `verify=True`, or for a snapshot that
has none, each tensor's CRC-32 is computed on the way and must match the sealed one. A `Pacer`
bounds the average rate, for jobs that must keep a persist's share of CPU and disk small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import attrs

from dlrover.flashckpt.checksum import crc32
from dlrover.flashckpt.ckpt_format import (
    FORMAT_VERSION,
    RANK_FORMAT,
    done_path,
    dump_json,
    rank_manifest_path,
    safetensors_path,
)
from dlrover.flashckpt.errors import ChecksumError
from dlrover.flashckpt.layout import TensorSpec
from dlrover.flashckpt.pacing import Pacer
from dlrover.flashckpt.safetensors_format import build_header, pack_specs
from dlrover.flashckpt.storage.base import Chunk, Storage

__all__ = ["RankPayload", "RankRecord", "persist_rank"]

_CHUNK = 16 << 20


@attrs.frozen
class RankPayload:
    """A complete snapshot of one rank, ready to persist.

    Attributes:
        step: training step.
        rank: global rank.
        world_size: ranks in the job.
        tree: the state's JSON tree.
        specs: the tensors (offsets are the source's; the file packs them anew).
        open_tensor: returns a context manager giving tensor ``i``'s bytes as a memoryview.
        expected_crcs: checksums the bytes must match (from a sealed slot), or None.
    """

    step: int
    rank: int
    world_size: int
    tree: dict[str, Any]
    specs: tuple[TensorSpec, ...]
    open_tensor: Callable[[int], AbstractContextManager[memoryview]]
    expected_crcs: tuple[int, ...] | None = None


@attrs.frozen
class RankRecord:
    """What was written for a rank (also the done marker's content)."""

    rank: int
    step: int
    file_bytes: int
    manifest_crc32: int

    def to_json(self) -> dict[str, Any]:
        """The done marker document."""
        return {
            "rank": self.rank,
            "step": self.step,
            "file_bytes": self.file_bytes,
            "manifest_crc32": self.manifest_crc32,
        }


def persist_rank(
    storage: Storage,
    payload: RankPayload,
    verify: bool = False,
    pacer: Pacer | None = None,
    on_streamed: Callable[[], None] | None = None,
) -> RankRecord:
    """Write a rank's files and then its done marker.

    Args:
        storage: where to write.
        payload: the snapshot.
        verify: recompute checksums even when the payload has them, and refuse a mismatch.
        pacer: bounds the rate at which tensor bytes are handed to storage (None: no bound).
        on_streamed: called once storage has taken the last tensor byte (a chunk is handed over
            only when storage asks for the next one), before it makes the file durable: the
            tensors' memory may be reused from then on.

    Raises:
        StorageError: a write failed (full disk...); no done marker is written.
        ChecksumError: the bytes differ from `payload.expected_crcs`; nothing is written.
    """
    packed = pack_specs(payload.specs)
    meta = {"format": "pt", "step": str(payload.step), "rank": str(payload.rank)}
    header = build_header(packed, meta)
    crcs: list[int] = []
    compute = verify or payload.expected_crcs is None

    def chunks() -> Iterator[Chunk]:
        yield header
        for i, spec in enumerate(payload.specs):
            crc = 0
            with payload.open_tensor(i) as view:
                for off in range(0, spec.nbytes, _CHUNK):
                    with view[off : off + _CHUNK] as part:
                        if compute:
                            crc = crc32(part, crc)
                        yield part
                        if pacer is not None:
                            pacer.wrote(len(part))
            if payload.expected_crcs is not None:
                if compute and payload.expected_crcs[i] != crc:
                    msg = f"rank {payload.rank} step {payload.step}: tensor {spec.name!r} changed in memory"
                    raise ChecksumError(msg)
                crc = payload.expected_crcs[i]
            crcs.append(crc)
        if on_streamed is not None:
            on_streamed()

    file_bytes = storage.write_file(safetensors_path(payload.step, payload.rank), chunks())
    manifest = dump_json(
        {
            "format": RANK_FORMAT,
            "version": FORMAT_VERSION,
            "step": payload.step,
            "rank": payload.rank,
            "world_size": payload.world_size,
            "file": safetensors_path(payload.step, payload.rank).split("/")[-1],
            "file_bytes": file_bytes,
            "data_start": len(header),
            "tree": payload.tree,
            "tensors": [{**s.to_json(), "crc32": c} for s, c in zip(packed, crcs, strict=True)],
        }
    )
    storage.write_file(rank_manifest_path(payload.step, payload.rank), [manifest])
    record = RankRecord(payload.rank, payload.step, file_bytes, crc32(manifest))
    storage.write_file(done_path(payload.step, payload.rank), [dump_json(record.to_json())])
    return record
