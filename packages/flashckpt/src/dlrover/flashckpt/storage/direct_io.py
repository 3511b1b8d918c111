"""Writing a file with ``O_DIRECT`` through a small aligned buffer, past the page cache.

A buffered write copies every byte into the page cache, and the disk then reads them from there:
the checkpoint crosses memory twice more than it has to, and streams through the CPU caches of
the training job beside it. With ``O_DIRECT`` the disk reads from the writer's own buffer, so a
chunk is copied once, into a buffer a few MiB long that stays in the cache, and the page cache is
left alone.

``O_DIRECT`` needs the buffer's address, the length and the file offset aligned (to the device's
logical block size, at most `ALIGN` on the devices we know). The stream is packed into a
page-aligned buffer and written in multiples of `ALIGN`; the tail under `ALIGN` bytes is written
without ``O_DIRECT`` (``fcntl`` clears the flag on the open file), and the caller's ``fsync``
makes it durable with the rest. A filesystem that refuses a direct write (EINVAL) or writes only
part of one gets the rest of the file buffered: the file's bytes are the same either way.

The copy into the buffer is a C ``memmove`` called through ctypes, which releases the GIL like
the ``write`` beside it: a saver inside the agent, or a persist thread of the training process,
leaves the interpreter to the other threads.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Iterable

import numpy as np

from dlrover.flashckpt.storage.base import Chunk

__all__ = ["ALIGN", "DEFAULT_BUFFER_BYTES", "DIRECT_FLAG", "write_direct"]

ALIGN = 4096
"""Alignment of every direct write's address, length and offset (a multiple of 512)."""

DEFAULT_BUFFER_BYTES = 8 << 20

_write = os.write  # tests stand a filesystem that refuses direct writes in for it

DIRECT_FLAG: int = getattr(os, "O_DIRECT", 0)
"""``os.O_DIRECT`` where the platform has it, else 0 (then files are written buffered)."""


def _address(buffer: Chunk) -> int:
    """The address of a buffer's first byte (read-only buffers too, which ctypes cannot take)."""
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


class _DirectWriter:
    """Packs a stream into an aligned buffer and writes it out block by block."""

    def __init__(self, fd: int, buffer_bytes: int) -> None:
        self._fd = fd
        # An aligned stretch of a slightly larger array: freed with its last view, whatever an
        # exception's traceback still holds (an mmap would refuse to close under such a view).
        raw = np.empty(buffer_bytes + ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGN
        self._buf = raw[start : start + buffer_bytes]
        self._view = self._buf.data
        self._base = int(self._buf.ctypes.data)
        self._fill = 0
        self.direct = True
        self.written = 0

    def feed(self, chunk: Chunk) -> None:
        src = memoryview(chunk).cast("B")
        if not src:
            return
        address = _address(src)
        done = 0
        while done < len(src):
            n = min(len(src) - done, len(self._buf) - self._fill)
            ctypes.memmove(self._base + self._fill, address + done, n)
            self._fill += n
            done += n
            if self._fill == len(self._buf):
                self._drain(self._fill)

    def finish(self) -> int:
        """Write what is left: the aligned part directly, the tail buffered; returns the byte count."""
        aligned = self._fill - self._fill % ALIGN
        if aligned:
            self._drain(aligned)
        if self._fill:
            self._buffered_from_here()
            self._drain(self._fill)
        return self.written

    def _drain(self, nbytes: int) -> None:
        """Write the buffer's first `nbytes` and move any bytes after them to its start."""
        view = self._view[:nbytes]
        while view:
            try:
                n = _write(self._fd, view)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered_from_here()  # this filesystem refuses direct writes after all
                continue
            view = view[n:]
            self.written += n
            if view and self.direct:
                self._buffered_from_here()  # a short write leaves the offset unaligned
        rest = self._fill - nbytes
        if rest:
            ctypes.memmove(self._base, self._base + nbytes, rest)
        self._fill = rest

    def _buffered_from_here(self) -> None:
        if self.direct:
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~DIRECT_FLAG)
            self.direct = False


def write_direct(fd: int, chunks: Iterable[Chunk], buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> int:
    """Write `chunks`, in order, to `fd` (opened with ``O_DIRECT``, at offset 0); returns the bytes written.

    The caller fsyncs: the tail, and the blocks of a filesystem that took the rest buffered,
    may still be in the page cache.

    Args:
        fd: the file, opened for writing with `DIRECT_FLAG`.
        chunks: the file's bytes.
        buffer_bytes: the aligned buffer's size, a positive multiple of `ALIGN`.

    Raises:
        ValueError: `buffer_bytes` is not a positive multiple of `ALIGN`.
        OSError: a write failed (ENOSPC, EIO...).
    """
    if buffer_bytes <= 0 or buffer_bytes % ALIGN:
        raise ValueError(f"the direct-write buffer must be a positive multiple of {ALIGN} bytes, got {buffer_bytes}")
    writer = _DirectWriter(fd, buffer_bytes)
    for chunk in chunks:
        writer.feed(chunk)
    return writer.finish()
