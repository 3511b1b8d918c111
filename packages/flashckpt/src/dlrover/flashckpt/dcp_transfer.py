"""Moving one DCP file between a local staging directory and a `Storage`, checksummed on the way.

The `Storage` protocol has no "upload this local file" call; it takes an iterable of chunks and
reads into a buffer at an offset. So a file is streamed a chunk at a time in both directions:
memory holds one chunk (`StagingConfig.chunk_bytes`), never the whole file, and the CRC-32 is
computed over the same bytes that go over the wire, in the same pass.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import positive_int
from dlrover.flashckpt.checksum import crc32
from dlrover.flashckpt.dcp_store import FileSum
from dlrover.flashckpt.errors import ChecksumError, StorageError
from dlrover.flashckpt.storage.base import Storage

__all__ = ["StagingConfig", "download_file", "upload_file"]


def _check_parent(_inst: object, _attr: object, value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"staging parent_dir must be a non-empty path string or None, got {value!r}")


@attrs.frozen
class StagingConfig:
    """Where a sharded checkpoint for a non-POSIX storage is staged on local disk.

    Attributes:
        parent_dir: the directory under which each persist and each load makes a private
            (0700) staging directory, removed when it ends (None: the system temp dir,
            ``$TMPDIR`` or /tmp). It needs room for this rank's shard of one step while
            persisting and for the whole checkpoint while loading; the ranks of a host that use
            the same parent share one copy for a load.
        chunk_bytes: bytes moved per storage call when uploading or downloading a file (the
            memory one transfer holds).
    """

    parent_dir: str | None = attrs.field(default=None, validator=_check_parent)
    chunk_bytes: int = attrs.field(default=16 << 20, validator=positive_int)


def _read_chunks(path: Path, chunk_bytes: int, sums: dict[str, int]) -> Iterator[bytes]:
    """The file's bytes, `chunk_bytes` at a time, adding their count and CRC-32 to `sums`.

    Fresh ``bytes`` per chunk: a `Storage` may keep a chunk after asking for the next one.
    """
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                return
            sums["crc32"] = crc32(chunk, sums["crc32"])
            sums["bytes"] += len(chunk)
            yield chunk


def upload_file(storage: Storage, local: Path, remote: str, chunk_bytes: int) -> FileSum:
    """Stream a local file to `remote` in `storage`; returns the size and CRC-32 of what was sent.

    Raises:
        StorageError: the local file cannot be read, or the storage write failed (the write is
            atomic: no partial object is left under `remote`).
    """
    sums = {"bytes": 0, "crc32": 0}
    try:
        written = storage.write_file(remote, _read_chunks(local, chunk_bytes, sums))
    except OSError as e:  # reading the staged file (a backend turns its own errors into StorageError)
        raise StorageError(f"cannot upload {local} to {remote}: {e}") from e
    if written != sums["bytes"]:
        raise StorageError(f"uploading {local} to {remote}: the storage wrote {written} of {sums['bytes']} bytes")
    return {"bytes": sums["bytes"], "crc32": sums["crc32"]}


def download_file(storage: Storage, remote: str, local: Path, expected: FileSum, chunk_bytes: int) -> None:
    """Stream `remote` from `storage` into a new local file, checking it against `expected`.

    The size is checked before a byte is read, the CRC-32 as the bytes arrive; a file that fails
    either is removed, so nothing unverified is ever left for DCP to read.

    Raises:
        ChecksumError: the object is missing, has another size or another CRC-32 (the message
            names `remote`).
        StorageError: the storage failed to answer, or the local file cannot be written.
    """
    if not storage.exists(remote):
        raise ChecksumError(f"{remote} is missing")
    size = storage.size(remote)
    if size != expected.get("bytes"):
        raise ChecksumError(f"{remote} has {size} bytes, the manifest says {expected.get('bytes')} (truncated?)")
    buf = bytearray(min(chunk_bytes, size))
    view = memoryview(buf)
    value = 0
    ok = False
    try:
        with open(local, "xb") as f:
            offset = 0
            while offset < size:
                part = view[: min(chunk_bytes, size - offset)]
                storage.read_into(remote, offset, part)
                value = crc32(part, value)
                f.write(part)
                offset += len(part)
        if value != expected.get("crc32"):
            raise ChecksumError(f"{remote} does not match its checksum in the manifest")
        ok = True
    except OSError as e:
        raise StorageError(f"cannot write {local} (downloading {remote}): {e}") from e
    finally:
        if not ok:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
