"""Load a replicated state (DDP: every rank holds the same model and optimizer) across a resize.

`FlashCheckpointer.load` with an ``agree`` function loads from memory only a step every rank holds
in its own rank's snapshot. That is right for any state, but after an elastic resize the ranks are
numbered anew and a rank on a node that joined holds nothing: the job falls back to storage, and
storage refuses a checkpoint of another world size. A replicated state needs only one copy, so
`ReplicatedLoader` works from the newest copy anywhere:

1. Every rank finds the newest complete snapshot of the run in its node's shared memory, saved
   under any rank number (its own preferred); one ``all_gather`` of int64 gives the newest step S
   held anywhere.
2. When every rank holds S, each restores it from its own node's memory. Otherwise the ranks
   holding S try in turn, lowest first, until one has restored it.
3. The ranks exchange their outcomes (int64). If a rank could not restore S (none on its node, or
   a damaged snapshot), the others receive the state from the lowest rank that did: a JSON
   document (the tree and the tensor table of the slot manifest) as uint8, then the tensors'
   bytes as one stream through a staging buffer of `chunk_bytes` (`tensor_stream`), written
   straight into the existing tensors. No pickle.
4. When no rank restored S, rank 0 loads the newest committed checkpoint from storage (the files
   of rank 0, whatever world size saved them) and sends it the same way.

Every rank must call `ReplicatedLoader.load` at the same point (it runs collectives). Failures are
agreed at fixed points (after loading, after the description, after the bytes) and then raised on
every rank, the failing rank with its own error, so no rank is left waiting in a collective; a
failure while the bytes move leaves the receivers' tensors partly written. Per-rank values (an RNG
stream, a data offset) come from whichever copy a rank restored: its own rank's slot when its node
holds one, else another rank's (a renumbered rank reads what its node saved under its old rank,
and a receiving rank gets the sender's). Derive them from the rank after loading.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any

import torch

from dlrover.common import Clock, SystemClock
from dlrover.flashckpt.collectives import RankGroup
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dtypes import dtype_from_name
from dlrover.flashckpt.errors import (
    ChecksumError,
    FlashCkptError,
    LayoutError,
    NoCheckpointError,
    StateStructureError,
)
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.layout import TensorSpec
from dlrover.flashckpt.memory import LoadedState, MemoryReader
from dlrover.flashckpt.planner import plan_layout
from dlrover.flashckpt.restore import apply_values, match_targets
from dlrover.flashckpt.segment import ShmSegment, run_ranks
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage_loader import StorageReader
from dlrover.flashckpt.tensor_stream import DEFAULT_CHUNK_BYTES, broadcast_stream
from dlrover.flashckpt.tree import build_tree, flatten_state

__all__ = ["ReplicatedLoader"]

# Errors after which a snapshot is simply unusable here, and another copy may serve.
_UNUSABLE = (NoCheckpointError, ChecksumError, LayoutError)


class _Outcome(enum.IntEnum):
    """One rank's result of a step of the protocol, as exchanged (int64)."""

    NONE = 0  # held nothing usable (or was not asked to load)
    LOADED = 1
    MISMATCH = 2  # the caller's state does not fit the snapshot
    FAILED = 3  # anything else; the rank re-raises its own error


