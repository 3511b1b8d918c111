"""The binary layout of one shared-memory slot. Pure: bytes in, bytes out.

A slot is one file in ``/dev/shm`` (see `segment`), laid out as::

    [0, 4096)                         header (below), little-endian, zero padded
    [4096, 4096 + manifest_cap)       manifest: UTF-8 JSON, ``manifest_len`` bytes used
    [checksum_off, + 4 * n_tensors)   CRC-32 of each tensor's bytes (valid once state is SEALED)
    [data_off, data_off + data_len)   tensor bytes; each tensor starts at a 64-byte aligned offset

Header fields, in order (struct format ``<8sIIQqQQIIQQQQ``)::

    magic         8s  b"DLRFCKPT"
    version       u32 1
    state         u32 0 EMPTY, 1 WRITING, 2 COMPLETE (bytes final), 3 SEALED (checksums written)
    seq           u64 sequence number, unique and increasing across a rank's slots; newest wins
    step          i64 training step of the snapshot
    manifest_off  u64 4096
    manifest_len  u64 bytes of manifest JSON
    manifest_crc  u32 CRC-32 of the manifest bytes
    n_tensors     u32 number of tensors
    checksum_off  u64 offset of the checksum table
    data_off      u64 offset of the tensor region (page aligned)
    data_len      u64 bytes of the tensor region
    capacity      u64 size of the slot file

The manifest is ``{"format": "dlrover-flashckpt/slot", "version": 1, "tree": <tree>, "tensors":
[{"name", "dtype", "shape", "offset", "nbytes", "ndarray"}]}`` where ``tree`` is the JSON tree of
`dlrover.flashckpt.tree` and ``offset`` is relative to ``data_off``.

A writer moves a slot WRITING -> COMPLETE -> SEALED and bumps ``seq`` when it starts writing; a
reader accepts only COMPLETE or SEALED slots and re-reads the header afterwards to be sure the
slot did not change underneath it (and holds a shared ``flock`` on the file, see `segment`).
"""

from __future__ import annotations

import enum
import json
import struct
import zlib
from typing import Any

import attrs

from dlrover.flashckpt.errors import LayoutError

__all__ = [
    "ALIGN",
    "HEADER_SIZE",
    "MAGIC",
    "LAYOUT_VERSION",
    "SlotHeader",
    "SlotLayout",
    "SlotState",
    "TensorSpec",
    "TreeJsonMemo",
    "align_up",
    "decode_manifest",
    "encode_manifest",
    "encode_specs",
]

MAGIC = b"DLRFCKPT"
LAYOUT_VERSION = 1
HEADER_SIZE = 4096
ALIGN = 64
PAGE = 4096
MIN_MANIFEST_CAPACITY = 64 * 1024
_HEADER = struct.Struct("<8sIIQqQQIIQQQQ")
MANIFEST_FORMAT = "dlrover-flashckpt/slot"


class SlotState(enum.IntEnum):
    """Where a slot is in its write cycle."""

    EMPTY = 0
    WRITING = 1
    COMPLETE = 2
    SEALED = 3


def align_up(n: int, alignment: int) -> int:
    """`n` rounded up to a multiple of `alignment`."""
    return (n + alignment - 1) // alignment * alignment


@attrs.frozen
class TensorSpec:
    """Where one tensor lives in a slot's data region (or a file's data section)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    ndarray: bool = False

    def to_json(self) -> dict[str, Any]:
        """The manifest entry of this tensor."""
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offset": self.offset,
            "nbytes": self.nbytes,
            "ndarray": self.ndarray,
        }

    @classmethod
    def from_json(cls, obj: Any) -> TensorSpec:
        """Parse a manifest entry.

        Raises:
            LayoutError: the entry is malformed.
        """
        try:
            return cls(
                name=str(obj["name"]),
                dtype=str(obj["dtype"]),
                shape=tuple(int(d) for d in obj["shape"]),
                offset=int(obj["offset"]),
                nbytes=int(obj["nbytes"]),
                ndarray=bool(obj.get("ndarray", False)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LayoutError(f"malformed tensor entry {obj!r}: {e}") from None


@attrs.frozen
class SlotHeader:
    """The fixed header at the start of every slot."""

    state: SlotState
    seq: int
    step: int
    manifest_len: int
    manifest_crc: int
    n_tensors: int
    checksum_off: int
    data_off: int
    data_len: int
    capacity: int
    manifest_off: int = HEADER_SIZE
    version: int = LAYOUT_VERSION

    def pack(self) -> bytes:
        """The header's bytes (without the zero padding up to `HEADER_SIZE`)."""
        return _HEADER.pack(
            MAGIC,
            self.version,
            int(self.state),
            self.seq,
            self.step,
            self.manifest_off,
            self.manifest_len,
            self.manifest_crc,
            self.n_tensors,
            self.checksum_off,
            self.data_off,
            self.data_len,
            self.capacity,
        )

    @classmethod
    def unpack(cls, buf: bytes | memoryview) -> SlotHeader:
        """Parse a header.

        Raises:
            LayoutError: wrong magic, unknown version or state, or offsets outside the slot.
        """
        if len(buf) < _HEADER.size:
            raise LayoutError(f"slot header needs {_HEADER.size} bytes, got {len(buf)}")
        fields = _HEADER.unpack_from(buf, 0)
        magic, version, state = fields[0], fields[1], fields[2]
        if magic != MAGIC:
            raise LayoutError(f"bad slot magic {magic!r}, expected {MAGIC!r}")
        if version != LAYOUT_VERSION:
            raise LayoutError(f"unsupported slot layout version {version}, this build reads {LAYOUT_VERSION}")
        try:
            slot_state = SlotState(state)
        except ValueError:
            raise LayoutError(f"unknown slot state {state}") from None
        header = cls(
            state=slot_state,
            seq=fields[3],
            step=fields[4],
            manifest_off=fields[5],
            manifest_len=fields[6],
            manifest_crc=fields[7],
            n_tensors=fields[8],
            checksum_off=fields[9],
            data_off=fields[10],
            data_len=fields[11],
            capacity=fields[12],
        )
        if header.data_off + header.data_len > header.capacity or header.manifest_off + header.manifest_len > (
            header.checksum_off
        ):
            raise LayoutError(f"slot header offsets are inconsistent: {header}")
        return header


