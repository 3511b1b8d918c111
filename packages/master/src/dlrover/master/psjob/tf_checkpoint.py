"""The sizes in a TensorFlow checkpoint, read without TensorFlow.

The master sizes parameter servers to the model, so it needs the model's variable bytes; it must not import
TensorFlow (hundreds of MB, seconds to import) to get them. A TensorFlow 2 checkpoint (`tf.train.Checkpoint`,
`CheckpointManager`, Keras' `BackupAndRestore`) is a prefix `ckpt-N` with an index `ckpt-N.index` and data files
`ckpt-N.data-0000i-of-0000n`. The index is a LevelDB-format table (what TensorFlow's `tensor_bundle` writes,
uncompressed): an index block of data-block handles, data blocks of prefix-compressed keys, and a footer with
the magic number `0xdb4775248b80fb57`. Its keys are the tensors' checkpoint names and its values serialized
`BundleEntryProto` messages (field 1 the dtype, 2 the shape, 5 the bytes in the data file; a partitioned
tensor's entry lists its slices, each stored under a key of its own starting with a NUL byte). This module reads
just those fields; nothing in the file is executed or unpickled.

A directory's newest checkpoint is the one its `checkpoint` state file names (`model_checkpoint_path: "..."`);
Keras' `BackupAndRestore(backup_dir)` keeps the chief's in `backup_dir/chief`, which is looked at too.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import attrs

from dlrover.common import DLRoverError
from dlrover.master.psjob.state_file import STATE_FILE, unescape

__all__ = ["CheckpointReadError", "CheckpointSizes", "TensorEntry", "newest_checkpoint", "read_index", "sizes_of"]

_MAGIC = 0xDB4775248B80FB57
_FOOTER_BYTES = 48
_BLOCK_TRAILER_BYTES = 5  # compression type, then a masked CRC32C
_NO_COMPRESSION = 0
_MOST_DATA_FILES = 1 << 20  # TensorFlow writes one per device; a header naming more is damaged
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_MODEL_PREFIX = "model/"
_OPTIMIZER_PREFIX = "optimizer/"
_SLOT_MARK = "/.OPTIMIZER_SLOT/"
_KERAS_BACKUP_SUBDIR = "chief"
_PATH_LINE = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"\s*$', re.MULTILINE)


class CheckpointReadError(DLRoverError):
    """A checkpoint's index or state file is missing, truncated or not what TensorFlow writes."""


@attrs.frozen
class TensorEntry:
    """One tensor of a checkpoint as its index describes it.

    Attributes:
        name: its checkpoint key, e.g. `model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE`.
        dtype: TensorFlow's `DataType` enum value (1 float32, 9 int64, 7 string, ...).
        shape: its dimensions (() for a scalar).
        nbytes: its bytes in the data files (for a partitioned tensor, 0: its slices hold the data).
        shard: the data file holding it (`<prefix>.data-<shard>-of-<n>`; TensorFlow writes one per device, so
            under a parameter-server strategy each server's variables are in a file of their own).
    """

    name: str
    dtype: int
    shape: tuple[int, ...]
    nbytes: int
    shard: int = 0

    @property
    def sliced_from(self) -> str | None:
        """For a slice of a partitioned tensor, the full tensor's name; None otherwise."""
        if not self.name.startswith("\0"):
            return None
        return self.name[1:].split("\0", 1)[0]

    @property
    def elements(self) -> int:
        """How many values it holds."""
        return math.prod(self.shape)


