"""Writing a file with ``O_DIRECT`` through a small aligned buffer, past the page cache.

A buffered write copies every byte into the page cache, and the disk then reads them from there:
the checkpoint crosses memory twice more than it has to, and streams through the CPU caches of
the training job beside it. With ``O_DIRECT`` the disk reads from the writer's own buffer, so a
chunk is copied once, into a buffer a few MiB long that stays in the cache, and the page cache is
left alone.

``O_DIRECT`` needs the buffer's address, the length and the file offset aligned (to the device's
logical block size, at most `ALIGN` on the devices we know). The stream is packed into a
page-aligned buffer and written in multiples of `ALIGN`. The file is opened without the flag and
``fcntl`` sets it when the first full buffer is written, so a file smaller than the buffer (a
manifest, a done marker) is written buffered and never pays for it, and a filesystem refuses the
flag in one place: at that ``fcntl``, or at a write (EINVAL). A refusal either raises
`DirectIORefused` or, with ``fallback``, has the rest of the file written through the page cache;
so does a short write (its offset is no longer aligned). The tail under `ALIGN` bytes is written
without the flag; the caller's ``fsync`` makes every byte durable either way.

The copy into the buffer is a C ``memmove`` called through ctypes, which releases the GIL like
the ``write`` beside it: a saver inside the agent, or a persist thread of the training process,
leaves the interpreter to the other threads.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Callable, Iterable

import attrs

from dlrover.flashckpt.storage.base import Chunk

__all__ = [
    "ALIGN",
    "DEFAULT_BUFFER_BYTES",
    "DIRECT_FLAG",
    "MAX_BUFFER_BYTES",
    "DirectIORefused",
    "DirectWrite",
    "write_direct",
]

ALIGN = 4096
"""Alignment of every direct write's address, length and offset (a multiple of 512)."""

DEFAULT_BUFFER_BYTES = 8 << 20
MAX_BUFFER_BYTES = 1 << 30  # one write(2) moves at most about 2 GiB

_write = os.write  # tests stand a filesystem that refuses direct writes in for it
_set_flags = fcntl.fcntl  # and one that refuses the flag itself

DIRECT_FLAG: int = getattr(os, "O_DIRECT", 0)
"""``os.O_DIRECT`` where the platform has it, else 0 (then files are written buffered)."""


class DirectIORefused(OSError):
    """The filesystem refused ``O_DIRECT`` (EINVAL at ``fcntl`` or at a write) and no fallback was allowed."""


@attrs.frozen
class DirectWrite:
    """What `write_direct` did.

    Attributes:
        written: bytes written.
        refused: why the filesystem refused ``O_DIRECT`` (the rest went through the page cache),
            or None.
    """

    written: int
    refused: str | None


def _address(buffer: Chunk) -> int:
    """The address of a buffer's first byte (read-only buffers too, which ctypes cannot take)."""
    import numpy as np  # on first use: the agent imports this module on its start-up path

    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


class _DirectWriter:
    """Packs a stream into an aligned buffer and writes it out block by block."""

    def __init__(self, fd: int, buffer_bytes: int, fallback: bool, on_buffered: Callable[[int], None]) -> None:
        self._fd = fd
        self._fallback = fallback
        self._on_buffered = on_buffered
        # An aligned stretch of a slightly larger array: freed with its last view, whatever an
        # exception's traceback still holds (an mmap would refuse to close under such a view).
        import numpy as np  # on first use (see `_address`)

        raw = np.empty(buffer_bytes + ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGN
        self._buf = raw[start : start + buffer_bytes]
        self._view = self._buf.data
        self._base = int(self._buf.ctypes.data)
        self._fill = 0
        self.mode = "buffered-until-full"  # then "direct", or "buffered" after a refusal
        self.refused: str | None = None
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
                if self.mode == "buffered-until-full":
                    self._go_direct()
                self._drain(self._fill)

    def finish(self) -> int:
        """Write what is left: the aligned part directly (if writing directly), the tail buffered."""
        aligned = self._fill - self._fill % ALIGN
        if aligned and self.mode == "direct":
            self._drain(aligned)
        if self._fill:
            self._to_buffered()
            self._drain(self._fill)
        return self.written

    def _go_direct(self) -> None:
        try:
            _set_flags(self._fd, fcntl.F_SETFL, _set_flags(self._fd, fcntl.F_GETFL) | DIRECT_FLAG)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._refuse(f"setting O_DIRECT: {e}")
            return
        self.mode = "direct"

    def _drain(self, nbytes: int) -> None:
        """Write the buffer's first `nbytes` and move any bytes after them to its start."""
        view = self._view[:nbytes]
        while view:
            try:
                n = _write(self._fd, view)
            except OSError as e:
                if e.errno != errno.EINVAL or self.mode != "direct":
                    raise
                self._refuse(f"a direct write at offset {self.written}: {e}")
                continue
            view = view[n:]
            self.written += n
            if self.mode != "direct":
                self._on_buffered(self.written)
            elif view:
                self._to_buffered()  # a short write leaves the offset unaligned
        rest = self._fill - nbytes
        if rest:
            ctypes.memmove(self._base, self._base + nbytes, rest)
        self._fill = rest

    def _refuse(self, why: str) -> None:
        if not self._fallback:
            raise DirectIORefused(errno.EINVAL, f"the filesystem refused O_DIRECT ({why})")
        self.refused = why
        self._to_buffered()

    def _to_buffered(self) -> None:
        if self.mode == "direct":
            _set_flags(self._fd, fcntl.F_SETFL, _set_flags(self._fd, fcntl.F_GETFL) & ~DIRECT_FLAG)
        self.mode = "buffered"


def write_direct(
    fd: int,
    chunks: Iterable[Chunk],
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    *,
    fallback: bool = True,
    on_buffered: Callable[[int], None] | None = None,
) -> DirectWrite:
    """Write `chunks`, in order, to `fd` (opened for writing, without ``O_DIRECT``, at offset 0).

    The caller fsyncs: the tail, a file smaller than the buffer, and what follows a refusal or a
    short write may still be in the page cache.

    Args:
        fd: the file.
        chunks: the file's bytes.
        buffer_bytes: the aligned buffer's size, a multiple of `ALIGN` up to `MAX_BUFFER_BYTES`.
        fallback: after a refusal, write the rest through the page cache (else raise).
        on_buffered: called with the bytes written so far after each write through the page
            cache (windowed writeback).

    Raises:
        ValueError: `buffer_bytes` is not a multiple of `ALIGN` within bounds.
        DirectIORefused: the filesystem refused ``O_DIRECT`` and `fallback` is off.
        OSError: a write failed (ENOSPC, EIO...).
    """
    if not 0 < buffer_bytes <= MAX_BUFFER_BYTES or buffer_bytes % ALIGN:
        raise ValueError(
            f"the direct-write buffer must be a multiple of {ALIGN} bytes up to {MAX_BUFFER_BYTES}, got {buffer_bytes}"
        )
    writer = _DirectWriter(fd, buffer_bytes, fallback, on_buffered or (lambda _: None))
    for chunk in chunks:
        writer.feed(chunk)
    return DirectWrite(writer.finish(), writer.refused)
