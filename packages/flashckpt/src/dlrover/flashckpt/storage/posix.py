"""Checkpoints on a POSIX filesystem (the default)."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.storage.base import Chunk, check_path

__all__ = ["PosixStorage"]


class PosixStorage:
    """Files under a root directory, written durably.

    `write_file` writes ``<name>.tmp-<random>`` in the target directory, fsyncs it, renames it over
    the target and fsyncs the directory, so a crash at any point leaves the old file or the new one.

    Args:
        root: the checkpoint directory (created if missing).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _p(self, path: str, allow_root: bool = False) -> Path:
        return self.root if path == "" and allow_root else self.root / check_path(path)

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        """See `Storage.write_file`."""
        target = self._p(path)
        tmp = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        written = 0
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                for chunk in chunks:
                    view = memoryview(chunk).cast("B")
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                        written += n
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        except BaseException as e:
            # Whatever stopped the write (a full disk, a checksum mismatch in the data being
            # streamed), the target keeps its previous content and no temporary file is left.
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(e, OSError):
                raise StorageError(f"cannot write {target}: {e}") from e
            raise
        return written

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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
