"""Checkpoints on a POSIX filesystem (the default)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.storage.base import COMMIT_LOCK_NAME, Chunk, check_lock_timeout, check_path
from dlrover.flashckpt.storage.direct_io import (
    ALIGN,
    DEFAULT_BUFFER_BYTES,
    DIRECT_FLAG,
    MAX_BUFFER_BYTES,
    DirectIORefused,
    write_direct,
)
from dlrover.flashckpt.storage.file_lock import exclusive_flock

__all__ = ["POSIX_DEFAULTS", "PosixStorage", "check_posix_settings"]

_log = logging.getLogger(__name__)


POSIX_DEFAULTS: dict[str, Any] = {
    "writeback_window_bytes": 32 << 20,
    "direct_io": False,
    "direct_buffer_bytes": DEFAULT_BUFFER_BYTES,
}
"""`PosixStorage`'s write settings and their defaults: the options a POSIX `StorageLocation` takes."""


def check_posix_settings(writeback_window_bytes: Any, direct_io: Any, direct_buffer_bytes: Any) -> None:
    """Refuse write settings `PosixStorage` cannot use.

    Raises:
        ConfigError: a setting of the wrong type or out of range.
    """
    if isinstance(writeback_window_bytes, bool) or not isinstance(writeback_window_bytes, int):
        raise ConfigError(f"writeback_window_bytes must be an int, got {writeback_window_bytes!r}")
    if writeback_window_bytes < 0:
        raise ConfigError(f"writeback_window_bytes must be >= 0 (0: off), got {writeback_window_bytes!r}")
    if direct_io is not None and not isinstance(direct_io, bool):
        raise ConfigError(f"direct_io must be None, True or False, got {direct_io!r}")
    if isinstance(direct_buffer_bytes, bool) or not isinstance(direct_buffer_bytes, int):
        raise ConfigError(f"direct_buffer_bytes must be an int, got {direct_buffer_bytes!r}")
    if not 0 < direct_buffer_bytes <= MAX_BUFFER_BYTES or direct_buffer_bytes % ALIGN:
        raise ConfigError(
            f"direct_buffer_bytes must be a multiple of {ALIGN} up to {MAX_BUFFER_BYTES}, got {direct_buffer_bytes}"
        )
    if direct_io is True and not DIRECT_FLAG:
        raise ConfigError("direct_io=True: this platform has no O_DIRECT")


