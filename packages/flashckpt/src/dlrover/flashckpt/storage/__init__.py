"""Storage backends behind one `Storage` protocol: POSIX files (default), fsspec object stores
(optional extra ``s3``), in-memory (tests)."""

from dlrover.flashckpt.storage.base import COMMIT_LOCK_NAME, Chunk, CommitLocking, Storage, check_path
from dlrover.flashckpt.storage.fsspec_store import FsspecStorage
from dlrover.flashckpt.storage.location import StorageLocation
from dlrover.flashckpt.storage.memory import InMemoryStorage
from dlrover.flashckpt.storage.posix import PosixStorage

__all__ = [
    "COMMIT_LOCK_NAME",
    "Chunk",
    "CommitLocking",
    "FsspecStorage",
    "InMemoryStorage",
    "PosixStorage",
    "Storage",
    "StorageLocation",
    "check_path",
]
