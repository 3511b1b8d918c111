"""Broadcast tensors' bytes from one rank through a single staging buffer: bounded memory, no hang.

The tensors travel as one stream of bytes (in order, each in its memory order), cut into pieces at
most the size of a staging buffer on the process group's device: small tensors share one
broadcast, a tensor of `ALONE_BYTES` or more has pieces of its own, and no rank allocates more
than the staging buffer (and a contiguous copy of one non-contiguous tensor) whatever the state's
size or device. A piece within one tensor whose bytes are contiguous on the group's device moves
in place, with no staging copy. A copy that fails on a rank (out of memory, a tensor that cannot
be written) is returned, not raised, and that rank still takes part in every remaining broadcast,
so no rank is left waiting in a collective; the caller agrees on the outcome afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dlrover.flashckpt.collectives import RankGroup

__all__ = ["ALONE_BYTES", "DEFAULT_CHUNK_BYTES", "Copy", "Direct", "Span", "broadcast_stream", "pieces", "spans"]

DEFAULT_CHUNK_BYTES = 64 << 20
ALONE_BYTES = 1 << 20  # a tensor this large is moved on its own (in place where it can be)

Span = tuple[int, int, int, int]
"""(tensor index, offset in the tensor's bytes, offset in the piece, length)."""

Copy = Callable[[int, int, torch.Tensor], None]
"""Called with (tensor index, offset in its bytes, the piece's uint8 bytes for that part): the
staging buffer's slice, or the tensor's own bytes when the piece was moved in place (the copy is
then nothing to do)."""

Direct = Callable[[int], torch.Tensor | None]
"""A tensor's own bytes (a flat uint8 view on the group's device) for a piece to move in place,
or None when they are not contiguous there."""


def pieces(sizes: Sequence[int], chunk: int, alone_bytes: int = ALONE_BYTES) -> list[tuple[int, int]]:
    """How the stream is cut: (start, length) of each piece, in order, each at most `chunk`.

    Tensors smaller than `alone_bytes` (and `chunk`) are packed together; a larger one gets
    pieces of its own, so that a rank whose tensor is contiguous on the group's device moves it
    in place.
    """
    out: list[tuple[int, int]] = []
    packed_start = packed_len = 0
    pos = 0
    for size in sizes:
        alone = size >= alone_bytes or size > chunk
        if alone or packed_len + size > chunk:
            if packed_len:
                out.append((packed_start, packed_len))
            packed_start, packed_len = pos, 0
        if alone:
            out.extend((pos + at, min(chunk, size - at)) for at in range(0, size, chunk))
            packed_start = pos + size
        else:
            packed_len += size
        pos += size
    if packed_len:
        out.append((packed_start, packed_len))
    return out


def spans(sizes: Sequence[int], start: int, length: int) -> list[Span]:
    """The parts of the tensors that bytes ``[start, start + length)`` of the stream hold.

    Args:
        sizes: each tensor's size in bytes, in stream order.
        start: where the piece starts in the stream.
        length: the piece's length.
    """
    out: list[Span] = []
    base = 0
    end = start + length
    for index, size in enumerate(sizes):
        lo, hi = max(start, base), min(end, base + size)
        if lo < hi:
            out.append((index, lo - base, lo - start, hi - lo))
        base += size
        if base >= end:
            break
    return out


def broadcast_stream(
    group: RankGroup,
    src: int,
    sizes: Sequence[int],
    staging: torch.Tensor,
    *,
    read: Copy | None = None,
    write: Copy | None = None,
    direct: Direct | None = None,
) -> BaseException | None:
    """Move the stream of `sizes` bytes from group rank `src` to every rank.

    Args:
        group: the ranks.
        src: the sending rank; it passes `read`, which fills a staging slice with a tensor's
            bytes. The others pass `write`, which stores a staging slice into a tensor.
        sizes: each tensor's size in bytes, in order (the same on every rank).
        staging: a contiguous uint8 buffer on ``group.device``; pieces are at most its size.
        read: the sender's copy into the staging buffer.
        write: a receiver's copy out of it.
        direct: this rank's view of a tensor's own bytes: a piece that lies within one tensor
            moves in place, without the staging copy (each rank decides for itself; a broadcast
            only needs the same length everywhere).

    Returns:
        The first copy failure on this rank (after which it copies nothing more but still takes
        part), or None.
    """
    failure: BaseException | None = None
    copy = read if group.rank == src else write
    for start, length in pieces(sizes, staging.numel()):
        parts = spans(sizes, start, length)
        piece = _in_place(direct, parts) if failure is None else None
        if piece is None:
            piece = staging[:length]
        if copy is not None and failure is None and group.rank == src:
            failure = _copy_all(copy, parts, piece)
        group.broadcast_into(piece, src)
        if copy is not None and failure is None and group.rank != src:
            failure = _copy_all(copy, parts, piece)
    return failure


def _in_place(direct: Direct | None, parts: list[Span]) -> torch.Tensor | None:
    if direct is None or len(parts) != 1:
        return None
    index, offset, _, length = parts[0]
    try:
        whole = direct(index)
    except Exception:  # moved through the staging buffer instead
        return None
    return None if whole is None else whole[offset : offset + length]


def _copy_all(copy: Copy, parts: list[Span], piece: torch.Tensor) -> BaseException | None:
    try:
        with torch.no_grad():
            for index, offset, at, length in parts:
                copy(index, offset, piece[at : at + length])  # a piece moved in place: a no-op copy
    except Exception as e:  # returned: the caller agrees on it with every rank after the stream
        return e
    return None
