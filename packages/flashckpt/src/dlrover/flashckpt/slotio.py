"""Reading and writing a slot's header, manifest, checksums and tensor views in a mapped segment."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from dlrover.flashckpt.checksum import crc32_region
from dlrover.flashckpt.errors import LayoutError
from dlrover.flashckpt.layout import MAGIC, SlotHeader, SlotState, TensorSpec, decode_manifest
from dlrover.flashckpt.segment import ShmSegment

if TYPE_CHECKING:
    import torch

__all__ = [
    "compute_checksums",
    "peek_header",
    "read_checksums",
    "read_header",
    "read_manifest",
    "seal_slot",
    "tensor_views",
    "write_checksums",
    "write_header",
    "write_manifest",
]


def read_header(seg: ShmSegment) -> SlotHeader | None:
    """The slot's header, or None when the slot was never written (all zeros).

    Raises:
        LayoutError: the header is present but malformed.
    """
    raw = bytes(seg.mm[: len(MAGIC)])
    if raw == b"\0" * len(MAGIC):
        return None
    header = SlotHeader.unpack(seg.mm[:128])
    if header.capacity > seg.size:
        raise LayoutError(f"slot {seg.path} claims {header.capacity} bytes but maps {seg.size}")
    return header


def peek_header(path: Path) -> SlotHeader | None:
    """Read a slot file's header without mapping the slot (cheap: one small read).

    Returns:
        The header, or None when the file is missing, empty, unwritten or malformed.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.pread(fd, 128, 0)
    finally:
        os.close(fd)
    if len(raw) < 128 or raw[: len(MAGIC)] == b"\0" * len(MAGIC):
        return None
    try:
        return SlotHeader.unpack(raw)
    except LayoutError:
        return None


def write_header(seg: ShmSegment, header: SlotHeader) -> None:
    """Write `header` at the start of the slot."""
    raw = header.pack()
    seg.mm[: len(raw)] = raw


def write_manifest(seg: ShmSegment, manifest: bytes, offset: int) -> None:
    """Write manifest bytes at `offset`."""
    seg.mm[offset : offset + len(manifest)] = manifest


def read_manifest(seg: ShmSegment, header: SlotHeader) -> tuple[dict[str, object], tuple[TensorSpec, ...]]:
    """The slot's tree and tensor specs, checked against the header's manifest CRC.

    Raises:
        LayoutError: the manifest is corrupt, or a tensor lies outside the data region.
    """
    raw = bytes(seg.mm[header.manifest_off : header.manifest_off + header.manifest_len])
    tree, specs = decode_manifest(raw, header.manifest_crc)
    if len(specs) != header.n_tensors:
        raise LayoutError(f"slot {seg.path}: header says {header.n_tensors} tensors, manifest {len(specs)}")
    for spec in specs:
        if spec.offset < 0 or spec.offset + spec.nbytes > header.data_len:
            raise LayoutError(f"slot {seg.path}: tensor {spec.name!r} lies outside the data region")
    return tree, specs


def tensor_views(seg: ShmSegment, data_off: int, specs: tuple[TensorSpec, ...]) -> list[torch.Tensor]:
    """Typed, shaped views of each tensor's bytes in the slot (no copy)."""
    from dlrover.flashckpt.dtypes import dtype_from_name  # imports torch; the saver never calls this

    views = []
    for spec in specs:
        start = data_off + spec.offset
        raw = seg.u8[start : start + spec.nbytes]
        views.append(raw.view(dtype_from_name(spec.dtype)).view(spec.shape))
    return views


def write_checksums(seg: ShmSegment, offset: int, values: list[int]) -> None:
    """Write the checksum table."""
    raw = struct.pack(f"<{len(values)}I", *values)
    seg.mm[offset : offset + len(raw)] = raw


def read_checksums(seg: ShmSegment, header: SlotHeader) -> list[int]:
    """The checksum table of a sealed slot."""
    n = header.n_tensors
    return list(struct.unpack_from(f"<{n}I", seg.mm, header.checksum_off))


Mapper = Callable[[Callable[[TensorSpec], int], Sequence[TensorSpec]], list[int]]


def compute_checksums(
    seg: ShmSegment, data_off: int, specs: tuple[TensorSpec, ...], mapper: Mapper | None = None
) -> list[int]:
    """CRC-32 of every tensor's bytes in the slot.

    Args:
        seg: the slot.
        data_off: start of its data region.
        specs: the tensors.
        mapper: runs the per-tensor CRCs (e.g. `Copier.map`, on several threads); default serial.
    """
    mm = seg.mm

    def one(spec: TensorSpec) -> int:
        return crc32_region(mm, data_off + spec.offset, spec.nbytes)

    return mapper(one, specs) if mapper is not None else [one(s) for s in specs]


def seal_slot(
    seg: ShmSegment, header: SlotHeader, specs: tuple[TensorSpec, ...], mapper: Mapper | None = None
) -> SlotHeader:
    """Compute and store the checksums of a complete slot and mark it SEALED.

    Returns:
        The new header.
    """
    write_checksums(seg, header.checksum_off, compute_checksums(seg, header.data_off, specs, mapper))
    sealed = attrs.evolve(header, state=SlotState.SEALED)
    write_header(seg, sealed)
    return sealed
