"""dlrover.flashckpt: checkpoint into shared memory at memory speed, persist in the background,
restore in seconds.

Start with `FlashCheckpointer`. The parts: `Stager` (training-process side, copies a state into a
shared-memory slot), `MemoryReader` (restores from memory in place), `Saver` (node side, persists
slots to storage and commits), `Committer` and `StorageReader` (the commit protocol and loading
with fallback), `PosixStorage` / `InMemoryStorage` behind the `Storage` protocol.

Names are imported lazily, so a process that only persists bytes (the saver) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlrover.flashckpt.checkpointer import AgreeFn, FlashCheckpointer, agree_single
    from dlrover.flashckpt.client import DetachedSaverSpec, PersistOutcome, SaverClient, ensure_saver
    from dlrover.flashckpt.commit import (
        CommitDecision,
        Committer,
        RetentionPolicy,
        Tracker,
        decide_commit,
        select_removals,
    )
    from dlrover.flashckpt.config import StagerConfig
    from dlrover.flashckpt.dist import common_newest, torch_distributed_agree
    from dlrover.flashckpt.errors import (
        ChecksumError,
        FlashCkptError,
        LayoutError,
        NoCheckpointError,
        SaverUnavailableError,
        SlotBusyError,
        StateStructureError,
        StorageError,
        WorldSizeError,
    )
    from dlrover.flashckpt.events import EventLog, FlashEvent
    from dlrover.flashckpt.memory import LoadedState, MemoryReader, MemorySnapshot
    from dlrover.flashckpt.payloads import payload_from_slot, payload_from_state
    from dlrover.flashckpt.persist import RankPayload, RankRecord, persist_rank
    from dlrover.flashckpt.saver import Saver, SaverConfig, socket_path
    from dlrover.flashckpt.segment import cleanup_stale, remove_run
    from dlrover.flashckpt.slots import BusyPolicy
    from dlrover.flashckpt.stager import SaveResult, SealedNotice, Stager
    from dlrover.flashckpt.storage import FsspecStorage, InMemoryStorage, PosixStorage, Storage
    from dlrover.flashckpt.storage_loader import StorageReader

_EXPORTS: dict[str, str] = {
    "AgreeFn": "dlrover.flashckpt.checkpointer",
    "FlashCheckpointer": "dlrover.flashckpt.checkpointer",
    "agree_single": "dlrover.flashckpt.checkpointer",
    "StagerConfig": "dlrover.flashckpt.config",
    "common_newest": "dlrover.flashckpt.dist",
    "torch_distributed_agree": "dlrover.flashckpt.dist",
    "SaveResult": "dlrover.flashckpt.stager",
    "SealedNotice": "dlrover.flashckpt.stager",
    "Stager": "dlrover.flashckpt.stager",
    "LoadedState": "dlrover.flashckpt.memory",
    "MemoryReader": "dlrover.flashckpt.memory",
    "MemorySnapshot": "dlrover.flashckpt.memory",
    "StorageReader": "dlrover.flashckpt.storage_loader",
    "Saver": "dlrover.flashckpt.saver",
    "SaverConfig": "dlrover.flashckpt.saver",
    "socket_path": "dlrover.flashckpt.saver",
    "DetachedSaverSpec": "dlrover.flashckpt.client",
    "PersistOutcome": "dlrover.flashckpt.client",
    "SaverClient": "dlrover.flashckpt.client",
    "ensure_saver": "dlrover.flashckpt.client",
    "CommitDecision": "dlrover.flashckpt.commit",
    "Committer": "dlrover.flashckpt.commit",
    "RetentionPolicy": "dlrover.flashckpt.commit",
    "Tracker": "dlrover.flashckpt.commit",
    "decide_commit": "dlrover.flashckpt.commit",
    "select_removals": "dlrover.flashckpt.commit",
    "RankPayload": "dlrover.flashckpt.persist",
    "RankRecord": "dlrover.flashckpt.persist",
    "persist_rank": "dlrover.flashckpt.persist",
    "payload_from_slot": "dlrover.flashckpt.payloads",
    "payload_from_state": "dlrover.flashckpt.payloads",
    "FsspecStorage": "dlrover.flashckpt.storage",
    "InMemoryStorage": "dlrover.flashckpt.storage",
    "PosixStorage": "dlrover.flashckpt.storage",
    "Storage": "dlrover.flashckpt.storage",
    "BusyPolicy": "dlrover.flashckpt.slots",
    "EventLog": "dlrover.flashckpt.events",
    "FlashEvent": "dlrover.flashckpt.events",
    "cleanup_stale": "dlrover.flashckpt.segment",
    "remove_run": "dlrover.flashckpt.segment",
    "ChecksumError": "dlrover.flashckpt.errors",
    "FlashCkptError": "dlrover.flashckpt.errors",
    "LayoutError": "dlrover.flashckpt.errors",
    "NoCheckpointError": "dlrover.flashckpt.errors",
    "SaverUnavailableError": "dlrover.flashckpt.errors",
    "SlotBusyError": "dlrover.flashckpt.errors",
    "StateStructureError": "dlrover.flashckpt.errors",
    "StorageError": "dlrover.flashckpt.errors",
    "WorldSizeError": "dlrover.flashckpt.errors",
}

__all__ = [
    "AgreeFn",
    "FlashCheckpointer",
    "agree_single",
    "StagerConfig",
    "common_newest",
    "torch_distributed_agree",
    "SaveResult",
    "SealedNotice",
    "Stager",
    "LoadedState",
    "MemoryReader",
    "MemorySnapshot",
    "StorageReader",
    "Saver",
    "SaverConfig",
    "socket_path",
    "DetachedSaverSpec",
    "PersistOutcome",
    "SaverClient",
    "ensure_saver",
    "CommitDecision",
    "Committer",
    "RetentionPolicy",
    "Tracker",
    "decide_commit",
    "select_removals",
    "RankPayload",
    "RankRecord",
    "persist_rank",
    "payload_from_slot",
    "payload_from_state",
    "FsspecStorage",
    "InMemoryStorage",
    "PosixStorage",
    "Storage",
    "BusyPolicy",
    "EventLog",
    "FlashEvent",
    "cleanup_stale",
    "remove_run",
    "ChecksumError",
    "FlashCkptError",
    "LayoutError",
    "NoCheckpointError",
    "SaverUnavailableError",
    "SlotBusyError",
    "StateStructureError",
    "StorageError",
    "WorldSizeError",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dlrover.flashckpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
