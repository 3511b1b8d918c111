"""The data position the framework adapters put in a model checkpoint (internal).

It wraps the dataset's progress checkpoint (`dlrover.shard.progress`) with the adapter's format
name and version, so a state from another adapter, version or dataset is refused by name. A state
may also carry the acknowledgements its trainers made after the progress checkpoint was read
(`dlrover.shard.acknowledged`); a restore applies them.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from dlrover.common import ConfigError

# Acknowledgements travel as one string: base64 of little-endian int64 triples (shard id, consumed,
# done as 0 or 1). A trainer saves the state every step and a group's acknowledgements grow with its
# size; as one string leaf they cost a checkpoint next to nothing, where a list of lists costs every
# writer a walk of three nodes per acknowledgement (24 ms a save for 2,048 of them).
_TRIPLE_BYTES = 24


def pack_acknowledged(acknowledged: Sequence[tuple[int, int, bool]]) -> str:
    """`(shard_id, consumed, done)` entries as one JSON-ready string (`unpack_acknowledged` reads it)."""
    flat = array("q")
    for shard_id, consumed, done in acknowledged:
        flat.extend((shard_id, consumed, 1 if done else 0))
    if sys.byteorder == "big":  # pragma: no cover (the wire form is little-endian everywhere)
        flat.byteswap()
    return base64.b64encode(flat.tobytes()).decode("ascii")


def unpack_acknowledged(text: str) -> list[tuple[int, int, bool]]:
    """The entries `pack_acknowledged` wrote.

    Raises:
        ConfigError: `text` is not base64 of whole little-endian int64 triples whose third value is 0 or 1.
    """
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ConfigError(f"data state acknowledgements are not base64: {exc}") from exc
    if len(raw) % _TRIPLE_BYTES:
        raise ConfigError(
            f"data state acknowledgements hold {len(raw)} bytes, not whole (shard_id, consumed, done) triples "
            f"of {_TRIPLE_BYTES}"
        )
    flat = array("q")
    flat.frombytes(raw)
    if sys.byteorder == "big":  # pragma: no cover
        flat.byteswap()
    out: list[tuple[int, int, bool]] = []
    for i in range(0, len(flat), 3):
        shard_id, consumed, done = flat[i], flat[i + 1], flat[i + 2]
        if done not in (0, 1):
            raise ConfigError(f"data state acknowledgement {i // 3} has done={done}, not 0 or 1")
        out.append((shard_id, consumed, bool(done)))
    return out


def make_state(
    fmt: str,
    version: int,
    dataset: str,
    document: str,
    acknowledged: Sequence[tuple[int, int, bool]] | None = None,
    *,
    packed: bool = True,
) -> dict[str, Any]:
    """The JSON-ready data position of `dataset` at the progress checkpoint `document`, and the
    `(shard_id, consumed, done)` acknowledgements made after it was read (one string,
    `pack_acknowledged`; `packed=False`: a list of `[shard_id, consumed, done]`, as version 2 wrote)."""
    state: dict[str, Any] = {"format": fmt, "version": version, "dataset": dataset, "progress": document}
    if acknowledged is not None:
        if packed:
            state["acknowledged"] = pack_acknowledged(acknowledged)
        else:
            state["acknowledged"] = [[shard_id, consumed, done] for shard_id, consumed, done in acknowledged]
    return state


def check_state(fmt: str, versions: int | tuple[int, ...], state: Any, dataset: str) -> str:
    """The progress checkpoint inside `state`.

    Raises:
        ConfigError: `state` is not of format `fmt`, not of one of `versions`, or not of `dataset`.
    """
    accepted = (versions,) if isinstance(versions, int) else versions
    if not isinstance(state, dict) or state.get("format") != fmt:
        found = state.get("format") if isinstance(state, dict) else state
        raise ConfigError(f"not a {fmt} data state: format {found!r}")
    version = state.get("version")
    if isinstance(version, bool) or version not in accepted:
        reads = " and ".join(str(v) for v in accepted)
        raise ConfigError(f"data state version {version!r} is not supported (this build reads {reads})")
    if state.get("dataset") != dataset:
        raise ConfigError(f"data state is for dataset {state.get('dataset')!r}, not {dataset!r}")
    document = state.get("progress")
    if not isinstance(document, str):
        raise ConfigError(f"data state has no progress document (got {type(document).__name__})")
    return document


def acknowledged_in(state: dict[str, Any]) -> list[tuple[int, int, bool]]:
    """The acknowledgements a checked state carries (none when it has no such entry): a packed
    string (`pack_acknowledged`) or a list of `[shard_id, consumed, done]`.

    Raises:
        ConfigError: the entry is neither.
    """
    entries = state.get("acknowledged", [])
    if isinstance(entries, str):
        return unpack_acknowledged(entries)
    if not isinstance(entries, list):
        kind = type(entries).__name__
        raise ConfigError(f"data state acknowledgements must be a packed string or a list, got {kind}")
    out: list[tuple[int, int, bool]] = []
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry[:2])
            or not isinstance(entry[2], bool)
        ):
            raise ConfigError(f"data state acknowledgement {i} must be [shard_id, consumed, done], got {entry!r}")
        out.append((entry[0], entry[1], entry[2]))
    return out
