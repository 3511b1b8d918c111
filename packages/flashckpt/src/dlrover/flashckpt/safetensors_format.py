"""The safetensors file format, written and parsed by hand so files stream straight from memory.

A file is: an unsigned 64-bit little-endian header length ``N``; ``N`` bytes of UTF-8 JSON
mapping each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative
to the byte after the header, tensors packed without holes) plus an optional ``"__metadata__"``
object of string values; then the tensor bytes, little-endian. The header is padded with spaces
to a multiple of 8 bytes. Any safetensors reader (``safetensors.torch.load_file``) reads our files.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import attrs

from dlrover.flashckpt.errors import LayoutError
from dlrover.flashckpt.layout import TensorSpec

__all__ = ["MAX_HEADER_BYTES", "build_header", "pack_specs", "parse_header"]

MAX_HEADER_BYTES = 100 << 20


def pack_specs(specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    """The same tensors with offsets packed back to back, as a safetensors data section needs."""
    packed = []
    offset = 0
    for spec in specs:
        packed.append(attrs.evolve(spec, offset=offset))
        offset += spec.nbytes
    return tuple(packed)


def build_header(packed: tuple[TensorSpec, ...], metadata: dict[str, str]) -> bytes:
    """The length prefix and JSON header of a safetensors file for packed specs."""
    doc: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    for spec in packed:
        doc[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [spec.offset, spec.offset + spec.nbytes],
        }
    raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def parse_header(prefix: bytes) -> tuple[int, dict[str, Any]]:
    """Parse a safetensors header.

    Args:
        prefix: the file's first bytes: at least 8, and the whole header once its length is known.

    Returns:
        (offset of the data section, the header JSON).

    Raises:
        LayoutError: the length or JSON is malformed.
    """
    if len(prefix) < 8:
        raise LayoutError("safetensors file shorter than its 8-byte header length")
    (n,) = struct.unpack_from("<Q", prefix, 0)
    if n > MAX_HEADER_BYTES:
        raise LayoutError(f"safetensors header length {n} exceeds {MAX_HEADER_BYTES}")
    if len(prefix) < 8 + n:
        raise LayoutError(f"safetensors header needs {8 + n} bytes, got {len(prefix)}")
    try:
        doc = json.loads(prefix[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LayoutError(f"safetensors header is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise LayoutError("safetensors header is not a JSON object")
    return 8 + n, doc
