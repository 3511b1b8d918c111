"""Flash checkpoints of sharded (FSDP2 / DTensor) state: local shards in shared memory, DCP in storage.

Use::

    from dlrover.flashckpt.sharded import ShardedCheckpointer, get_sharded_state, set_sharded_state

    ckpt = ShardedCheckpointer(StagerConfig(job_id, run_id, rank=rank, world_size=ws), "/ckpt")
    state = get_sharded_state(model, optimizer)          # DTensor leaves, via the public DSD API
    loaded = ckpt.load(state)                            # collective: memory, else storage (resharded)
    set_sharded_state(model, optimizer, loaded.state)
    for step in ...:
        train_step()
        ckpt.save(step, state)                           # local shards -> shared memory, returns
        if step % 100 == 0:
            ckpt.persist(step)                           # collective: DCP save, checksums, commit

What goes where:

* `save` copies each rank's **local** shards (``DTensor.to_local()``) and the non-tensor values
  into its shared-memory slots through the ordinary `Stager`, beside a JSON description of the
  sharding (world size, each DTensor's global shape, placements and mesh shape).
* `load` first asks every rank which steps it holds in memory *with the current sharding*; when
  all ranks hold one, each copies its shards from memory into the existing local tensors (no
  allocation). Otherwise it loads the newest committed checkpoint from storage through
  ``torch.distributed.checkpoint.load``, which reshards: a checkpoint saved on N ranks loads on
  M. Every DCP file's CRC-32 is checked first (the ranks share the reading); a damaged step is
  skipped with a warning naming the file, and the previous committed one is used. A step can
  also be one a node saver wrote rank by rank from shared memory, after the training processes
  died (each rank's local shards in a safetensors file; the staged layout names where each shard
  lies in its tensor): it loads resharded the same way, through `shard_local.ShardLocalReader`.
* `persist` writes the staged snapshot of a step (not the live tensors, which training may be
  changing) with ``torch.distributed.checkpoint.save`` and a ``FileSystemWriter`` into
  ``<root>/<step>/``, then each rank checksums its share of the files and writes its done marker,
  and the coordinator (rank 0) writes the manifest and moves the tracker (see `dcp_store`).

Every method marked collective must be called by every rank of the process group in the same
order. Without an initialised process group the checkpointer runs as a single rank (plain tensor
states; useful for tests and tools).

Storage: a POSIX path (local disk or a shared filesystem mounted on every node), which DCP's
public ``FileSystemWriter``/``FileSystemReader`` write and read in place; or any other `Storage`
(S3 through `FsspecStorage`), for which DCP writes and reads a private local staging copy that is
streamed to and from the storage, checksummed on the way (see `dcp_site` for the flow and its
cost: local disk for this rank's shard while persisting, for the whole checkpoint while loading).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageReader
from torch.distributed.tensor import DTensor

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.flashckpt.ckpt_format import (
    CHECKPOINT_FORMAT,
    done_path,
    dump_json,
    load_json,
    manifest_path,
    step_dir,
)
from dlrover.flashckpt.client import SaverClient
from dlrover.flashckpt.collectives import RankGroup
from dlrover.flashckpt.commit import CommitDecision, Committer, RetentionPolicy, decide_commit
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dcp_site import DcpSite, NodeShare, StagedDcpSite, dcp_site, node_share
from dlrover.flashckpt.dcp_store import (
    DCP_DONE_FORMAT,
    checksum_owners,
    dcp_files,
    done_doc,
    manifest_doc,
    parse_manifest,
    staged_owners,
)
from dlrover.flashckpt.dcp_transfer import StagingConfig
from dlrover.flashckpt.dtypes import dtype_from_name
from dlrover.flashckpt.errors import (
    ChecksumError,
    FlashCkptError,
    LayoutError,
    NoCheckpointError,
    StateStructureError,
    StorageError,
)
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.host import HOST_SOCKET_ENV_VAR
from dlrover.flashckpt.layout import SlotState, TensorSpec, decode_manifest
from dlrover.flashckpt.memory import LoadedState, MemoryReader
from dlrover.flashckpt.per_rank_step import check_per_rank_step
from dlrover.flashckpt.restore import apply_values
from dlrover.flashckpt.saver_link import SaverLink, SaverMode, check_saver_mode
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.shard_local import ShardLocalReader, rank_shards, shard_metadata, state_node_of
from dlrover.flashckpt.shard_tree import RANK_FILES_LOADABLE
from dlrover.flashckpt.sharded_state import (
    ShardedSplit,
    ShardInfo,
    chunk_offsets,
    dcp_grouped,
    rejoin,
    skeleton,
    split_sharded,
)
from dlrover.flashckpt.slotio import peek_header, read_header, read_manifest
from dlrover.flashckpt.stager import SaveResult, Stager
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage.location import StorageLocation
from dlrover.flashckpt.storage.posix import PosixStorage
from dlrover.flashckpt.tree import build_tree, flatten_state

_log = logging.getLogger(__name__)

__all__ = ["ShardedCheckpointer", "get_sharded_state", "set_sharded_state"]


def get_sharded_state(
    model: torch.nn.Module,
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] = (),
    options: StateDictOptions | None = None,
) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` from ``torch.distributed.checkpoint.state_dict.get_state_dict``.

    With the default options an FSDP2 model's tensors are DTensors sharing memory with its
    parameters and optimizer state, so restoring into them restores the training state.

    Args:
        model: the (FSDP-wrapped, DDP or plain) model.
        optimizers: its optimizer(s); none for a model-only state.
        options: passed to ``get_state_dict`` (``full_state_dict`` must stay False: the point is
            saving shards).
    """
    opts = options or StateDictOptions()
    if opts.full_state_dict:
        raise StateStructureError("get_sharded_state needs full_state_dict=False (sharded state)")
    optims = _optims(optimizers)
    model_sd, optim_sd = get_state_dict(model, optims, options=opts)
    return {"model": model_sd, "optim": optim_sd} if optims else {"model": model_sd}