@attrs.frozen
class CheckpointSizes:
    """What a checkpoint holds, summed.

    Attributes:
        prefix: the checkpoint's path prefix (`<dir>/ckpt-40`).
        parameter_count: elements of the model's variables (the tensors under the `model/` key; every tensor but
            the optimizer's when there is no such key).
        model_bytes: the bytes of those variables.
        total_bytes: every tensor's bytes: the model, the optimizer's slots and the rest (step counters, ...).
        tensors: how many tensors it lists (slices not counted).
        shard_bytes: the tensors' bytes by data file, in file order (the object graph, a description of the
            saved objects that TensorFlow keeps with the chief's counters, left out): under a parameter-server
            strategy each device writes a file of its own, so the largest is the most state one server holds.
    """

    prefix: str
    parameter_count: int
    model_bytes: int
    total_bytes: int
    tensors: int
    shard_bytes: tuple[int, ...] = ()


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise CheckpointReadError("a varint runs past its block")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message; length-delimited values as bytes."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value
        elif wire in {1, 5}:
            width = 8 if wire == 1 else 4
            if pos + width > end:
                raise CheckpointReadError("a fixed-width field runs past its message")
            yield number, wire, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise CheckpointReadError("a length-delimited field runs past its message")
            yield number, wire, buf[pos : pos + length]
            pos += length
        else:
            raise CheckpointReadError(f"protobuf wire type {wire} is not one a tensor entry uses")


def _shape(buf: bytes) -> tuple[int, ...]:
    dims = []
    for number, _wire, value in _fields(buf):
        if number == 2 and isinstance(value, bytes):  # TensorShapeProto.dim
            size = next((v for n, _w, v in _fields(value) if n == 1 and isinstance(v, int)), 0)
            dims.append(size - (1 << 64) if size >= 1 << 63 else size)  # int64: -1 is an unknown size
        elif number == 3 and value:  # unknown_rank
            return ()
    return tuple(max(d, 0) for d in dims)


def _entry(name: str, buf: bytes) -> TensorEntry:
    dtype, nbytes, shard = 0, 0, 0
    shape: tuple[int, ...] = ()
    for number, _wire, value in _fields(buf):
        if number == 1 and isinstance(value, int):
            dtype = value
        elif number == 2 and isinstance(value, bytes):
            shape = _shape(value)
        elif number == 3 and isinstance(value, int):
            shard = value
        elif number == 5 and isinstance(value, int):
            nbytes = value
    return TensorEntry(name, dtype, shape, nbytes, shard)


def _block(data: bytes, offset: int, size: int) -> tuple[bytes, int]:
    """The contents of the block at (offset, size) and where its restart array starts."""
    if offset < 0 or size < 4 or offset + size + _BLOCK_TRAILER_BYTES > len(data):
        raise CheckpointReadError(f"a block at {offset} of {size} bytes lies outside the {len(data)}-byte index")
    if data[offset + size] != _NO_COMPRESSION:
        raise CheckpointReadError(f"a block is compressed (type {data[offset + size]}); TensorFlow writes none")
    block = data[offset : offset + size]
    restarts = struct.unpack_from("<I", block, size - 4)[0]
    body = size - 4 - 4 * restarts
    if body < 0:
        raise CheckpointReadError(f"a block claims {restarts} restart points it has no room for")
    return block, body


def _block_entries(block: bytes, body: int) -> Iterator[tuple[bytes, bytes]]:
    key = b""
    pos = 0
    while pos < body:
        shared, pos = _varint(block, pos, body)
        unshared, pos = _varint(block, pos, body)
        length, pos = _varint(block, pos, body)
        if shared > len(key) or pos + unshared + length > body:
            raise CheckpointReadError("a block entry runs past its block")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + length]
        pos += length


def _handle(buf: bytes, pos: int = 0) -> tuple[int, int, int]:
    offset, pos = _varint(buf, pos, len(buf))
    size, pos = _varint(buf, pos, len(buf))
    return offset, size, pos


def read_index(path: str | Path) -> list[TensorEntry]:
    """Every tensor a checkpoint index (`<prefix>.index`) lists, in key order; slices of partitioned tensors are
    listed as their own entries with names starting with a NUL character.

    Raises:
        CheckpointReadError: the file cannot be read, or is not a TensorFlow checkpoint index.
    """
    return _read(path)[1]


