"""dlrover.flashckpt: checkpoint into shared memory at memory speed, persist in the background,
restore in seconds.

Start with `FlashCheckpointer`. The parts: `Stager` (training-process side, copies a state into a
shared-memory slot), `MemoryReader` (restores from memory in place), `Saver` (node side, persists
slots to storage and commits), `SaverHost` (the node's savers inside the ``dlrover-run`` agent,
which names its socket in ``DLROVER_FLASHCKPT_HOST``), `Committer` and `StorageReader` (the
commit protocol and loading with fallback), `PosixStorage` / `InMemoryStorage` behind the
`Storage` protocol. Sharded (FSDP2/DTensor) state: `ShardedCheckpointer`; a sharded step a node
saver wrote rank by rank reads, resharded, through ``torch.distributed.checkpoint.load`` with
`ShardLocalReader` (from `rank_shards` and `shard_metadata`). `SaverLink` connects a rank to its
node's saver (`SaverMode`).

Names are imported lazily, so a process that only persists bytes (the saver) never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrover.common.lazy import lazy_exports

if TYPE_CHECKING:
    from dlrover.flashckpt.agree import AgreeFn, agree_single
    from dlrover.flashckpt.checkpointer import FlashCheckpointer
    from dlrover.flashckpt.checksum import CRC32_BACKEND, crc32
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
    from dlrover.flashckpt.dcp_transfer import StagingConfig
    from dlrover.flashckpt.deepspeed_adapter import deepspeed_state, load_deepspeed_state
    from dlrover.flashckpt.dist import common_newest, default_group_agree, torch_distributed_agree
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
    from dlrover.flashckpt.host import (
        EnsureAction,
        EnsureDecision,
        HostedSaver,
        HostRuns,
        SaverHost,
        SaverHostConfig,
        SaverRequest,
        host_socket_path,
        request_saver,
    )
    from dlrover.flashckpt.job_env import (
        HOST_SOCKET_ENV_VAR,
        JOB_ID_ENV_VAR,
        CheckpointIdentity,
        DistState,
        current_dist_state,
        resolve_identity,
        safe_job_id,
    )
    from dlrover.flashckpt.memory import LoadedState, MemoryReader, MemorySnapshot
    from dlrover.flashckpt.pacing import PERSIST_MB_S_PER_CPU, Pacer, default_persist_bandwidth_mb_s, pace_delay
    from dlrover.flashckpt.payloads import payload_from_slot, payload_from_state
    from dlrover.flashckpt.persist import RankPayload, RankRecord, persist_rank
    from dlrover.flashckpt.pinning import CudaErrorPending, CudaHostPinner, FakeHostPinner, HostPinner, PinError
    from dlrover.flashckpt.priority import lower_process_priority
    from dlrover.flashckpt.replicated import ReplicatedLoader
    from dlrover.flashckpt.saver import Saver, SaverConfig, socket_path
    from dlrover.flashckpt.saver_link import SaverLink, SaverMode
    from dlrover.flashckpt.segment import cleanup_stale, remove_run
    from dlrover.flashckpt.shard_local import ShardLocalReader, rank_shards, shard_metadata
    from dlrover.flashckpt.sharded import ShardedCheckpointer, get_sharded_state, set_sharded_state
    from dlrover.flashckpt.slots import BusyPolicy
    from dlrover.flashckpt.stager import SaveResult, SealedNotice, Stager
    from dlrover.flashckpt.storage import FsspecStorage, InMemoryStorage, PosixStorage, Storage, StorageLocation
    from dlrover.flashckpt.storage_loader import StorageReader

_EXPORTS: dict[str, str] = {
    "CRC32_BACKEND": "dlrover.flashckpt.checksum",
    "crc32": "dlrover.flashckpt.checksum",
    "Pacer": "dlrover.flashckpt.pacing",
    "PERSIST_MB_S_PER_CPU": "dlrover.flashckpt.pacing",
    "default_persist_bandwidth_mb_s": "dlrover.flashckpt.pacing",
    "pace_delay": "dlrover.flashckpt.pacing",
    "lower_process_priority": "dlrover.flashckpt.priority",
    "AgreeFn": "dlrover.flashckpt.agree",
    "FlashCheckpointer": "dlrover.flashckpt.checkpointer",
    "agree_single": "dlrover.flashckpt.agree",
    "StagerConfig": "dlrover.flashckpt.config",
    "common_newest": "dlrover.flashckpt.dist",
    "torch_distributed_agree": "dlrover.flashckpt.dist",
    "default_group_agree": "dlrover.flashckpt.dist",
    "JOB_ID_ENV_VAR": "dlrover.flashckpt.job_env",
    "CheckpointIdentity": "dlrover.flashckpt.job_env",
    "DistState": "dlrover.flashckpt.job_env",
    "current_dist_state": "dlrover.flashckpt.job_env",
    "resolve_identity": "dlrover.flashckpt.job_env",
    "safe_job_id": "dlrover.flashckpt.job_env",
    "SaveResult": "dlrover.flashckpt.stager",
    "SealedNotice": "dlrover.flashckpt.stager",
    "Stager": "dlrover.flashckpt.stager",
    "LoadedState": "dlrover.flashckpt.memory",
    "MemoryReader": "dlrover.flashckpt.memory",
    "MemorySnapshot": "dlrover.flashckpt.memory",
    "CudaErrorPending": "dlrover.flashckpt.pinning",
    "CudaHostPinner": "dlrover.flashckpt.pinning",
    "FakeHostPinner": "dlrover.flashckpt.pinning",
    "HostPinner": "dlrover.flashckpt.pinning",
    "PinError": "dlrover.flashckpt.pinning",
    "StorageReader": "dlrover.flashckpt.storage_loader",
    "ReplicatedLoader": "dlrover.flashckpt.replicated",
    "Saver": "dlrover.flashckpt.saver",
    "SaverConfig": "dlrover.flashckpt.saver",
    "socket_path": "dlrover.flashckpt.saver",
    "DetachedSaverSpec": "dlrover.flashckpt.client",
    "PersistOutcome": "dlrover.flashckpt.client",
    "SaverClient": "dlrover.flashckpt.client",
    "ensure_saver": "dlrover.flashckpt.client",
    "HOST_SOCKET_ENV_VAR": "dlrover.flashckpt.job_env",
    "EnsureAction": "dlrover.flashckpt.host",
    "EnsureDecision": "dlrover.flashckpt.host",
    "HostedSaver": "dlrover.flashckpt.host",
    "HostRuns": "dlrover.flashckpt.host",
    "SaverHost": "dlrover.flashckpt.host",
    "SaverHostConfig": "dlrover.flashckpt.host",
    "SaverRequest": "dlrover.flashckpt.host",
    "host_socket_path": "dlrover.flashckpt.host",
    "request_saver": "dlrover.flashckpt.host",
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
    "StorageLocation": "dlrover.flashckpt.storage",
    "BusyPolicy": "dlrover.flashckpt.slots",
    "EventLog": "dlrover.flashckpt.events",
    "FlashEvent": "dlrover.flashckpt.events",
    "cleanup_stale": "dlrover.flashckpt.segment",
    "remove_run": "dlrover.flashckpt.segment",
    "ShardedCheckpointer": "dlrover.flashckpt.sharded",
    "ShardLocalReader": "dlrover.flashckpt.shard_local",
    "rank_shards": "dlrover.flashckpt.shard_local",
    "shard_metadata": "dlrover.flashckpt.shard_local",
    "SaverLink": "dlrover.flashckpt.saver_link",
    "SaverMode": "dlrover.flashckpt.saver_link",
    "StagingConfig": "dlrover.flashckpt.dcp_transfer",
    "get_sharded_state": "dlrover.flashckpt.sharded",
    "set_sharded_state": "dlrover.flashckpt.sharded",
    "deepspeed_state": "dlrover.flashckpt.deepspeed_adapter",
    "load_deepspeed_state": "dlrover.flashckpt.deepspeed_adapter",
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
    "default_group_agree",
    "JOB_ID_ENV_VAR",
    "CheckpointIdentity",
    "DistState",
    "current_dist_state",
    "resolve_identity",
    "safe_job_id",
    "CRC32_BACKEND",
    "crc32",
    "Pacer",
    "PERSIST_MB_S_PER_CPU",
    "default_persist_bandwidth_mb_s",
    "pace_delay",
    "lower_process_priority",
    "SaveResult",
    "SealedNotice",
    "Stager",
    "LoadedState",
    "MemoryReader",
    "MemorySnapshot",
    "CudaErrorPending",
    "CudaHostPinner",
    "FakeHostPinner",
    "HostPinner",
    "PinError",
    "StorageReader",
    "ReplicatedLoader",
    "Saver",
    "SaverConfig",
    "socket_path",
    "DetachedSaverSpec",
    "PersistOutcome",
    "SaverClient",
    "ensure_saver",
    "HOST_SOCKET_ENV_VAR",
    "EnsureAction",
    "EnsureDecision",
    "HostedSaver",
    "HostRuns",
    "SaverHost",
    "SaverHostConfig",
    "SaverRequest",
    "host_socket_path",
    "request_saver",
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
    "StorageLocation",
    "BusyPolicy",
    "EventLog",
    "FlashEvent",
    "cleanup_stale",
    "remove_run",
    "ShardedCheckpointer",
    "ShardLocalReader",
    "rank_shards",
    "shard_metadata",
    "SaverLink",
    "SaverMode",
    "StagingConfig",
    "get_sharded_state",
    "set_sharded_state",
    "deepspeed_state",
    "load_deepspeed_state",
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


if not TYPE_CHECKING:  # so mypy checks every imported name against the imports above
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