def set_sharded_state(
    model: torch.nn.Module,
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    state: dict[str, Any],
    options: StateDictOptions | None = None,
) -> None:
    """Apply a state from `get_sharded_state` (restored by `ShardedCheckpointer.load`) to the model
    and optimizers through ``torch.distributed.checkpoint.state_dict.set_state_dict``."""
    optims = _optims(optimizers)
    set_state_dict(
        model,
        optims,
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}) if optims else {},
        options=options or StateDictOptions(),
    )


def _optims(optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer]) -> tuple[torch.optim.Optimizer, ...]:
    if isinstance(optimizers, torch.optim.Optimizer):
        return (optimizers,)
    return tuple(optimizers)


class ShardedCheckpointer:
    """Saves sharded state to shared memory and persists it with DCP (see the module docstring).

    Args:
        config: the stager's settings; `rank` and `world_size` must be this process's in `group`.
        storage_dir: the checkpoint directory, a POSIX path every rank can reach (or pass `storage`).
        storage: where checkpoints go instead of `storage_dir`: a `PosixStorage` is used in place
            exactly like `storage_dir`; any other `Storage` (e.g. `FsspecStorage` on S3) through a
            local staging copy (see `dlrover.flashckpt.dcp_site`).
        group: the process group (None: the default group, or a single rank when none is up).
        retention: which committed steps the coordinator keeps (None keeps all).
        dcp_thread_count: DCP writer threads per rank.
        staging: where a non-POSIX `storage` is staged on local disk (default `StagingConfig()`:
            the system temp dir); not used for POSIX storage, which DCP writes in place.
        saver: the node saver (see `saver_link`). With one, when a training process dies the
            saver persists the newest step every rank holds, rank by rank (`shard_local`),
            loadable resharded, unless storage committed it or a newer step already (a failure
            persist the saver holds back, `failure_persist_hold_s`, waits for the restart; a
            process that closes cleanly leaves nothing to persist). `persist_restored` then asks
            the saver for the restored step instead of writing it with DCP. Needs POSIX storage.
            The saver writes only states whose DTensors are all placed by exactly `Shard` or
            `Replicate` (`sharded_state.boxed_placements`): asked for explicitly (``"auto"``,
            ``"connect"``), `save` refuses any other; by default (None) the agent's saver is
            used under ``dlrover-run`` with POSIX storage, and a state with other placements is
            then left to DCP alone (a ``saver_cannot_write`` event and a warning, once), as is
            every state with ``"none"`` or outside ``dlrover-run``. With a saver the constructor
            registers with it (bounded by the agent's answer); the saver owns the run's shared
            memory (`close` keeps it, the saver removes it when the job ends), its failure
            persists follow the saver's retention, and a step restored from memory is persisted
            by it (`restored_persist` stays None). ``saver="none"`` opts out of all of that.
        persist_restored: when `load` restores a step from memory (the processes restarted, after
            a failure as a rule), persist it in the background unless storage already has it,
            as the plain checkpointer's node saver persists a failure's snapshot: a sharded
            persist needs every rank, so it can only run once they are back. It needs a
            `group` of the checkpointer's own; without one a ``restored_not_persisted`` event
            says so and `persist(step)` is left to the caller.
        clock: time source for the stager and events.

    Raises:
        ConfigError: neither or both of `storage_dir` and `storage`, a `storage` that is not a
            `Storage`, a missing staging parent directory, or a bad `dcp_thread_count`.
        FlashCkptError: `config` disagrees with the process group on rank or world size.
        SaverUnavailableError: (a saver, by default under ``dlrover-run``) the saver cannot be
            reached; ``saver="none"`` does without one.
    """

    def __init__(
        self,
        config: StagerConfig,
        storage_dir: str | os.PathLike[str] | None = None,
        *,
        storage: Storage | None = None,
        group: Any = None,
        retention: RetentionPolicy | None = None,
        dcp_thread_count: int = 1,
        staging: StagingConfig | None = None,
        persist_restored: bool = True,
        saver: SaverMode | None = None,
        clock: Clock | None = None,
    ) -> None:
        posix_dir = storage_dir if storage_dir is not None else getattr(storage, "root", None)
        if not isinstance(storage, PosixStorage | None):
            posix_dir = None
        self._saver_asked = saver is not None
        if saver is None:
            saver = "auto" if os.environ.get(HOST_SOCKET_ENV_VAR) and posix_dir is not None else "none"
        check_saver_mode(saver, None if posix_dir is None else str(posix_dir))
        if saver == "connect" and posix_dir is None:
            raise ConfigError(f"a node saver (saver={saver!r}) writes to a POSIX storage_dir, not to {storage!r}")
        self._g = RankGroup(group)
        self._persist_restored = persist_restored
        if (config.rank, config.world_size) != (self._g.rank, self._g.size):
            raise FlashCkptError(
                f"config says rank {config.rank} of {config.world_size}, "
                f"the process group rank {self._g.rank} of {self._g.size}"
            )
        if dcp_thread_count < 1:
            raise ConfigError(f"dcp_thread_count must be >= 1, got {dcp_thread_count!r}")
        if storage_dir is not None and storage is None:
            storage = PosixStorage(Path(storage_dir))
        elif storage_dir is not None or storage is None:
            raise ConfigError(
                f"ShardedCheckpointer needs exactly one of storage_dir or storage, got {storage_dir!r} and {storage!r}"
            )
        self.config = config
        self._site: DcpSite = dcp_site(storage, staging)
        self.storage = self._site.storage
        # The checkpoint directory when DCP writes in place (POSIX), else None.
        self.root: Path | None = self.storage.root if isinstance(self.storage, PosixStorage) else None
        self._committer = Committer(self.storage, retention)
        self._clock = clock or SystemClock()
        self._threads = dcp_thread_count
        self.events = EventLog()
        assert self.root is not None or saver == "none"
        location = None if self.root is None else StorageLocation.of(self.storage)
        self._link = SaverLink(config, location, saver, events=self.events, clock=self._clock)
        on_sealed = self._link.notify_sealed if self._link.client is not None else None
        # With a saver, the saver removes the run's memory when the job ends.
        self.stager = Stager(config, clock=self._clock, on_sealed=on_sealed, owner=None if saver == "none" else False)
        self.stager.events = self.events
        self._reader = MemoryReader(config, self._clock)
        self._last: ShardedSplit | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="flashckpt-dcp")
        self._pending: list[Future[CommitDecision]] = []
        self._share: NodeShare | None = None
        self._layouts: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._warned_saver = False
        self.restored_persist: Future[CommitDecision] | None = None
        """The background persist the last `load` started (`persist_restored`), or None."""

    @property
    def client(self) -> SaverClient | None:
        """The connection to the node's saver (None without one: ``saver="none"``, or the default
        outside ``dlrover-run`` or with non-POSIX storage)."""
        return self._link.client

    # -- memory --------------------------------------------------------------------------------

    def prepare(self, state: Any) -> None:
        """Allocate and pre-fault the shared memory for `state` (optional; see `Stager.prepare`)."""
        split = split_sharded(state)
        self.stager.prepare(self._staged(split))

    def save(self, step: int, state: Any) -> SaveResult:
        """Copy this rank's shards of `state` into shared memory and return (not collective).

        Raises:
            StateStructureError: an unsupported leaf (nothing is written).
            SlotBusyError: no slot was free and the busy policy is ``raise``.
        """
        split = split_sharded(state)
        result = self.stager.save(step, self._staged(split))
        if result.saved:
            self._last = split
        return result

    def _staged(self, split: ShardedSplit) -> dict[str, Any]:
        return {"sharding": self._describe(split), "state": split.local}

    def _describe(self, split: ShardedSplit) -> dict[str, Any]:
        """The staged sharding description: `ShardedSplit.describe`, plus each DTensor's local
        chunk offsets (`chunk_offsets`), so a snapshot's files can be read back resharded without
        DCP's own (see `shard_local`).

        Each layout is described once and remembered, keyed by the live objects (the mesh object
        stands for this rank's place in it): this runs on every save, and describing a layout
        afresh (the mesh's shape, DCP's planning) costs tens of microseconds a tensor.

        It also says whether a node saver's per-rank files of this state could be loaded again
        (`RANK_FILES_LOADABLE`): only when every DTensor is placed by exactly `Shard` or
        `Replicate`. The placements are the same on every rank, so every rank decides alike, and
        the saver, which reads the flag from the snapshot, refuses the same states.
        """
        unboxed: list[tuple[str, ShardInfo]] = []

        def describe_shard(key: str, shard: ShardInfo) -> dict[str, Any]:
            layout = (key, shard.mesh, shard.placements, shard.shape)
            info = self._layouts.get(layout)
            if info is None:
                tensor = split.dcp[key]
                assert isinstance(tensor, DTensor)  # shards describe DTensor leaves only
                info = {**shard.describe(), "offsets": chunk_offsets(key, tensor)}
                self._layouts[layout] = info
            if not shard.boxed:
                unboxed.append((key, shard))
            return dict(info)

        description = split.describe(self.config.world_size, describe_shard)
        description[RANK_FILES_LOADABLE] = not unboxed
        if unboxed and self._link.client is not None:
            key, shard = unboxed[0]
            self._saver_cannot_write(key, [str(p) for p in shard.placements])
        return description

    def _saver_cannot_write(self, key: str, placements: list[str]) -> None:
        """A DTensor the node saver's per-rank files cannot place (see the `saver` argument)."""
        why = (
            "every DTensor must be placed by Shard or Replicate only, so that the saver's files load again: "
            f"{key!r} has {placements}"
        )
        if self._saver_asked:
            raise StateStructureError(f"with a node saver (saver={self._link.mode!r}) {why}; use saver='none'")
        if not self._warned_saver:
            self._warned_saver = True
            reason = (
                f"the node saver cannot write this state ({why}): it will not persist it after a failure; "
                "only persist(), persist_async() and persist_restored write it (DCP)"
            )
            _log.warning("%s", reason)
            self._event("saver_cannot_write", -1, reason)

    def _snapshot_sharding(self, slot: int) -> tuple[int, dict[str, Any]] | None:
        """(step, sharding description) of a complete snapshot, or None.

        Reads the header and manifest with ``pread`` (mapping a slot would fault in all of it);
        the manifest's CRC catches a torn read, and `MemoryReader.load` re-checks under the lock.
        """
        c = self.config
        path = segment_path(c.shm_dir, c.job_id, c.run_id, c.rank, slot)
        header = peek_header(path)
        if header is None or header.state < SlotState.COMPLETE:
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = os.pread(fd, header.manifest_len, header.manifest_off)
            tree, _ = decode_manifest(raw, header.manifest_crc)
            return header.step, _sharding_of(tree)
        except (OSError, LayoutError, StateStructureError):
            return None
        finally:
            os.close(fd)

    def memory_steps(self, state: Any) -> list[int]:
        """Steps this rank holds in memory with the sharding `state` has now, newest first."""
        return self._memory_steps(split_sharded(state))

    def _memory_steps(self, split: ShardedSplit) -> list[int]:
        wanted = self._describe(split)
        found = (self._snapshot_sharding(s.slot) for s in self._reader.snapshots())
        return [f[0] for f in found if f is not None and f[1] == wanted]

    # -- load ----------------------------------------------------------------------------------

    def load(self, state: Any, from_memory: bool = True) -> LoadedState:
        """Restore `state` in place: from memory when every rank holds a step, else from storage.

        Collective. Then apply it to the model with `set_sharded_state` (FSDP2 shares memory with
        the state, but other wrappers may not).

        Args:
            state: the current state (e.g. from `get_sharded_state`), sharded as this job is now.
            from_memory: try shared memory first.

        Returns:
            The restored state (`state` itself, tensors restored in place, other values replaced).

        Raises:
            NoCheckpointError: nothing loadable in memory or storage.
            StateStructureError: `state` does not match the checkpoint (nothing was changed).
        """
        self._wait_background()
        self.restored_persist = None
        split = split_sharded(state)
        if from_memory:
            mine = self._memory_steps(split)
            per_rank = self._g.gather_ints(mine, self.config.num_slots)
            step = _common_newest([[s for s in r if s >= 0] for r in per_rank])
            if step is not None:
                loaded: LoadedState | None = None
                error = ""
                try:
                    target = {"sharding": self._describe(split), "state": split.local}
                    loaded = self._reader.load(target=target, step=step, keep=self.stager.adopt)
                except (ChecksumError, NoCheckpointError, StateStructureError, LayoutError) as e:
                    error = str(e)
                ok = self._g.gather_ints([0 if loaded is not None else 1], 1)
                if all(r[0] == 0 for r in ok) and loaded is not None:
                    restored = rejoin(state, loaded.state["state"])
                    self._last = split  # a restarted process may persist what it found in memory
                    self._persist_restored_step(step, split)
                    return LoadedState(restored, step, "memory", loaded.verified, loaded.detail)
                self._event("fallback", step, f"memory load of step {step} failed on some rank ({error or 'peer'})")
        return self._load_storage(state, split)

    def _persist_restored_step(self, step: int, split: ShardedSplit) -> None:
        """Start persisting a step just restored from memory (`persist_restored`). Collective.

        Every rank decides alike: the setting and the group are the same on all of them, and the
        persist itself refuses, on every rank, a step storage has already committed.
        """
        if not self._persist_restored:
            return
        if self._link.client is not None and self._describe(split)[RANK_FILES_LOADABLE]:
            # The node saver writes this step rank by rank, as it did (or is doing) for the failure
            # it came from, unless it persisted it or storage committed it already (a process
            # that exited cleanly, or a held failure persist, left it only in memory). A DCP
            # persist of the same step would write into the directory it writes.
            self._event("persist_restored", step, f"step {step} was restored from memory; asking the node saver")
            self._link.persist_keeping(self.stager, step, self.stager.slot_of(step))
            return
        if self._g.active and self._g.group is None:
            self._event(
                "restored_not_persisted",
                step,
                f"step {step} was restored from memory and may be only there: persisting it in the background "
                "needs a process group of the checkpointer's own (group=torch.distributed.new_group(backend="
                f"'gloo')); call persist({step}) to persist it now",
            )
            return
        self._event("persist_restored", step, f"step {step} was restored from memory; persisting it in the background")
        self.restored_persist = self.persist_async(step)

    def _load_storage(self, state: Any, split: ShardedSplit) -> LoadedState:
        committed, _ = self._committer.steps()
        try:
            tracker = self._committer.tracker()
        except (LayoutError, StorageError) as e:
            self._event("fallback", -1, f"the tracker is unreadable ({e}); using the newest committed step")
            tracker = None
        candidates = sorted((s for s in committed if tracker is None or s <= tracker.step), reverse=True)
        if tracker is not None and tracker.step not in committed:
            self._event("fallback", tracker.step, f"the tracker names step {tracker.step}, which is missing")
        if self._g.active:
            # Rank 0's list for all: a saver may commit a step while the ranks list theirs, and
            # ranks trying different steps would pair up their collectives across steps.
            mine = json.dumps(candidates).encode() if self._g.rank == 0 else b""
            candidates = [int(x) for x in json.loads(self._g.gather_bytes(mine)[0])]
        local_tree = flatten_state(split.local).tree
        reasons = []
        share = self._node_share()
        for step in candidates:
            raw = self._read_manifest(step)  # once per rank and step: both paths take it from here
            if self._saved_rank_by_rank(raw):
                problem, loaded = self._load_per_rank_step(step, raw, state, split, local_tree)
            else:
                problem, loaded = self._load_dcp_step(step, raw, state, split, local_tree, share)
            if loaded is not None:
                return loaded
            reasons.append(f"step {step}: {problem}")
            self._event("fallback", step, f"checkpoint step {step} is unusable: {problem}; trying the previous one")
        raise NoCheckpointError(
            "no loadable committed checkpoint" + (": " + "; ".join(reasons) if reasons else " in storage")
        )

    def _read_manifest(self, step: int) -> bytes | None:
        """`step`'s manifest as stored, or None when it cannot be read (each path then says so)."""
        try:
            return self.storage.read_bytes(manifest_path(step))
        except Exception:  # this rank's verdict, agreed on later: raising would strand the others
            return None

    def _saved_rank_by_rank(self, raw: bytes | None) -> bool:
        """Whether every rank finds the step's manifest `raw` in the per-rank format a node saver
        writes. Collective.

        A rank that cannot tell (the manifest unreadable) votes for DCP, whose check then names
        the problem on every rank.
        """
        try:
            fmt = None if raw is None else json.loads(raw).get("format")
        except Exception:  # any failure is this rank's vote: raising would strand the others
            fmt = None
        votes = self._g.gather_ints([1 if fmt == CHECKPOINT_FORMAT else 0], 1)
        return all(v[0] == 1 for v in votes)

    def _load_dcp_step(  # noqa: PLR0917 (one call site; the arguments are the load's parts)
        self, step: int, raw: bytes | None, state: Any, split: ShardedSplit, local_tree: Any, share: NodeShare | None
    ) -> tuple[str | None, LoadedState | None]:
        """Load a step DCP wrote; (the problem, None) when it is unusable. Collective."""
        # POSIX: the step's own directory; other storage: a staging copy per node, removed
        # when this block ends (whether the load succeeded, fell back or raised).
        with contextlib.ExitStack() as stage:
            local = self._staging_for(step, stage, share)
            problem, man = self._check_step(step, raw, local, share)
            if man is None or problem is not None or local is None:
                return problem, None
            self._check_structure(step, man["tree"], man["tensor_keys"], local_tree, split)
            problem = self._dcp_read(step, split, FileSystemReader(local))
            if share is not None:
                self._g.barrier()  # the node's ranks have all read the copy its leader removes
            if problem is not None:
                return problem, None
        restored = rejoin(state, apply_values(split.local, man["tree"]))
        self._last = split
        detail = f"{self._site.where(step)} (step {step}, saved by {man['world_size']} ranks)"
        return None, LoadedState(restored, step, "storage", True, detail)

    def _dcp_read(self, step: int, split: ShardedSplit, reader: StorageReader) -> str | None:
        """DCP-load `split` through `reader`. Collective. The problem (a ``load_failed`` event), or None.

        DCP gathers every rank's read errors, so every rank gets the same outcome. After a failure
        the state may be part written: the previous step, loaded next, writes all of it again.
        """
        try:
            dcp_load(split.dcp, storage_reader=reader, process_group=self._g.group, no_dist=not self._g.active)
        except CheckpointException as e:  # a BaseException: `except Exception` does not see it
            problem = f"reading it failed after it was verified: {e}"
            self._event("load_failed", step, problem)
            return problem
        return None

    def _load_per_rank_step(
        self, step: int, raw: bytes | None, state: Any, split: ShardedSplit, local_tree: Any
    ) -> tuple[str | None, LoadedState | None]:
        """Load a step a node saver wrote rank by rank (see `shard_local`), resharded. Collective."""
        check = check_per_rank_step(self.storage, self._g, step, raw)
        if check.problem is not None:
            self._event("checksum_mismatch" if check.damaged else "load_failed", step, check.problem)
            return check.problem, None
        files = check.files
        try:
            shards = [rank_shards(f.rank, f.path, f.data_start, f.tree, f.specs) for f in files]
            metadata, where = shard_metadata(shards)
            tree, _ = state_node_of(files[0].tree)
        except Exception as e:  # the same verdict on every rank: the same files were checked
            return f"its layout cannot be read: {e}", None
        self._check_structure(step, tree, list(metadata.state_dict_metadata), local_tree, split)
        _check_shapes(step, metadata, split)
        problem = self._dcp_read(step, split, ShardLocalReader(self.storage, metadata, where))
        if problem is not None:
            return problem, None
        restored = rejoin(state, apply_values(split.local, tree))
        self._last = split
        detail = f"{self._site.where(step)} (step {step}, saved rank by rank by {len(files)} ranks)"
        return None, LoadedState(restored, step, "storage", True, detail)

    def _check_structure(
        self, step: int, saved_tree: Any, saved_keys: list[str], local_tree: Any, split: ShardedSplit
    ) -> None:
        """Refuse a step whose state is shaped otherwise than the one to restore into (on every rank alike)."""
        if skeleton(saved_tree) != skeleton(local_tree) or sorted(saved_keys) != sorted(split.keys):
            raise StateStructureError(
                f"checkpoint step {step} holds another state structure than the one to restore into "
                f"(tensor keys saved {len(saved_keys)}, now {len(split.keys)})"
            )

    def _node_share(self) -> NodeShare | None:
        """How this rank shares a load's staging copy on its node; None where nothing is staged.

        Collective the first time (every rank's `StagedDcpSite.node_key`), then remembered.
        """
        if not isinstance(self._site, StagedDcpSite) or not self._g.active:
            return None
        if self._share is None:
            self._share = node_share(self._g.gather_bytes(self._site.node_key()), self._g.rank)
        return self._share

    def _staging_for(self, step: int, stage: contextlib.ExitStack, share: NodeShare | None) -> Path | None:
        """The directory to read `step` from, entered on `stage`; None if it could not be made.

        Collective with a `share`: the node's leader makes the staging directory and every rank
        learns its name. A failure is this rank's verdict, agreed on in `_check_step`: raising
        here would strand the others in a collective.
        """
        local: Path | None = None
        if share is None or share.leader == self._g.rank:
            try:
                local = stage.enter_context(self._site.reading(step))
            except Exception as e:
                self._event("load_failed", step, f"rank {self._g.rank}: cannot make a staging directory: {e}")
        if share is None:
            return local
        described = b""
        if local is not None:
            try:
                st = os.stat(local)
                described = json.dumps([local.name, st.st_dev, st.st_ino]).encode()
            except OSError as e:  # the node's ranks learn it failed: each says so in _check_step
                self._event("load_failed", step, f"cannot describe the node's staging directory: {e}")
        described = self._g.gather_bytes(described)[share.leader]
        if share.leader == self._g.rank:
            return local
        try:
            name, dev, ino = json.loads(described) if described else (None, 0, 0)
            assert isinstance(self._site, StagedDcpSite)  # a share exists only for a staged site
            joined = None if name is None else self._site.joined(name)
            if joined is not None and (os.stat(joined).st_dev, os.stat(joined).st_ino) != (dev, ino):
                raise LayoutError(f"{joined} is not the directory rank {share.leader} made")
        except Exception as e:  # this rank's verdict, agreed on in _check_step
            self._event("load_failed", step, f"cannot use the node's staging directory: {e}")
            return None
        if joined is None:
            self._event("load_failed", step, f"rank {share.leader} could not make the node's staging directory")
        return joined

    def _fetch_turn(self, share: NodeShare | None) -> tuple[int, int]:
        """(stride, offset): this rank fetches the files ``i`` of a step with ``i % stride == offset``."""
        if self._site.shared:
            return self._g.size, self._g.rank  # every rank sees every file: the group splits them
        if share is not None:
            return share.size, share.index  # one copy per node: the node's ranks split them
        return 1, 0

    def _check_step(
        self, step: int, raw: bytes | None, local: Path | None, share: NodeShare | None = None
    ) -> tuple[str | None, dict[str, Any] | None]:
        """Verify a step's manifest (`raw`, None: unreadable) and files into `local` (None: its
        staging failed). Collective.

        On POSIX storage the ranks share the reading. Otherwise DCP may ask any rank for any
        file, so every file is downloaded (and checked) into the staging directory: by this rank
        alone, or with a `share` by the node's ranks in turn, into the one they share.

        Returns:
            (a sentence naming the first bad file, or None; the manifest when readable)

        Raises:
            StorageError: a rank could not make its staging directory (on every rank).
        """
        man: dict[str, Any] | None = None
        bad = -1  # -1: fine; -2: manifest unreadable; -3: no staging directory; i >= 0: file i is bad
        if local is None:
            bad = -3
        else:
            man = _parsed_dcp_manifest(raw, step)
            bad = -2 if man is None else bad
        names = sorted(man["files"]) if man is not None else []
        stride, mine = self._fetch_turn(share)
        for i, name in enumerate(names):
            if i % stride != mine:
                continue
            assert local is not None  # no names without a staging directory (no manifest was read)
            try:
                self._site.fetch(step, local, name, man["files"][name] if man else {})
            except Exception as e:  # any failure is this rank's verdict: raising would strand the others
                if isinstance(e, (ChecksumError, StorageError)):
                    self._event("checksum_mismatch", step, str(e))
                else:
                    self._event("verify_failed", step, f"unexpected error verifying {name}: {e!r}")
                bad = i
                break
        per_rank = [r[0] for r in self._g.gather_ints([bad], 1)]
        if any(b == -3 for b in per_rank):
            ranks = [r for r, b in enumerate(per_rank) if b == -3]
            raise StorageError(f"ranks {ranks} could not make a local staging directory to load step {step}")
        if any(b == -2 for b in per_rank):
            return f"{manifest_path(step)} is unreadable", man
        for b in per_rank:
            if b >= 0:
                name = names[b] if b < len(names) else f"file #{b}"
                return f"{self._site.where(step, name)} is missing, truncated or corrupt (checksum)", man
        return None, man

    # -- persist -------------------------------------------------------------------------------

    def persist(self, step: int) -> CommitDecision:
        """Write the staged snapshot of `step` with DCP, checksum it and commit it. Collective.

        Blocks until done (see `persist_async` for the background). The tracker moves only after
        every rank's done marker is written; a failure or crash at any point leaves it at the
        previous committed checkpoint.

        Returns:
            Whether the step was committed, and why (not); every rank gets the same answer.
        """
        self._wait_background()
        return self._persist(step, self._last)

    def persist_async(self, step: int) -> Future[CommitDecision]:
        """`persist` on a background thread; training goes on meanwhile. Collective.

        The snapshot stays in its shared-memory slot, held under a shared lock, so `save` uses
        the other slot meanwhile (and waits per the busy policy if both are held). Every rank
        must call it for the same steps in the same order.

        Returns:
            A future of the commit decision (never raises for a failed persist: the decision says).

        Raises:
            FlashCkptError: in a distributed job, the checkpointer was not given a process group
                of its own (its collectives would interleave with training's).
        """
        if self._g.active and self._g.group is None:
            raise FlashCkptError(
                "persist_async needs a process group used by nothing else, e.g. "
                "ShardedCheckpointer(..., group=torch.distributed.new_group(backend='gloo'))"
            )
        future = self._pool.submit(self._persist, step, self._last)
        self._pending.append(future)
        return future

    def _wait_background(self) -> None:
        while self._pending:
            self._pending.pop(0).result()

    def _persist(self, step: int, last: ShardedSplit | None) -> CommitDecision:
        g = self._g
        refused = self._refuse(step)
        if refused is not None:
            return refused
        sharding = None if last is None else self._describe(last)
        ok = 1
        reason = ""
        record: tuple[dict[str, Any], list[str]] = ({}, [])
        # DCP writes into `local`: the step's own directory (POSIX), or a private staging copy
        # that this block removes once uploaded, or on any failure (other storage).
        with contextlib.ExitStack() as stage:
            local, detail = self._stage_for_writing(stage, step)
            with contextlib.ExitStack() as hold:
                # The snapshot is held (shared lock) from this check until DCP has written it, and
                # its manifest is read once: the check and the write see the same snapshot.
                snapshot = None
                if local is not None:
                    snapshot, detail = self._hold_snapshot(hold, step, sharding)
                # What DCP saves is built before the ranks agree to go on, so that an error in
                # building it, this rank's alone, is a vote here and not a rank missing from
                # DCP's collectives.
                prepared = None
                if snapshot is not None and last is not None:
                    try:
                        prepared = _dcp_state(snapshot, last)
                    except Exception as e:  # this rank's verdict, agreed on just below
                        detail = f"rank {g.rank}: {type(e).__name__}: {e}"
                        self._event("persist_failed", step, detail)
                held = all(r[0] == 1 for r in g.gather_ints([int(prepared is not None)], 1))
                if held and prepared is not None and local is not None:
                    try:
                        self._write_dcp(prepared[0], local)
                        record = prepared[1], prepared[2]
                    # Reported in the decision: raising would strand the other ranks. DCP gathers
                    # every rank's errors into a CheckpointException, a BaseException.
                    except (Exception, CheckpointException) as e:
                        ok, reason = 0, f"rank {g.rank}: {type(e).__name__}: {e}"
                        self._event("persist_failed", step, reason)
                snapshot = None  # the views go before the slot is unmapped
            if not held or sharding is None or local is None:
                why = f"step {step} is not in memory with the current sharding on every rank"
                return CommitDecision(False, f"{why} ({detail})" if detail else why)
            ok, reason = self._publish(step, local, ok, reason)
        g.barrier()
        if not all(r[0] == 1 for r in g.gather_ints([ok], 1)):
            return CommitDecision(False, reason or f"step {step}: another rank failed to persist")
        committed = 0
        message = ""
        if g.rank == 0:
            try:
                decision = self._commit(step, record[0], record[1], sharding)
                committed, message = int(decision.commit), decision.reason
            except Exception as e:  # reported in the decision; raising here would strand the other ranks
                message = f"commit of step {step} failed: {e}"
                self._event("persist_failed", step, message)
        committed = g.broadcast_int(committed)
        if g.rank != 0:
            message = f"step {step} {'committed' if committed else 'not committed'} by rank 0"
        return CommitDecision(bool(committed), message)

    def _refuse(self, step: int) -> CommitDecision | None:
        """Rank 0's verdict on starting to persist `step` (clearing a crashed attempt's leftovers),
        on every rank: a refusal, or None to go on. Collective."""
        go = 1
        if self._g.rank == 0:
            try:
                tracker = self._committer.tracker()
            except (LayoutError, StorageError):
                tracker = None  # a new commit replaces an unreadable tracker
            if tracker is not None and step <= tracker.step:
                go = 0
            elif self._committer.per_rank_done(step):
                go = -2  # a node saver is writing this step rank by rank: clearing it would lose that
            else:
                try:
                    self.storage.remove_tree(step_dir(step))  # leftovers of an attempt that crashed
                except StorageError as e:
                    self._event("persist_failed", step, f"cannot clear {step_dir(step)}: {e}")
                    go = -1
        go = self._g.broadcast_int(go)
        if go == 1:
            return None
        why = {
            0: "is not newer than the committed step",
            -1: "cannot be cleared of leftovers",
            -2: "is being persisted rank by rank by a node saver",
        }[go]
        return CommitDecision(False, f"step {step} {why}")

    @contextlib.contextmanager
    def _snapshot_views(self, step: int) -> Iterator[tuple[dict[str, Any], list[torch.Tensor]]]:
        """The staged snapshot of `step` as views into shared memory, held under a shared lock."""
        c = self.config
        for snap in self._reader.snapshots():
            if snap.step != step:
                continue
            seg = ShmSegment.attach(segment_path(c.shm_dir, c.job_id, c.run_id, c.rank, snap.slot))
            try:
                deadline = self._clock.now() + c.lock_timeout_s
                while not seg.try_lock(exclusive=False):
                    if self._clock.now() >= deadline:
                        raise FlashCkptError(f"{seg.path} stayed locked for {c.lock_timeout_s}s")
                    self._clock.sleep(c.busy_poll_interval_s)
                try:
                    header = read_header(seg)
                    if header is None or header.step != step or header.state < SlotState.COMPLETE:
                        raise NoCheckpointError(f"rank {c.rank}: step {step} was overwritten in memory")
                    tree, specs = read_manifest(seg, header)
                    views = _exact_views(seg, header.data_off, specs)
                    yield tree, views
                    del views
                finally:
                    seg.unlock()
            finally:
                seg.close()
            return
        raise NoCheckpointError(f"rank {c.rank}: no complete snapshot of step {step} in memory")

    def _hold_snapshot(
        self, hold: contextlib.ExitStack, step: int, sharding: dict[str, Any] | None
    ) -> tuple[tuple[dict[str, Any], list[torch.Tensor]] | None, str]:
        """Enter `_snapshot_views` of `step` on `hold` if it was staged with `sharding`.

        Returns:
            (the tree and views, or None; a sentence on why not when it is this rank's failure
            rather than a step simply not in memory)
        """
        if sharding is None:  # nothing was saved or loaded by this checkpointer yet
            return None, ""
        try:
            tree, views = hold.enter_context(self._snapshot_views(step))
        except NoCheckpointError:
            return None, ""
        except Exception as e:  # a lock held too long, a damaged manifest: this rank's verdict, reported
            detail = f"rank {self._g.rank}: {type(e).__name__}: {e}"
            self._event("persist_failed", step, detail)
            return None, detail
        try:
            same = _sharding_of(tree) == sharding
        except StateStructureError:
            same = False
        return ((tree, views) if same else None), ""

    def _stage_for_writing(self, stage: contextlib.ExitStack, step: int) -> tuple[Path | None, str]:
        """Enter the site's directory for writing `step` on `stage`: (it, "") or (None, why not)."""
        try:
            return stage.enter_context(self._site.writing(step)), ""
        except Exception as e:  # this rank's verdict, agreed on with the others: raising would strand them
            detail = f"rank {self._g.rank}: cannot make a staging directory: {type(e).__name__}: {e}"
            self._event("persist_failed", step, detail)
            return None, detail

    def _write_dcp(self, state: dict[str, Any], local: Path) -> None:
        """DCP-save `state` (see `_dcp_state`) into `local`, the step's directory or its staging copy.
        Collective."""
        dcp_save(
            state,
            storage_writer=FileSystemWriter(local, sync_files=self._site.sync_files, thread_count=self._threads),
            process_group=self._g.group,
            no_dist=not self._g.active,
        )

    def _publish(self, step: int, local: Path, ok: int, reason: str) -> tuple[int, str]:
        """Checksum (and, staged, upload) this rank's share of the step's files, then write its
        done marker. Collective when staged (the ranks tell each other which files they hold).

        Returns:
            (1, "") when done, else (0, why): this rank's verdict, for the gather that follows.
        """
        g = self._g
        held: list[str] = []
        if ok:
            try:
                held = dcp_files(local)
            except StorageError as e:
                ok, reason = 0, f"rank {g.rank}: {type(e).__name__}: {e}"
                self._event("persist_failed", step, reason)
        listings: list[list[str]] = []
        if not self._site.shared:
            # Each rank holds only the files it wrote: every rank learns who holds what, so that
            # every file gets exactly one uploader (one small gather; no pickle).
            for raw in self._g.gather_bytes(json.dumps(held if ok else None).encode()):
                listing = json.loads(raw)
                if listing is None:
                    return 0, reason  # some rank failed: nobody uploads, and the gather that follows says so
                listings.append([str(n) for n in listing])
        if not ok:
            return ok, reason
        try:
            owners = staged_owners(listings, g.size) if listings else checksum_owners(held, g.size)
            files = self._site.publish(step, local, [n for n, r in owners.items() if r == g.rank])
            # On POSIX written through PosixStorage: atomic, and its directory fsync also makes
            # DCP's renames durable.
            self.storage.write_file(done_path(step, g.rank), [dump_json(done_doc(step, g.rank, files))])
        except Exception as e:  # reported in the decision; raising here would strand the other ranks
            ok, reason = 0, f"rank {g.rank}: {type(e).__name__}: {e}"
            self._event("persist_failed", step, reason)
        return ok, reason

    def _commit(self, step: int, tree: dict[str, Any], keys: list[str], sharding: dict[str, Any]) -> CommitDecision:
        ws = self.config.world_size
        decision = decide_commit(step, ws, self._committer.done_ranks(step), self._committer.tracker())
        if not decision.commit:
            return decision
        done = [
            load_json(self.storage.read_bytes(done_path(step, r)), DCP_DONE_FORMAT, done_path(step, r))
            for r in range(ws)
        ]
        man = manifest_doc(
            step,
            world_size=ws,
            done=done,
            listed=self._site.listed(step),
            tree=tree,
            tensor_keys=keys,
            sharding=sharding,
        )
        self.storage.write_file(manifest_path(step), [dump_json(man)])
        newer = self._committer.move_tracker(step, ws)
        if newer is not None:  # a node saver committed a newer step meanwhile: the tracker stays there
            return CommitDecision(False, f"step {step} is complete, but step {newer} was committed meanwhile")
        if self._committer.retention is not None:
            try:
                self._committer.apply_retention()
            except StorageError as e:
                self._event("retention_failed", step, str(e))
        return decision

    # -- misc ----------------------------------------------------------------------------------

    def _event(self, kind: str, step: int, reason: str) -> None:
        self.events.record(FlashEvent(kind, step, reason, self._clock.wall_time()))

    def close(self, remove: bool | None = None, job_end: bool = False) -> None:
        """Finish background persists, then close the stager (see `Stager.close`; `remove` unlinks
        this rank's shared memory) and the link to the saver (`job_end`: tell it the job is over,
        which removes the run's memory; call it on one rank, after every rank's last save)."""
        self._pool.shutdown(wait=True)
        self._pending.clear()
        self.stager.close(remove=remove)
        self._link.close(job_end)


