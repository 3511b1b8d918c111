"""Lay a flattened state out in a slot (the torch side of `dlrover.flashckpt.layout`)."""

from __future__ import annotations

from typing import Any

from dlrover.flashckpt.dtypes import dtype_name
from dlrover.flashckpt.layout import ALIGN, HEADER_SIZE, MIN_MANIFEST_CAPACITY, PAGE, SlotLayout, TensorSpec, align_up
from dlrover.flashckpt.tree import FlatState, path_name

__all__ = ["plan_layout", "unique_names"]


def unique_names(paths: list[tuple[Any, ...]]) -> list[str]:
    """Readable, unique tensor names for leaf paths (a suffix ``#n`` breaks ties)."""
    seen: dict[str, int] = {}
    names = []
    for path in paths:
        base = path_name(path)
        name = base
        while name in seen:
            seen[base] += 1
            name = f"{base}#{seen[base]}"
        seen.setdefault(name, 0)
        names.append(name)
    return names


def plan_layout(flat: FlatState, manifest_len: int, manifest_capacity: int | None = None) -> SlotLayout:
    """Lay out a flattened state: 64-byte aligned tensors after a page-aligned data offset.

    The manifest region is reserved with slack (twice the current manifest, at least 64 KiB) so
    that non-tensor values that change every step (a loss, a data position) rarely move the data.

    Args:
        flat: the state's tree and tensors.
        manifest_len: bytes of the encoded manifest (it depends on the specs only through
            offsets, whose digits are bounded, so the caller estimates with a first encoding).
        manifest_capacity: keep this manifest region (a slot's current one) if it is big enough,
            so the data region does not move.
    """
    names = unique_names([leaf.path for leaf in flat.leaves])
    specs = []
    offset = 0
    for name, leaf in zip(names, flat.leaves, strict=True):
        t = leaf.tensor
        nbytes = t.numel() * t.element_size()
        specs.append(TensorSpec(name, dtype_name(t.dtype), tuple(t.shape), offset, nbytes, leaf.is_ndarray))
        offset = align_up(offset + nbytes, ALIGN)
    if manifest_capacity is None or manifest_capacity < manifest_len + ALIGN:
        manifest_capacity = align_up(max(MIN_MANIFEST_CAPACITY, 2 * manifest_len), PAGE)
    checksum_off = HEADER_SIZE + manifest_capacity
    data_off = align_up(checksum_off + 4 * len(specs), PAGE)
    return SlotLayout(tuple(specs), manifest_capacity, checksum_off, data_off, max(offset, ALIGN))
