"""Names and JSON documents of a checkpoint in storage. Readable without this package::

    <root>/tracker.json                   {"format": "dlrover-flashckpt/tracker", "version": 1,
                                           "step": 200, "world_size": 2}
    <root>/<step>/rank_00000.safetensors  rank 0's tensors (a standard safetensors file)
    <root>/<step>/rank_00000.json         rank 0's manifest: step, rank, world_size, the state's JSON
                                          tree (non-tensor values, see dlrover.flashckpt.tree), and
                                          per tensor: name, dtype, shape, nbytes, crc32 (zlib CRC-32
                                          of its bytes in the safetensors file)
    <root>/<step>/rank_00000.done         rank 0's done marker: {"rank", "step", "manifest_crc32",
                                          "file_bytes"}, written after the two files above
    <root>/<step>/manifest.json           written by the coordinator once every rank is done: step,
                                          world_size, and per rank its files, sizes and manifest CRC

Every file is written atomically (temporary name, fsync, rename, directory fsync). The tracker is
written last; it names the newest checkpoint whose every file is complete.
"""

from __future__ import annotations

import json
from typing import Any

from dlrover.flashckpt.errors import LayoutError

__all__ = [
    "CHECKPOINT_FORMAT",
    "RANK_FORMAT",
    "TRACKER_FORMAT",
    "TRACKER_PATH",
    "dump_json",
    "done_path",
    "load_json",
    "manifest_path",
    "rank_manifest_path",
    "safetensors_path",
    "step_dir",
]

TRACKER_PATH = "tracker.json"
TRACKER_FORMAT = "dlrover-flashckpt/tracker"
RANK_FORMAT = "dlrover-flashckpt/rank"
CHECKPOINT_FORMAT = "dlrover-flashckpt/checkpoint"
FORMAT_VERSION = 1


def step_dir(step: int) -> str:
    """The directory of a step."""
    if step < 0:
        raise LayoutError(f"checkpoint step must be >= 0, got {step}")
    return str(step)


def safetensors_path(step: int, rank: int) -> str:
    """A rank's tensor file."""
    return f"{step_dir(step)}/rank_{rank:05d}.safetensors"


def rank_manifest_path(step: int, rank: int) -> str:
    """A rank's JSON manifest."""
    return f"{step_dir(step)}/rank_{rank:05d}.json"


def done_path(step: int, rank: int) -> str:
    """A rank's done marker."""
    return f"{step_dir(step)}/rank_{rank:05d}.done"


def manifest_path(step: int) -> str:
    """The checkpoint's manifest, written at commit."""
    return f"{step_dir(step)}/manifest.json"


def dump_json(doc: dict[str, Any]) -> bytes:
    """Canonical JSON bytes (no NaN: non-finite floats are encoded by the tree)."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False, sort_keys=True).encode("utf-8")


def load_json(raw: bytes, expected_format: str, what: str) -> dict[str, Any]:
    """Parse a JSON document and check its format tag.

    Raises:
        LayoutError: naming `what` when the bytes are not that document.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LayoutError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != expected_format:
        raise LayoutError(f"{what} is not a {expected_format} document")
    if doc.get("version") != FORMAT_VERSION:
        raise LayoutError(f"{what} has version {doc.get('version')!r}; this build reads {FORMAT_VERSION}")
    return doc
