"""The storage contract every backend implements (POSIX files, object stores, the in-memory fake).

Paths are relative, ``/``-separated, and never contain ``..``. `write_file` is atomic: a reader
sees either the whole new file or none of it (POSIX: temporary name, fsync, rename, fsync of the
directory; object stores: a single PUT). Failures raise `StorageError` naming the path.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from dlrover.common import ConfigError
from dlrover.flashckpt.errors import StorageError

__all__ = ["COMMIT_LOCK_NAME", "Chunk", "CommitLocking", "Storage", "check_lock_timeout", "check_path"]

Chunk = bytes | bytearray | memoryview

# The lock file a backend with `CommitLocking` keeps at its root. The leading dot keeps it out of
# the step directories (digits only) and of a user's ``ls``.
COMMIT_LOCK_NAME = ".commit.lock"


def check_path(path: str) -> str:
    """Validate a storage path.

    Raises:
        StorageError: the path is absolute, empty, or climbs with ``..``.
    """
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        raise StorageError(f"invalid storage path {path!r}: relative, '/'-separated, no '.', '..' or empty parts")
    return path


def check_lock_timeout(timeout_s: object) -> None:
    """Refuse a commit lock timeout that is not a finite number of seconds >= 0.

    Raises:
        ConfigError: naming the bad value.
    """
    ok = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if not ok or not 0 <= timeout_s < math.inf:  # type: ignore[operator]
        raise ConfigError(f"commit_lock_timeout_s must be a finite number >= 0, got {timeout_s!r}")


@runtime_checkable
class Storage(Protocol):
    """Where checkpoints are persisted."""

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        """Write the concatenation of `chunks` to `path` atomically and durably; returns bytes written.

        A chunk may be a view of memory that is reused once the next chunk is asked for (or once
        the iterable is exhausted): write or copy each one before asking for the next.
        """
        ...

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` of a file (to the end when `length` is None).

        Raises:
            StorageError: the file is missing or shorter than asked.
        """
        ...

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        """Fill `buf` with bytes of `path` starting at `offset`.

        Raises:
            StorageError: the file is missing or too short (truncated).
        """
        ...

    def size(self, path: str) -> int:
        """The size of a file in bytes. Raises `StorageError` when missing."""
        ...

    def exists(self, path: str) -> bool:
        """Whether a file exists."""
        ...

    def list_dir(self, path: str) -> list[str]:
        """Names directly under a directory ("" is the root), sorted; empty when missing."""
        ...

    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything below it; no error when missing."""
        ...


@runtime_checkable
class CommitLocking(Protocol):
    """A storage that can keep the writers of its tracker apart.

    Two writers can commit into one checkpoint directory at once: the training processes (a
    sharded persist through DCP) and a node saver persisting a failure's snapshot. Each re-reads
    the tracker right before writing it and leaves a newer one alone; holding this lock over the
    re-read and the write closes the window between the two. Object stores have no such lock
    (`FsspecStorage` does not implement it): there the re-read alone narrows the window.
    """

    def commit_lock(self) -> AbstractContextManager[None]:
        """A context manager holding the directory's commit lock while its block runs.

        Raises:
            StorageError: the lock could not be had within the backend's bound (naming the path).
        """
        ...