def _exact_views(seg: ShmSegment, data_off: int, specs: tuple[TensorSpec, ...]) -> list[torch.Tensor]:
    """Each tensor of a slot as a view whose storage is exactly its bytes.

    DCP's writer clones a tensor whose storage is larger than the tensor (it would otherwise
    serialize the whole storage); slices of one big mapping would all be cloned, costing a copy
    and fresh pages per persist.
    """
    views = []
    for spec in specs:
        dtype = dtype_from_name(spec.dtype)
        if spec.nbytes == 0:
            views.append(torch.empty(spec.shape, dtype=dtype))
            continue
        raw = torch.frombuffer(seg.mm, dtype=torch.uint8, count=spec.nbytes, offset=data_off + spec.offset)
        views.append(raw.view(dtype).view(spec.shape))
    return views


def _as_dtensor(view: torch.Tensor, key: str, live: ShardedSplit) -> torch.Tensor:
    info = live.shards.get(key)
    if info is None:
        return view
    return DTensor.from_local(
        view, info.mesh, list(info.placements), run_check=False, shape=info.shape, stride=info.stride
    )


def _dcp_state(
    snapshot: tuple[dict[str, Any], list[torch.Tensor]], last: ShardedSplit
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """What DCP saves of a held snapshot (its views, as DTensors laid out like `last`'s), and the
    snapshot's own tree and DCP keys for the manifest (not the live state's values)."""
    tree, views = snapshot
    staged = split_sharded(build_tree(tree, views, ndarray_as_numpy=False)["state"])
    state = dcp_grouped({k: _as_dtensor(v, k, last) for k, v in staged.dcp.items()})
    return state, _state_node(tree), list(staged.keys)


def _sharding_of(tree: dict[str, Any]) -> dict[str, Any]:
    """The staged sharding description inside a snapshot's tree (it holds no tensors)."""
    if not isinstance(tree, dict) or "dict" not in tree:
        raise StateStructureError("the snapshot is not a sharded snapshot")
    for key, node in tree["dict"]:
        if key == {"str": "sharding"}:
            value = build_tree(node, [])
            if isinstance(value, dict):
                return value
    raise StateStructureError("the snapshot is not a sharded snapshot")


def _state_node(tree: dict[str, Any]) -> dict[str, Any]:
    """The ``state`` part of a staged snapshot's tree (its tensor indices start at 0: the
    ``sharding`` part before it holds no tensors)."""
    for key, node in tree.get("dict", []):
        if key == {"str": "state"} and isinstance(node, dict):
            return node
    raise StateStructureError("the snapshot is not a sharded snapshot")


def _common_newest(per_rank: list[list[int]]) -> int | None:
    common = set(per_rank[0]) if per_rank else set()
    for steps in per_rank[1:]:
        common &= set(steps)
    return max(common) if common else None


def _check_shapes(step: int, metadata: Any, split: ShardedSplit) -> None:
    """Refuse a step whose tensors have other global shapes than the state's before DCP's load
    touches anything, as its own planning would refuse them half way (the same verdict on every
    rank: same files, same structure). Dtypes may differ: DCP converts, as it does for its own
    checkpoints.

    Raises:
        StateStructureError: naming the first tensor that differs.
    """
    for key, tensor in split.dcp.items():
        saved = metadata.state_dict_metadata[key]
        if tuple(saved.size) != tuple(tensor.shape):
            raise StateStructureError(
                f"checkpoint step {step} holds {key!r} with shape {list(saved.size)}, the state {list(tensor.shape)}"
            )


def _parsed_dcp_manifest(raw: bytes | None, step: int) -> dict[str, Any] | None:
    """A DCP step's manifest from its bytes, or None when they are missing or not one."""
    if raw is None:
        return None
    try:
        return parse_manifest(raw, step)
    except LayoutError:
        return None
