"""The data position the framework adapters put in a model checkpoint (internal).

It wraps the dataset's progress checkpoint (`dlrover.shard.progress`) with the adapter's format
name and version, so a state from another adapter, version or dataset is refused by name. A state
may also carry the acknowledgements its trainers made after the progress checkpoint was read
(`dlrover.shard.acknowledged`); a restore applies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlrover.common import ConfigError


def make_state(
    fmt: str, version: int, dataset: str, document: str, acknowledged: Sequence[tuple[int, int, bool]] | None = None
) -> dict[str, Any]:
    """The JSON-ready data position of `dataset` at the progress checkpoint `document`, and the
    `(shard_id, consumed, done)` acknowledgements made after it was read."""
    state: dict[str, Any] = {"format": fmt, "version": version, "dataset": dataset, "progress": document}
    if acknowledged is not None:
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
    """The acknowledgements a checked state carries (none when it has no such entry).

    Raises:
        ConfigError: the entry is not a list of `[shard_id, consumed, done]`.
    """
    entries = state.get("acknowledged", [])
    if not isinstance(entries, list):
        raise ConfigError(f"data state acknowledgements must be a list, got {type(entries).__name__}")
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