@attrs.frozen
class SlotLayout:
    """Where a given state's manifest, checksums and tensors go in a slot.

    `data_signature` identifies the tensor region's layout: two states with the same signature
    reuse a slot without moving any tensor.
    """

    specs: tuple[TensorSpec, ...]
    manifest_capacity: int
    checksum_off: int
    data_off: int
    data_len: int

    @property
    def total_size(self) -> int:
        """Bytes the slot file needs."""
        return self.data_off + self.data_len

    @property
    def data_signature(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """(dtype, shape) of every tensor, in order."""
        return tuple((s.dtype, s.shape) for s in self.specs)


def encode_specs(specs: tuple[TensorSpec, ...]) -> str:
    """The manifest's ``tensors`` list as JSON text (what `encode_manifest` embeds)."""
    return json.dumps([s.to_json() for s in specs], separators=(",", ":"), allow_nan=False)


def _dumps(node: Any) -> str:
    return json.dumps(node, separators=(",", ":"), allow_nan=False)


class TreeJsonMemo:
    """Encodes one state's tree after another, reusing the text of top-level entries that repeat.

    A training state is saved every step with the same shape: the model's and the optimizer's
    entries name the same tensors with the same settings each time, and only a few scalars (the
    step, the data position) change. Comparing an entry with the last save's (in C, on the JSON
    nodes) costs a fraction of encoding it again. Equal nodes encode to the same text, except
    that ``-0.0`` equals ``0.0``: a tree holding one (`FlatState.negative_zero`) is encoded
    whole, and its entries are not reused by the next one.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[Any, str]] = []

    def encode(self, tree: dict[str, Any], negative_zero: bool) -> str:
        """The same text as ``json.dumps(tree, separators=(",", ":"), allow_nan=False)``.

        Args:
            tree: a state's JSON tree (`dlrover.flashckpt.tree.FlatState.tree`); it must not change
                afterwards, as this keeps its entries to compare the next tree's with.
            negative_zero: whether the tree holds ``-0.0`` (`FlatState.negative_zero`).
        """
        entries = tree.get("dict") if len(tree) == 1 else None
        if negative_zero or not isinstance(entries, list):
            self._entries = []
            return _dumps(tree)
        last = self._entries
        texts = [
            last[i][1] if i < len(last) and last[i][0] == entry else _dumps(entry) for i, entry in enumerate(entries)
        ]
        self._entries = list(zip(entries, texts, strict=True))
        return '{"dict":[' + ",".join(texts) + "]}"


def encode_manifest(
    tree: dict[str, Any],
    specs: tuple[TensorSpec, ...],
    specs_json: str | None = None,
    tree_json: str | None = None,
) -> bytes:
    """The manifest JSON of a slot, as UTF-8 bytes.

    Args:
        tree: the state's JSON tree.
        specs: its tensors.
        specs_json: `encode_specs(specs)`, when the caller kept it from an earlier save of the same
            layout (the tensor list is most of a manifest's encoding time; the tree changes each step).
        tree_json: the tree's JSON text, when the caller encoded it (`TreeJsonMemo`).
    """
    tensors = encode_specs(specs) if specs_json is None else specs_json
    head = json.dumps({"format": MANIFEST_FORMAT, "version": LAYOUT_VERSION}, separators=(",", ":"))
    if tree_json is None:
        tree_json = _dumps(tree)
    # The same bytes json.dumps gives for the whole document, keys in this order.
    return f'{head[:-1]},"tree":{tree_json},"tensors":{tensors}}}'.encode()


def decode_manifest(raw: bytes, expected_crc: int | None = None) -> tuple[dict[str, Any], tuple[TensorSpec, ...]]:
    """Parse a slot manifest and check its CRC.

    Returns:
        The tree and the tensor specs.

    Raises:
        LayoutError: the CRC does not match or the JSON is malformed.
    """
    if expected_crc is not None and zlib.crc32(raw) != expected_crc:
        raise LayoutError("slot manifest checksum mismatch")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LayoutError(f"slot manifest is not valid JSON: {e}") from None
    fmt = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
    if fmt != MANIFEST_FORMAT:
        raise LayoutError(f"not a flashckpt slot manifest (format {fmt!r})")
    tree = doc.get("tree")
    tensors = doc.get("tensors")
    if not isinstance(tree, dict) or not isinstance(tensors, list):
        raise LayoutError("slot manifest lacks 'tree' or 'tensors'")
    return tree, tuple(TensorSpec.from_json(t) for t in tensors)