class PosixStorage:
    """Files under a root directory, written durably.

    `write_file` writes ``<name>.tmp-<random>`` in the target directory, fsyncs it, renames it over
    the target and fsyncs the directory, so a crash at any point leaves the old file or the new one.

    Writeback is started every `writeback_window_bytes` instead of all at the final fsync
    (``sync_file_range`` on Linux), and written pages are dropped from the page cache once on
    disk (``posix_fadvise(DONTNEED)``): a multi-GB checkpoint then never fills memory with dirty
    pages that the kernel would flush in one burst (stalling every writer on the machine), nor
    evicts the training job's cached files with clean copies nobody reads back. With `direct_io`
    files are written with ``O_DIRECT`` instead where the filesystem takes it (see
    `dlrover.flashckpt.storage.direct_io`): the disk reads the bytes from a small aligned buffer
    and they never enter the page cache. It is off by default: one request is in flight at a
    time, and on the project's machine it neither persisted faster nor slowed training less than
    the windowed page-cache path. The final fsync makes the file durable either way.

    Tracker writers serialise on an ``flock`` of ``<root>/.commit.lock`` (`commit_lock`), which
    works across processes on one host and on filesystems that support ``flock`` across hosts.

    Args:
        root: the checkpoint directory (created if missing).
        writeback_window_bytes: bytes between writeback starts for files written through the
            page cache (0: leave it all to the fsync and keep the pages cached).
        direct_io: write files of at least `direct_buffer_bytes` with ``O_DIRECT``: False
            (default) never; None where the filesystem takes it (a refusal is logged once; the
            rest of that file and every later one go through the page cache); True always,
            failing the write (`StorageError`) on a filesystem that refuses it.
        direct_buffer_bytes: the aligned buffer of a direct write, a multiple of 4096 bytes.
        commit_lock_timeout_s: how long `commit_lock` waits for another writer before failing.
        clock: time source for that wait.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        writeback_window_bytes: int = POSIX_DEFAULTS["writeback_window_bytes"],
        *,
        direct_io: bool | None = POSIX_DEFAULTS["direct_io"],
        direct_buffer_bytes: int = POSIX_DEFAULTS["direct_buffer_bytes"],
        commit_lock_timeout_s: float = 60.0,
        clock: Clock | None = None,
    ) -> None:
        check_posix_settings(writeback_window_bytes, direct_io, direct_buffer_bytes)
        check_lock_timeout(commit_lock_timeout_s)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.writeback_window_bytes = writeback_window_bytes
        self.commit_lock_timeout_s = commit_lock_timeout_s
        self._clock = clock or SystemClock()
        self._warned_no_flock = False
        self.direct_io = direct_io
        self.direct_buffer_bytes = direct_buffer_bytes
        # Cleared once the filesystem refuses O_DIRECT under direct_io=None (the warning says why).
        self._direct = direct_io is not False and bool(DIRECT_FLAG)

    @property
    def options(self) -> dict[str, Any]:
        """The settings another process needs to open this storage alike: those not at their
        defaults, by keyword (see `StorageLocation`)."""
        settings = {
            "writeback_window_bytes": self.writeback_window_bytes,
            "direct_io": self.direct_io,
            "direct_buffer_bytes": self.direct_buffer_bytes,
        }
        return {k: v for k, v in settings.items() if v != POSIX_DEFAULTS[k]}

    @contextlib.contextmanager
    def commit_lock(self) -> Iterator[None]:
        """See `CommitLocking.commit_lock`.

        On a filesystem without ``flock`` support the block runs unlocked, with one warning per
        storage: the tracker's re-read then narrows the window alone, as on object stores.
        """
        with exclusive_flock(self.root / COMMIT_LOCK_NAME, self.commit_lock_timeout_s, self._clock) as locked:
            if not locked and not self._warned_no_flock:
                self._warned_no_flock = True
                _log.warning(
                    "%s supports no flock: tracker writers are kept apart by re-reading the tracker alone",
                    self.root,
                )
            yield

    def _p(self, path: str, allow_root: bool = False) -> Path:
        return self.root if path == "" and allow_root else self.root / check_path(path)

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        """See `Storage.write_file`."""
        target = self._p(path)
        tmp = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                window = _Writeback(fd, self.writeback_window_bytes)
                if self._direct:
                    written = self._write_direct(fd, chunks, window)
                else:
                    written = _write_buffered(fd, chunks, window)
                os.fsync(fd)
                window.finish(written)
            finally:
                os.close(fd)
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        except BaseException as e:
            # Whatever stopped the write (a full disk, a checksum mismatch in the data being
            # streamed), the target keeps its previous content and no temporary file is left.
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(e, DirectIORefused):
                raise StorageError(f"{self.root} does not support O_DIRECT (direct_io=True): {e}") from e
            if isinstance(e, OSError):
                raise StorageError(f"cannot write {target}: {e}") from e
            raise
        return written

    def _write_direct(self, fd: int, chunks: Iterable[Chunk], window: _Writeback) -> int:
        done = write_direct(
            fd, chunks, self.direct_buffer_bytes, fallback=self.direct_io is None, on_buffered=window.wrote
        )
        if done.refused is not None and self._direct:
            self._direct = False  # later files go through the page cache from their start
            _log.warning(
                "%s refuses O_DIRECT (%s): checkpoints are written through the page cache", self.root, done.refused
            )
        return done.written

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """See `Storage.read_bytes`."""
        p = self._p(path)
        try:
            with open(p, "rb") as f:
                f.seek(offset)
                data = f.read() if length is None else f.read(length)
        except OSError as e:
            raise StorageError(f"cannot read {p}: {e}") from e
        if length is not None and len(data) != length:
            raise StorageError(f"{p} is truncated: wanted {length} bytes at {offset}, got {len(data)}")
        return data

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        """See `Storage.read_into`."""
        p = self._p(path)
        view = buf.cast("B")
        try:
            with open(p, "rb", buffering=0) as f:
                f.seek(offset)
                got = 0
                while got < len(view):
                    n = f.readinto(view[got:])
                    if not n:
                        raise StorageError(f"{p} is truncated: wanted {len(view)} bytes at {offset}, got {got}")
                    got += n
        except OSError as e:
            raise StorageError(f"cannot read {p}: {e}") from e

    def size(self, path: str) -> int:
        """See `Storage.size`."""
        p = self._p(path)
        try:
            return p.stat().st_size
        except OSError as e:
            raise StorageError(f"cannot stat {p}: {e}") from e

    def exists(self, path: str) -> bool:
        """See `Storage.exists`."""
        return self._p(path).is_file()

    def list_dir(self, path: str) -> list[str]:
        """See `Storage.list_dir`."""
        p = self._p(path, allow_root=True)
        try:
            return sorted(os.listdir(p))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StorageError(f"cannot list {p}: {e}") from e

    def remove_tree(self, path: str) -> None:
        """See `Storage.remove_tree`."""
        p = self._p(path)
        try:
            shutil.rmtree(p)
        except FileNotFoundError:
            return
        except OSError as e:
            raise StorageError(f"cannot remove {p}: {e}") from e
        _fsync_dir(p.parent)


def _write_buffered(fd: int, chunks: Iterable[Chunk], window: _Writeback) -> int:
    """Write `chunks` through the page cache, window by window (see `_Writeback`)."""
    written = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]
            written += n
        window.wrote(written)
    return written


class _Writeback:
    """Starts writeback window by window and drops each window from the cache once it is on disk.

    Window k is queued for writeback when it is full, and waited for (then dropped) when window
    k + 1 is full: the disk works on one window while the writer fills the next.

    A failed ``sync_file_range`` raises `OSError`: waiting on writeback reports *and clears* the
    file's writeback error, so the final fsync would return 0 for a window the disk lost. Where the
    call is unsupported (ENOSYS, EINVAL, ESPIPE) windowing is switched off for this file and the
    fsync alone makes it durable.
    """

    def __init__(self, fd: int, window: int) -> None:
        self._fd = fd
        self._window = window
        self._started = 0  # bytes [0, started) are queued for writeback
        self._dropped = 0  # bytes [0, dropped) are on disk and out of the cache

    def wrote(self, total: int) -> None:
        if not self._window:
            return
        while total - self._started >= self._window:
            if not _sync_range(self._fd, self._started, self._window, _SYNC_START):
                self._window = 0
                return
            if self._started > self._dropped:
                if not _sync_range(self._fd, self._dropped, self._started - self._dropped, _SYNC_WAIT):
                    self._window = 0
                    return
                _drop(self._fd, self._dropped, self._started - self._dropped)
                self._dropped = self._started
            self._started += self._window

    def finish(self, total: int) -> None:
        """After the fsync: every byte is on disk, drop the rest from the cache."""
        if self._window and total > self._dropped:
            _drop(self._fd, self._dropped, total - self._dropped)


# sync_file_range(2) flags: start writeback; wait for earlier writeback, write, wait for it.
_SYNC_START = 2
_SYNC_WAIT = 1 | 2 | 4


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", fn)


_sync_file_range = _load_sync_file_range()


# sync_file_range is not available for this file (filesystem, file type or kernel): skip windowing.
_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EINVAL, errno.ESPIPE})


def _sync_range(fd: int, offset: int, nbytes: int, flags: int) -> bool:
    """Runs sync_file_range; False where it is unsupported, `OSError` where it failed."""
    if _sync_file_range is None:
        return False
    if _sync_file_range(fd, offset, nbytes, flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    # Any other error (EIO, ENOSPC...) means written data may be lost, and the wait has already
    # consumed the error the final fsync would have reported: fail the write here.
    raise OSError(err, f"sync_file_range failed: {os.strerror(err)}")


def _drop(fd: int, offset: int, nbytes: int) -> None:
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
