"""The data position the framework adapters put in a model checkpoint (internal).

It wraps the dataset's progress checkpoint (`dlrover.shard.progress`) with the adapter's format
name and version, so a state from another adapter, version or dataset is refused by name.
"""

from __future__ import annotations

from typing import Any

from dlrover.common import ConfigError


def make_state(fmt: str, version: int, dataset: str, document: str) -> dict[str, Any]:
    """The JSON-ready data position of `dataset` at the progress checkpoint `document`."""
    return {"format": fmt, "version": version, "dataset": dataset, "progress": document}


def check_state(fmt: str, version: int, state: Any, dataset: str) -> str:
    """The progress checkpoint inside `state`.

    Raises:
        ConfigError: `state` is not of format `fmt`, not of `version`, or not of `dataset`.
    """
    if not isinstance(state, dict) or state.get("format") != fmt:
        found = state.get("format") if isinstance(state, dict) else state
        raise ConfigError(f"not a {fmt} data state: format {found!r}")
    if state.get("version") != version:
        raise ConfigError(f"data state version {state.get('version')!r} is not supported (this build reads {version})")
    if state.get("dataset") != dataset:
        raise ConfigError(f"data state is for dataset {state.get('dataset')!r}, not {dataset!r}")
    document = state.get("progress")
    if not isinstance(document, str):
        raise ConfigError(f"data state has no progress document (got {type(document).__name__})")
    return document