def _read(path: str | Path) -> tuple[int, list[TensorEntry]]:
    """(the number of data files its header names, its tensors)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointReadError(f"checkpoint index {path} cannot be read: {exc}") from exc
    try:
        if len(data) < _FOOTER_BYTES:
            raise CheckpointReadError(f"{len(data)} bytes is shorter than an index's footer")
        footer = data[-_FOOTER_BYTES:]
        if int.from_bytes(footer[-8:], "little") != _MAGIC:
            raise CheckpointReadError("its footer lacks the table magic number")
        _meta_offset, _meta_size, pos = _handle(footer)
        index_offset, index_size, _ = _handle(footer, pos)
        entries = []
        shards = 1
        for _last_key, handle in _block_entries(*_block(data, index_offset, index_size)):
            offset, size, _ = _handle(handle)
            for key, value in _block_entries(*_block(data, offset, size)):
                if key:
                    entries.append(_entry(key.decode("utf-8", "replace"), value))
                else:  # the bundle's header: field 1 is how many data files there are
                    shards = next((v for n, _w, v in _fields(value) if n == 1 and isinstance(v, int)), shards)
                    if not 1 <= shards <= _MOST_DATA_FILES:
                        raise CheckpointReadError(f"its header names {shards} data files")
        return shards, entries
    except CheckpointReadError as exc:
        raise CheckpointReadError(f"checkpoint index {path} is not a TensorFlow checkpoint index: {exc}") from None


def newest_checkpoint(directory: str | Path) -> Path | None:
    """The prefix of the newest checkpoint its `checkpoint` state file names in `directory`, or in its `chief`
    subdirectory (where Keras' `BackupAndRestore` keeps the chief's backups); None when there is no such file yet
    (nothing saved).

    Raises:
        CheckpointReadError: the state file exists but names no checkpoint.
    """
    for where in (Path(directory), Path(directory) / _KERAS_BACKUP_SUBDIR):
        state = where / STATE_FILE
        try:
            text = state.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointReadError(f"checkpoint state file {state} cannot be read: {exc}") from exc
        found = _PATH_LINE.search(text)
        if found is None:
            raise CheckpointReadError(f"checkpoint state file {state} names no model_checkpoint_path")
        named = Path(unescape(found.group(1)))
        return named if named.is_absolute() else where / named
    return None


def _is_optimizer(name: str) -> bool:
    # A compiled Keras model tracks its optimizer under itself: `model/optimizer/...`.
    return name.startswith(_OPTIMIZER_PREFIX) or _SLOT_MARK in name or "/optimizer/" in name


def sizes_of(prefix: str | Path) -> CheckpointSizes:
    """The sizes of the checkpoint at `prefix` (its index is `<prefix>.index`).

    Raises:
        CheckpointReadError: its index cannot be read.
    """
    files, entries = _read(f"{prefix}.index")
    named = [e for e in entries if e.sliced_from is None and e.name != _OBJECT_GRAPH_KEY]
    model = [e for e in named if e.name.startswith(_MODEL_PREFIX) and not _is_optimizer(e.name)]
    counted = {e.name for e in model or [e for e in named if not _is_optimizer(e.name)]}
    stray = next((e for e in entries if e.shard >= files), None)
    if stray is not None:
        raise CheckpointReadError(f"checkpoint index {prefix}.index puts {stray.name!r} in data file {stray.shard} "
                                  f"of the {files} its header names")  # fmt: skip
    shards = [0] * files
    for e in entries:
        if e.name != _OBJECT_GRAPH_KEY:
            shards[e.shard] += e.nbytes
    return CheckpointSizes(
        prefix=str(prefix),
        parameter_count=sum(e.elements for e in named if e.name in counted),
        # A partitioned variable's data lives in its slices, whose keys name it.
        model_bytes=sum(e.nbytes for e in entries if (e.sliced_from or e.name) in counted),
        total_bytes=sum(e.nbytes for e in entries),
        tensors=len(named),
        shard_bytes=tuple(shards),
    )
