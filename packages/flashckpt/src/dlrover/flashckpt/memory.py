"""Load a rank's newest (or a chosen) snapshot from shared memory, in place.

The reader holds a shared ``flock`` on the slot while it reads, so the stager cannot start
overwriting it, and it accepts only COMPLETE or SEALED slots: a slot whose writer died half way
stays WRITING and is never read. Sealed slots are checked against their CRC-32 table before a
single byte reaches the caller's tensors, so a corrupt snapshot changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs

from dlrover.common import Clock, SystemClock
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.copier import Copier
from dlrover.flashckpt.errors import ChecksumError, FlashCkptError, NoCheckpointError
from dlrover.flashckpt.layout import SlotHeader, SlotState, TensorSpec
from dlrover.flashckpt.pinning import CudaHostPinner, HostPinner, PinError
from dlrover.flashckpt.restore import apply_values, match_targets, tie_conflicts
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.slotio import (
    compute_checksums,
    peek_header,
    read_checksums,
    read_header,
    read_manifest,
    tensor_views,
)
from dlrover.flashckpt.tree import build_tree

__all__ = ["LoadedState", "MemoryReader", "MemorySnapshot"]

_log = logging.getLogger(__name__)


@attrs.frozen
class MemorySnapshot:
    """A complete snapshot found in memory."""

    slot: int
    seq: int
    step: int
    sealed: bool


@attrs.frozen
class LoadedState:
    """A loaded state and where it came from.

    Attributes:
        state: the restored state (the caller's own object when loading into one).
        step: its training step.
        source: ``memory`` or ``storage``.
        verified: whether every tensor's checksum was checked.
        detail: a sentence for logs (which slot, which files, what was skipped).
    """

    state: Any
    step: int
    source: str
    verified: bool
    detail: str


class MemoryReader:
    """Reads one rank's snapshots from shared memory.

    Args:
        config: the same job, run, rank and directory the stager used.
        clock: time source for waiting on a held slot.
        rank: read this rank's snapshots instead of ``config.rank`` (a replicated state may be
            restored from the snapshot another rank of the node saved, of this or an earlier
            world size).
        pinner: page-locks the slot before copying into CUDA targets (unless
            ``config.pin_host_memory`` is False); default: `CudaHostPinner`.
    """

    def __init__(
        self,
        config: StagerConfig,
        clock: Clock | None = None,
        rank: int | None = None,
        pinner: HostPinner | None = None,
    ) -> None:
        self.config = config
        self.rank = config.rank if rank is None else rank
        self._clock = clock or SystemClock()
        self._pinner = pinner

    def _attach(self, slot: int) -> ShmSegment | None:
        c = self.config
        try:
            return ShmSegment.attach(segment_path(c.shm_dir, c.job_id, c.run_id, self.rank, slot))
        except (FileNotFoundError, FlashCkptError):
            return None

    def snapshots(self) -> list[MemorySnapshot]:
        """Complete snapshots in memory, newest first (a snapshot being written is not listed)."""
        c = self.config
        found = []
        for slot in range(c.num_slots):
            header = peek_header(segment_path(c.shm_dir, c.job_id, c.run_id, self.rank, slot))
            if header is not None and header.state in (SlotState.COMPLETE, SlotState.SEALED):
                found.append(MemorySnapshot(slot, header.seq, header.step, header.state is SlotState.SEALED))
        return sorted(found, key=lambda s: s.seq, reverse=True)

    def load(
        self,
        target: Any | None = None,
        step: int | None = None,
        copier: Copier | None = None,
        keep: Callable[[int, ShmSegment], bool] | None = None,
    ) -> LoadedState:
        """Load the newest snapshot (or the newest one of `step`).

        Args:
            target: an existing state to restore into in place (tensors are copied into, nothing
                is allocated); None returns a freshly allocated state.
            step: load this step instead of the newest.
            copier: copy threads to use (default: a pool per the config, closed afterwards).
            keep: offered the slot and its mapped segment after a successful load; True takes
                them over (the reader then leaves the segment open), so that a stager in this
                process does not map the same gigabytes again (`Stager.adopt`).

        Returns:
            The loaded state.

        Raises:
            NoCheckpointError: no complete snapshot (of `step`) is in memory.
            ChecksumError: the snapshot's bytes do not match its checksums (nothing was changed).
            StateStructureError: `target` does not match the snapshot (nothing was changed).
        """
        deadline = self._clock.now() + self.config.lock_timeout_s
        while True:
            candidates = [s for s in self.snapshots() if step is None or s.step == step]
            if not candidates:
                wanted = "any step" if step is None else f"step {step}"
                raise NoCheckpointError(f"rank {self.rank}: no complete snapshot of {wanted} in memory")
            chosen = candidates[0]
            seg = self._attach(chosen.slot)
            if seg is None:
                continue
            kept = False
            try:
                if not seg.try_lock(exclusive=False):
                    if self._clock.now() >= deadline:
                        raise FlashCkptError(
                            f"slot {chosen.slot} of rank {self.rank} stayed locked for {self.config.lock_timeout_s}s"
                        )
                    self._clock.sleep(self.config.busy_poll_interval_s)
                    continue
                try:
                    header = read_header(seg)
                    if header is None or header.seq != chosen.seq or header.state < SlotState.COMPLETE:
                        continue  # overwritten meanwhile: choose again
                    loaded = self._read(seg, header, target, copier)
                finally:
                    seg.unlock()
                kept = keep is not None and keep(chosen.slot, seg)
                return loaded
            finally:
                if not kept:
                    seg.close()

    def _read(self, seg: ShmSegment, header: SlotHeader, target: Any | None, copier: Copier | None) -> LoadedState:
        tree, specs = read_manifest(seg, header)
        verified = False
        own = copier or Copier(self.config.copy_threads, self.config.copy_chunk_bytes)
        try:
            # Structure first (cheap), then checksums, then copies: a failure changes nothing.
            plan = match_targets(target, tree, specs) if target is not None else None
            if header.state is SlotState.SEALED and self.config.verify_on_load:
                expected = read_checksums(seg, header)
                actual = compute_checksums(seg, header.data_off, specs, own.map)
                for spec, crc, got in zip(specs, expected, actual, strict=True):
                    if got != crc:
                        raise ChecksumError(f"tensor {spec.name!r} in {seg.path} does not match its checksum")
                verified = True
            views = tensor_views(seg, header.data_off, specs)
            conflict = None
            if plan is None:
                state = build_tree(tree, [v.clone() for v in views])
            else:
                conflict = tie_conflicts(
                    plan, specs, lambda j, i: not _same_bytes(seg, header.data_off, specs[j], specs[i])
                )
                if self.config.pin_host_memory is not False:
                    device = next((t.device.index for ts in plan.places for t in ts if t.is_cuda), None)
                    if device is not None:
                        self._pin(seg, device)
                own.copy([(t, view) for ts, view in zip(plan.places, views, strict=True) for t in ts])
                state = apply_values(target, tree)
            del views
        finally:
            if copier is None:
                own.close()
        detail = f"slot file {seg.path.name} seq {header.seq}" + ("" if verified else " (checksums not verified)")
        if conflict is not None:
            _log.warning("restoring step %d from memory: %s", header.step, conflict)
            detail += f"; {conflict}"
        return LoadedState(state, header.step, "memory", verified, detail)

    def _pin(self, seg: ShmSegment, device: int | None) -> None:
        # Copies into device tensors from pinned memory run on the copy engine at the link's
        # speed; a stager adopting this mapping afterwards finds it pinned already.
        try:
            if self._pinner is None:
                self._pinner = CudaHostPinner(device)
            seg.pin(self._pinner)
        except PinError as e:
            _log.warning("restoring from %s through pageable memory: %s", seg.path, e)


def _same_bytes(seg: ShmSegment, data_off: int, a: TensorSpec, b: TensorSpec) -> bool:
    """Whether two tensors of a slot hold the same bytes (compared in place, nothing copied)."""
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        return False
    with memoryview(seg.mm) as whole:
        return (
            whole[data_off + a.offset : data_off + a.offset + a.nbytes]
            == whole[data_off + b.offset : data_off + b.offset + b.nbytes]
        )
