"""An in-memory storage: the fake for tests, with faults injected at its seams."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator

from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.storage.base import Chunk, check_lock_timeout, check_path

__all__ = ["InMemoryStorage"]


class InMemoryStorage:
    """Files in a dict, written atomically like the real backends.

    Args:
        capacity_bytes: total bytes it holds before writes fail like a full disk (None: no limit).
        commit_lock_timeout_s: how long `commit_lock` waits for another holder before failing.

    Attributes:
        before_write: called with each path before it is written; raise from it to inject a crash
            or an I/O error at that point (the file is then not written).
    """

    def __init__(self, capacity_bytes: int | None = None, commit_lock_timeout_s: float = 60.0) -> None:
        self._files: dict[str, bytes] = {}
        self._lock = threading.Lock()
        check_lock_timeout(commit_lock_timeout_s)
        self._commit_lock = threading.Lock()
        self.commit_lock_timeout_s = commit_lock_timeout_s
        self.capacity_bytes = capacity_bytes
        self.before_write: Callable[[str], None] | None = None

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        """See `Storage.write_file`."""
        check_path(path)
        if self.before_write is not None:
            self.before_write(path)
        data = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)
        with self._lock:
            used = sum(len(v) for k, v in self._files.items() if k != path)
            if self.capacity_bytes is not None and used + len(data) > self.capacity_bytes:
                raise StorageError(f"cannot write {path}: no space left ({used} of {self.capacity_bytes} bytes used)")
            self._files[path] = data
        return len(data)

    def _get(self, path: str) -> bytes:
        with self._lock:
            try:
                return self._files[check_path(path)]
            except KeyError:
                raise StorageError(f"cannot read {path}: no such file") from None

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """See `Storage.read_bytes`."""
        data = self._get(path)
        end = len(data) if length is None else offset + length
        if end > len(data):
            raise StorageError(f"{path} is truncated: wanted {end - offset} bytes at {offset}, has {len(data)}")
        return data[offset:end]

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        """See `Storage.read_into`."""
        view = buf.cast("B")
        view[:] = self.read_bytes(path, offset, len(view))

    def size(self, path: str) -> int:
        """See `Storage.size`."""
        return len(self._get(path))

    def exists(self, path: str) -> bool:
        """See `Storage.exists`."""
        with self._lock:
            return check_path(path) in self._files

    def list_dir(self, path: str) -> list[str]:
        """See `Storage.list_dir`."""
        prefix = "" if path == "" else check_path(path) + "/"
        with self._lock:
            return sorted({k[len(prefix) :].split("/")[0] for k in self._files if k.startswith(prefix)})

    def remove_tree(self, path: str) -> None:
        """See `Storage.remove_tree`."""
        prefix = check_path(path) + "/"
        with self._lock:
            for k in [k for k in self._files if k.startswith(prefix)]:
                del self._files[k]

    @contextlib.contextmanager
    def commit_lock(self) -> Iterator[None]:
        """See `CommitLocking.commit_lock` (held across the threads of this process)."""
        if not self._commit_lock.acquire(timeout=self.commit_lock_timeout_s):
            raise StorageError(f"the commit lock stayed held by another writer for {self.commit_lock_timeout_s:g} s")
        try:
            yield
        finally:
            self._commit_lock.release()

    def corrupt(self, path: str, offset: int, new: bytes | None = None, truncate: bool = False) -> None:
        """Damage a stored file (test helper): overwrite bytes at `offset`, or truncate there."""
        with self._lock:
            data = bytearray(self._files[path])
            if truncate:
                del data[offset:]
            else:
                data[offset : offset + len(new or b"\xff")] = new or bytes([data[offset] ^ 0xFF])
            self._files[path] = bytes(data)