class ReplicatedLoader:
    """Restores a state every rank holds alike, from whichever rank has the newest copy.

    Args:
        config: this rank's stager settings (job, run, rank, world size, shared-memory directory).
        storage: the checkpoint storage, for when no rank holds a snapshot in memory.
        group: the collectives over the job's ranks.
        events: where fallbacks are recorded.
        clock: time source.
        keep: offered this rank's own slot after a load from it (`Stager.adopt`).
        chunk_bytes: the staging buffer every rank allocates on the group's device to send or
            receive the state (see `dlrover.flashckpt.tensor_stream`).

    Raises:
        FlashCkptError: the process group's size is not the configured world size.
    """

    def __init__(
        self,
        config: StagerConfig,
        storage: Storage,
        group: RankGroup,
        *,
        events: EventLog | None = None,
        clock: Clock | None = None,
        keep: Callable[[int, ShmSegment], bool] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        if group.size != config.world_size:
            raise FlashCkptError(
                f"the process group has {group.size} ranks, the checkpointer's config {config.world_size}: "
                "initialise torch.distributed before loading"
            )
        self.config = config
        self.storage = storage
        self.group = group
        self.events = events or EventLog()
        self._clock = clock or SystemClock()
        self._keep = keep
        self._chunk_bytes = chunk_bytes

    def _record(self, kind: str, step: int, reason: str) -> None:
        self.events.record(FlashEvent(kind, step, reason, self._clock.wall_time()))

    def load(self, target: Any | None = None) -> LoadedState:
        """Restore the newest step any rank holds in memory, else the newest committed one.

        Args:
            target: the existing state to restore into in place (the same structure on every
                rank), or None for fresh tensors.

        Raises:
            NoCheckpointError: no rank holds a snapshot and storage has no loadable checkpoint.
            StateStructureError: a rank's `target` does not match the checkpoint.
            FlashCkptError: loading failed on some rank (that rank raises its own error).
        """
        held = self._held_in_memory()
        newest = [row[0] for row in self.group.gather_ints([max(held, default=-1)], 1)]
        step = max(newest)
        if step >= 0:
            holders = [r for r, s in enumerate(newest) if s == step]
            # Every rank restores its own copy when each has one; else one holder at a time tries.
            rounds = [holders] if len(holders) == self.group.size else [[h] for h in holders]
            for loaders in rounds:
                mine = self._from_memory(step, held.get(step, []), target) if self.group.rank in loaders else None
                loaded = self._settle(mine)
                if len(loaded) == self.group.size:
                    assert isinstance(mine, LoadedState)
                    return mine
                if loaded:
                    return self._share(loaded[0], mine, target)
            self._record("fallback", step, f"no rank could restore step {step} from memory; loading storage")
        mine = self._from_storage(target) if self.group.rank == 0 else None
        if self._settle(mine):
            return self._share(0, mine, target)
        reason = self.group.broadcast_bytes(str(mine).encode(), 0).decode()
        raise NoCheckpointError(f"neither memory nor storage holds a checkpoint: {reason}")

    def _held_in_memory(self) -> dict[int, list[int]]:
        """Each step complete in this node's memory, with the ranks whose slots hold it (own first)."""
        c = self.config
        ranks = sorted(run_ranks(c.shm_dir, c.job_id, c.run_id), key=lambda r: (r != c.rank, r))
        held: dict[int, list[int]] = {}
        for rank in ranks:
            for snap in MemoryReader(c, self._clock, rank=rank).snapshots():
                if rank not in held.setdefault(snap.step, []):
                    held[snap.step].append(rank)
        return held

    def _from_memory(self, step: int, ranks: list[int], target: Any) -> LoadedState | BaseException | None:
        """Restore `step` from the first of `ranks`' slots that is usable (None: none was)."""
        for rank in ranks:
            reader = MemoryReader(self.config, self._clock, rank=rank)
            keep = self._keep if rank == self.config.rank else None
            try:
                return reader.load(target=target, step=step, keep=keep)
            except _UNUSABLE as e:
                self._record("fallback", step, f"rank {rank}'s snapshot of step {step} is unusable ({e})")
            except Exception as e:  # made known to every rank, then re-raised by _settle
                return e
        return None

    def _from_storage(self, target: Any) -> LoadedState | BaseException:
        reader = StorageReader(self.storage, self.events, self._clock)
        try:
            return reader.load(0, self.config.world_size, target=target, any_world_size=True)
        except Exception as e:  # made known to every rank, then re-raised by _settle
            return e

    def _settle(self, mine: object) -> list[int]:
        """Exchange outcomes; raise on every rank if one failed. Returns the ranks that loaded."""
        outcome = _outcome_of(mine)
        outcomes = [_Outcome(row[0]) for row in self.group.gather_ints([int(outcome)], 1)]
        failed = [r for r, o in enumerate(outcomes) if o in (_Outcome.MISMATCH, _Outcome.FAILED)]
        if failed:
            src = failed[0]
            reason = self.group.broadcast_bytes(str(mine).encode() if self.group.rank == src else b"", src).decode()
            if isinstance(mine, BaseException):
                raise mine
            if outcomes[src] is _Outcome.MISMATCH:
                raise StateStructureError(f"rank {src}'s state does not match the checkpoint: {reason}")
            raise FlashCkptError(f"rank {src} failed to load the checkpoint: {reason}")
        return [r for r, o in enumerate(outcomes) if o is _Outcome.LOADED]

    def _share(self, src: int, mine: LoadedState | BaseException | None, target: Any) -> LoadedState:
        """Every rank ends with rank `src`'s loaded state.

        Two agreements bracket the transfer: after the description (the sender could describe
        its state, every receiver's target fits it and its buffers are allocated) and after the
        bytes (every copy succeeded). A failure anywhere is raised on every rank at one of them.
        """
        if self.group.rank == src:
            assert isinstance(mine, LoadedState)
            return self._send(mine)
        return self._receive(src, target)

    def _send(self, loaded: LoadedState) -> LoadedState:
        src = self.group.rank
        ready: object = _LOADED
        try:
            flat = flatten_state(loaded.state)
            specs = plan_layout(flat, 0).specs
            doc = {
                "step": loaded.step,
                "source": loaded.source,
                "verified": loaded.verified,
                "detail": loaded.detail,
                "tree": flat.tree,
                "tensors": [s.to_json() for s in specs],
            }
            raw = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
            staging = self._staging(sum(s.nbytes for s in specs))
        except Exception as e:  # made known to every rank by _settle
            ready, raw = e, b"{}"
        self.group.broadcast_bytes(raw, src)
        self._settle(ready)
        reader = _Reader([leaf.tensor for leaf in flat.leaves], self.group.device)
        failure = broadcast_stream(
            self.group, src, [s.nbytes for s in specs], staging, read=reader, direct=reader.direct
        )
        self._settle(failure if failure is not None else _LOADED)
        return loaded

    def _receive(self, src: int, target: Any) -> LoadedState:
        ready: object = _LOADED
        try:
            doc = json.loads(self.group.broadcast_bytes(b"", src).decode("utf-8"))
            if doc:  # empty: the sender could not describe its state, which _settle reports
                specs = tuple(TensorSpec.from_json(t) for t in doc["tensors"])
                if target is not None:
                    places, fresh = match_targets(target, doc["tree"], specs).places, None
                else:
                    fresh = [torch.empty(s.shape, dtype=dtype_from_name(s.dtype)) for s in specs]
                    places = [[t] for t in fresh]
                writer = _Writer(places, specs, self.group.device)
                staging = self._staging(sum(s.nbytes for s in specs))
        except Exception as e:  # made known to every rank by _settle
            ready = e
        self._settle(ready)
        failure = broadcast_stream(
            self.group, src, [s.nbytes for s in specs], staging, write=writer, direct=writer.direct
        )
        self._settle(failure if failure is not None else _LOADED)
        state = apply_values(target, doc["tree"]) if fresh is None else build_tree(doc["tree"], fresh)
        detail = f"{doc['detail']}; received from rank {src}"
        return LoadedState(state, int(doc["step"]), str(doc["source"]), bool(doc["verified"]), detail)

    def _staging(self, total: int) -> torch.Tensor:
        return torch.empty(max(min(self._chunk_bytes, total), 1), dtype=torch.uint8, device=self.group.device)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


class _Reader:
    """The sender's copy of tensor bytes into the staging buffer (a non-contiguous tensor is made
    contiguous once, while its pieces are sent)."""

    def __init__(self, tensors: list[torch.Tensor], device: torch.device) -> None:
        self._tensors = tensors
        self._device = device
        self._current: tuple[int, torch.Tensor] | None = None

    def direct(self, index: int) -> torch.Tensor | None:
        t = self._tensors[index]
        return _flat_bytes(t) if t.is_contiguous() and t.device == self._device else None

    def __call__(self, index: int, offset: int, out: torch.Tensor) -> None:
        if self._current is None or self._current[0] != index:
            t = self._tensors[index].detach()
            self._current = (index, _flat_bytes(t if t.is_contiguous() else t.contiguous()))
        data = self._current[1][offset : offset + out.numel()]
        if data.data_ptr() != out.data_ptr():
            out.copy_(data)


class _Writer:
    """A receiver's copy of staging pieces into each tensor's places.

    The bytes go straight into the first place when it is contiguous, else into a buffer beside it
    that is copied in once the tensor is complete; then the other places take a copy of the first.
    A tensor with no place (shadowed by a tie in the target) is received and dropped.
    """

    def __init__(self, places: list[list[torch.Tensor]], specs: tuple[TensorSpec, ...], device: torch.device) -> None:
        self._places = places
        self._specs = specs
        self._device = device
        self._current: tuple[int, torch.Tensor] | None = None

    def direct(self, index: int) -> torch.Tensor | None:
        places = self._places[index]
        if not places or not places[0].is_contiguous() or places[0].device != self._device:
            return None
        return _flat_bytes(places[0])

    def __call__(self, index: int, offset: int, data: torch.Tensor) -> None:
        places = self._places[index]
        if not places:
            return
        if self._current is None or self._current[0] != index:
            first = places[0].detach()
            dest = first if first.is_contiguous() else torch.empty_like(first, memory_format=torch.contiguous_format)
            self._current = (index, dest)
        dest = self._current[1]
        part = _flat_bytes(dest)[offset : offset + data.numel()]
        if part.data_ptr() != data.data_ptr():  # else the piece was received in place
            part.copy_(data)
        if offset + data.numel() == self._specs[index].nbytes:
            first = places[0].detach()
            if dest is not first:
                first.copy_(dest)
            for other in places[1:]:
                other.detach().copy_(first)


class _Loaded:
    """Stands for a successful step of the protocol where no state is at hand."""


_LOADED = _Loaded()


def _outcome_of(mine: object) -> _Outcome:
    if isinstance(mine, LoadedState | _Loaded):
        return _Outcome.LOADED
    if isinstance(mine, StateStructureError):
        return _Outcome.MISMATCH
    if isinstance(mine, BaseException):
        return _Outcome.NONE if isinstance(mine, NoCheckpointError) else _Outcome.FAILED
    return _Outcome.NONE
