"""Checkpoints in object storage (S3 and others) through fsspec.

Each `write_file` is a single object PUT (s3fs streams it as a multipart upload that becomes
visible only when complete), so it is atomic without temporary names; if the data source fails
part way, the upload is discarded and the previous object stays. fsspec and the filesystem
implementation (``s3fs`` for S3) are optional dependencies: ``pip install dlrover-flashckpt[s3]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.storage.base import Chunk, check_path

__all__ = ["FsspecStorage"]


class FsspecStorage:
    """Files under ``root`` on an fsspec filesystem.

    It has no `commit_lock` (`CommitLocking`): object stores offer no lock to take, so two writers
    committing at the same moment are kept from moving the tracker back only by its re-read.

    Args:
        fs: an ``fsspec.AbstractFileSystem`` (e.g. ``s3fs.S3FileSystem(...)``).
        root: the checkpoint prefix, e.g. ``"bucket/jobs/j1"``.
    """

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")

    def _p(self, path: str, allow_root: bool = False) -> str:
        if path == "" and allow_root:
            return self.root
        return f"{self.root}/{check_path(path)}"

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        """See `Storage.write_file`."""
        target = self._p(path)
        written = 0
        try:
            f = self.fs.open(target, "wb")
        except OSError as e:
            raise StorageError(f"cannot write {target}: {e}") from e
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                f.write(view)
                written += len(view)
        except BaseException as e:
            # Abort the upload so no partial object becomes visible.
            discard = getattr(f, "discard", None)
            if callable(discard):
                discard()
            # Mark it closed, or its finaliser would close it and upload what was written so far.
            with contextlib.suppress(AttributeError):
                f.closed = True
            if isinstance(e, OSError):
                raise StorageError(f"cannot write {target}: {e}") from e
            raise
        try:
            f.close()
        except OSError as e:
            raise StorageError(f"cannot write {target}: {e}") from e
        self.fs.invalidate_cache(target.rsplit("/", 1)[0])
        return written

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """See `Storage.read_bytes`."""
        p = self._p(path)
        end = None if length is None else offset + length
        try:
            data = bytes(self.fs.cat_file(p, start=offset, end=end))
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot read {p}: {e}") from e
        if length is not None and len(data) != length:
            raise StorageError(f"{p} is truncated: wanted {length} bytes at {offset}, got {len(data)}")
        return data

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        """See `Storage.read_into`."""
        view = buf.cast("B")
        view[:] = self.read_bytes(path, offset, len(view))

    def size(self, path: str) -> int:
        """See `Storage.size`."""
        p = self._p(path)
        try:
            return int(self.fs.size(p))
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot stat {p}: {e}") from e

    def exists(self, path: str) -> bool:
        """See `Storage.exists`."""
        try:
            return bool(self.fs.isfile(self._p(path)))
        except OSError:
            return False

    def list_dir(self, path: str) -> list[str]:
        """See `Storage.list_dir`."""
        p = self._p(path, allow_root=True)
        self.fs.invalidate_cache(p)
        try:
            entries = self.fs.ls(p, detail=False)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StorageError(f"cannot list {p}: {e}") from e
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries if str(e).rstrip("/") != p})

    def remove_tree(self, path: str) -> None:
        """See `Storage.remove_tree`."""
        p = self._p(path)
        try:
            self.fs.rm(p, recursive=True)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"cannot remove {p}: {e}") from e
        self.fs.invalidate_cache(p)
