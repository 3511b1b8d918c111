"""Broadcast tensors' bytes from one rank through a single staging buffer: bounded memory, no hang.

The tensors travel as one stream of bytes (in order, each in its memory order), cut into pieces the
size of a staging buffer on the process group's device: small tensors share one broadcast, a large
one takes several, and no rank allocates more than the staging buffer (and a contiguous copy of one
non-contiguous tensor) whatever the state's size or device. A copy that fails on a rank (out of
memory, a tensor that cannot be written) is returned, not raised, and that rank still takes part in
every remaining broadcast, so no rank is left waiting in a collective; the caller agrees on the
outcome afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dlrover.flashckpt.collectives import RankGroup

__all__ = ["DEFAULT_CHUNK_BYTES", "Span", "broadcast_stream", "spans"]

DEFAULT_CHUNK_BYTES = 64 << 20

Span = tuple[int, int, int, int]
"""(tensor index, offset in the tensor's bytes, offset in the piece, length)."""

Copy = Callable[[int, int, torch.Tensor], None]
"""Called with (tensor index, offset in its bytes, a uint8 slice of the staging buffer)."""


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

    Returns:
        The first copy failure on this rank (after which it copies nothing more but still takes
        part), or None.
    """
    total = sum(sizes)
    chunk = staging.numel()
    failure: BaseException | None = None
    copy = read if group.rank == src else write
    for start in range(0, total, chunk):
        length = min(chunk, total - start)
        piece = staging[:length]
        parts = spans(sizes, start, length)
        if copy is not None and failure is None and group.rank == src:
            failure = _copy_all(copy, parts, piece)
        group.broadcast_into(piece, src)
        if copy is not None and failure is None and group.rank != src:
            failure = _copy_all(copy, parts, piece)
    return failure


def _copy_all(copy: Copy, parts: list[Span], piece: torch.Tensor) -> BaseException | None:
    try:
        with torch.no_grad():
            for index, offset, at, length in parts:
                copy(index, offset, piece[at : at + length])
    except Exception as e:  # returned: the caller agrees on it with every rank after the stream
        return e
    return None
