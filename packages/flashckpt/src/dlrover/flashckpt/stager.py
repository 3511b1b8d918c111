"""The training-process side: copy a state into a shared-memory slot and return.

Call order (after torch.distributed.checkpoint's `AsyncStager`):

1. `prepare(state)` once the model and optimizer exist: lays the state out and allocates and
   pre-faults every slot, so the first `save` costs what later ones cost. Optional: without it
   the first `save` allocates its slot (paying the page faults then), and once its layout is
   known the other slots are allocated and pre-faulted with the same layout on a background
   thread (``StagerConfig.prefault_in_background``), so the second `save` costs what later ones
   cost. A call that touches the slots (`save`, `prepare`, `flush`, `adopt`, `close`) first
   waits for that thread; `close` stops it between two chunks of allocation.
2. `save(step, state)` picks a slot that does not hold the newest complete snapshot, copies every
   tensor into it on several threads, marks it COMPLETE and returns; training may change its
   tensors at once. Checksums are computed afterwards on a background thread, which marks the slot
   SEALED and notifies the `on_sealed` callback (the saver link). That thread runs at
   ``StagerConfig.seal_nice`` (19 by default): at the training threads' own priority it took a
   core from them right after every save, doubling step times on a 2-core machine while it ran.
3. `flush()` waits for background sealing; `close()` ends the stager.

A restarted process builds a new `Stager` for the same job, run and rank and finds its previous
snapshots still in memory (see `dlrover.flashckpt.memory`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import torch

from dlrover.common import Clock, SystemClock
from dlrover.flashckpt.checksum import crc32
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.copier import Copier, PendingCopy
from dlrover.flashckpt.errors import FlashCkptError, LayoutError, SlotBusyError
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.layout import (
    ALIGN,
    HEADER_SIZE,
    SlotHeader,
    SlotLayout,
    SlotState,
    TreeJsonMemo,
    encode_manifest,
    encode_specs,
)
from dlrover.flashckpt.pinning import CudaErrorPending, CudaHostPinner, HostPinner, PinError
from dlrover.flashckpt.planner import plan_layout
from dlrover.flashckpt.priority import lower_thread_priority
from dlrover.flashckpt.segment import (
    ShmSegment,
    cleanup_stale,
    list_run_files,
    owner_alive,
    owner_path,
    segment_path,
    write_owner,
)
from dlrover.flashckpt.slotio import read_header, seal_slot, tensor_views, write_header, write_manifest
from dlrover.flashckpt.slots import BusyAction, SlotView, decide_busy, rank_slots
from dlrover.flashckpt.tree import FlatState, flatten_state

__all__ = ["SaveResult", "SealedNotice", "Stager"]

_log = logging.getLogger(__name__)


@attrs.frozen
class SaveResult:
    """What `save` did.

    Attributes:
        step: the step asked for.
        saved: whether a snapshot was written (False when skipped under the busy policy).
        slot: the slot written, or -1.
        seq: the snapshot's sequence number, or -1.
        blocked_s: seconds `save` blocked (measured with the injected clock).
        reason: why it went this way.
    """

    step: int
    saved: bool
    slot: int
    seq: int
    blocked_s: float
    reason: str


@attrs.frozen
class SealedNotice:
    """Sent to `on_sealed` when a snapshot's checksums are stored: the snapshot is final."""

    rank: int
    slot: int
    seq: int
    step: int


class Stager:
    """Stages a rank's state into shared memory (see the module docstring for the call order).

    Args:
        config: job, run, rank, shared-memory directory and copy settings.
        clock: time source for waits and measurements.
        on_sealed: called on the sealing thread after each snapshot is sealed.
        owner: whether this stager owns the run's segments (removes them on `close`). None: own
            them unless a live owner (a saver) is already recorded.
        pinner: page-locks slots for device copies (see ``StagerConfig.pin_host_memory``);
            default: `CudaHostPinner`, made when a slot is first pinned.
    """

    def __init__(
        self,
        config: StagerConfig,
        clock: Clock | None = None,
        on_sealed: Callable[[SealedNotice], None] | None = None,
        owner: bool | None = None,
        pinner: HostPinner | None = None,
    ) -> None:
        self.config = config
        self._pinner = pinner
        self._pin_failed = False
        self._clock = clock or SystemClock()
        self._on_sealed = on_sealed
        self.events = EventLog()
        self._copier = Copier(config.copy_threads, config.copy_chunk_bytes)
        self._sealer = ThreadPoolExecutor(1, thread_name_prefix="flashckpt-seal", initializer=self._lower_seal_priority)
        self._lock = threading.Lock()  # guards _sealing and the segments against the sealer
        self._sealing: dict[int, Future[None]] = {}
        # The slot a later save must not write over: (slot, its step, released when true, since); see `keep_until`.
        self._kept: tuple[int, int, Callable[[], bool], float] | None = None
        self._segments: list[ShmSegment | None] = [None] * config.num_slots
        # Per slot: its layout, with what a save of the same structure reuses (planning and
        # encoding cost about a millisecond per hundred tensors: 5% of a 256 MB copy at 14 GB/s).
        self._plans: list[_SlotPlan | None] = [None] * config.num_slots
        # Saves run on one thread at a time (the training loop's), so one memo serves every slot.
        self._tree_json = TreeJsonMemo()
        self._views: list[list[torch.Tensor] | None] = [None] * config.num_slots
        self._closed = False
        # The background allocation of the slots a save found missing; while it runs it alone
        # touches those slots' entries above (every other caller joins it first).
        self._prefault: threading.Thread | None = None
        self._stop_prefault = threading.Event()
        self._invalid_reported: set[int] = set()
        cleanup_stale(config.shm_dir, keep=(config.job_id, config.run_id))
        owner_file = owner_path(config.shm_dir, config.job_id, config.run_id)
        self.owns_segments = (not owner_alive(owner_file)) if owner is None else owner
        if self.owns_segments:
            write_owner(config.shm_dir, config.job_id, config.run_id)

    @property
    def pinner(self) -> HostPinner | None:
        """The pinner given, or the one this stager made when it first pinned a slot."""
        return self._pinner

    # -- segments -------------------------------------------------------------------------------

    def _path(self, slot: int) -> Any:
        c = self.config
        return segment_path(c.shm_dir, c.job_id, c.run_id, c.rank, slot)

    def _segment(self, slot: int) -> ShmSegment | None:
        seg = self._segments[slot]
        if seg is None and self._path(slot).exists():
            try:
                seg = ShmSegment.attach(self._path(slot))
            except FlashCkptError:
                seg = None  # a zero-length file: its creator died before sizing it
            self._segments[slot] = seg
        return seg

    def adopt(self, slot: int, seg: ShmSegment) -> bool:
        """Take over `seg`, this rank's `slot` mapped by a reader in this process, if the stager
        has not mapped that slot yet; False leaves `seg` with the caller.

        A restarted process loads its snapshot from one slot and then saves into the slots: the
        mapping the load made (pre-faulted, a tenth of a second per GB) serves both.
        """
        self._join_prefault()
        with self._lock:
            if self._closed or self._segments[slot] is not None or seg.path != self._path(slot):
                return False
            self._segments[slot] = seg
            return True

    def _ensure_capacity(self, slot: int, size: int, step: int) -> ShmSegment:
        seg = self._segment(slot)
        if seg is None:
            seg = ShmSegment.create(self._path(slot), size)
            self._segments[slot] = seg
            return seg
        if seg.size < size:
            self._views[slot] = None
            old = seg.size
            seg.resize(size)
            self._record("grow", step, f"slot {slot} grew from {old} to {size} bytes")
        return seg

    def _slot_views(self) -> list[SlotView]:
        views = []
        for i in range(self.config.num_slots):
            seg = self._segment(i)
            header = None
            if seg is not None:
                try:
                    header = read_header(seg)
                except LayoutError as e:
                    if i not in self._invalid_reported:
                        self._invalid_reported.add(i)
                        self._record("slot_invalid", -1, f"slot {i} has an unreadable header ({e}); it is rewritten")
            if header is None:
                views.append(SlotView(i, SlotState.EMPTY, 0, -1))
            else:
                views.append(SlotView(i, header.state, header.seq, header.step))
        return views

    # -- public API -----------------------------------------------------------------------------

    def prepare(self, state: Any) -> None:
        """Lay `state` out and allocate and pre-fault every slot for it (keeping any snapshot).

        Raises:
            StateStructureError: the state holds an unsupported leaf.
            FlashCkptError: shared memory cannot be allocated.
        """
        self._check_open()
        self._join_prefault()
        flat = flatten_state(state)
        plan, _ = self._new_plan(flat, _leaf_signature(flat), None)
        layout = plan.layout
        pin = self._wants_pin(flat)
        for slot in range(self.config.num_slots):
            with self._lock:
                if slot in self._sealing:
                    continue
            seg = self._ensure_capacity(slot, layout.total_size, -1)
            if pin:
                self._pin(slot, seg, -1, flat)
            try:
                header = read_header(seg)
            except LayoutError:
                header = None  # garbage: the slot holds nothing usable
            if header is None:
                write_header(seg, _empty_header(seg.size))
            elif header.state >= SlotState.COMPLETE:
                continue  # a snapshot to keep (a restarted process may load it)
            if not seg.try_lock(exclusive=True):
                continue
            try:
                # One copy of the state into the slot, whose header stays EMPTY: it touches every
                # page and warms the threads, so the first save costs what later ones cost.
                views = tensor_views(seg, layout.data_off, layout.specs)
                self._copier.copy([(dst, leaf.tensor) for dst, leaf in zip(views, flat.leaves, strict=True)])
                self._plans[slot], self._views[slot] = plan, views
            finally:
                seg.unlock()

    def save(self, step: int, state: Any) -> SaveResult:
        """Copy `state` into a free slot and return once the copy is complete.

        Args:
            step: the training step (any int; the newest *sequence* wins, not the largest step).
            state: nested dicts, lists and tuples of tensors and JSON-able scalars.

        Returns:
            What happened; a skipped snapshot also leaves a ``save_skipped`` event.

        Raises:
            SlotBusyError: no slot was free and the busy policy is ``raise``.
            StateStructureError: the state holds an unsupported leaf (nothing is written).
        """
        self._check_open()
        start = self._clock.now()
        # A slot being allocated in the background is taken only once it is ready.
        self._join_prefault()
        flat = flatten_state(state)
        slot, choice_reason, seq = self._acquire_slot(step, start)
        if slot < 0:
            return SaveResult(step, False, -1, -1, self._clock.now() - start, choice_reason)
        try:
            header = self._write(slot, step, flat, seq)
        except BaseException:
            seg = self._segments[slot]
            if seg is not None:
                seg.unlock()
            raise
        if self.config.seal_in_background:
            with self._lock:
                self._sealing[slot] = self._sealer.submit(self._seal, slot, header)
        else:
            self._seal(slot, header)
        if self.config.prefault_in_background:
            self._start_prefault(slot, flat)
        return SaveResult(step, True, slot, header.seq, self._clock.now() - start, choice_reason)

    def keep_until(self, slot: int, step: int, released: Callable[[], bool]) -> None:
        """Write no later snapshot over `slot` (holding `step`) until `released()` is true, asked at
        each later save on the training thread, or until `busy_wait_timeout_s` has passed: a save
        that finds no other slot free meets the busy policy meanwhile. One slot is kept at a time: a
        newer keep replaces an older one (with two slots the newest snapshot is kept anyway).

        What a persist request needs: the saver reads the slot only once it gets to the request,
        after the node's other ranks' persists; without this a rank saving every step would have
        written over the snapshot before then, and the persist would fail. The time bound keeps a
        saver stuck on storage from stalling training for longer than one busy wait.

        Raises:
            ValueError: `slot` is not one of this stager's slots; nothing changed.
        """
        if not 0 <= slot < self.config.num_slots:
            raise ValueError(f"slot {slot!r} is not one of the {self.config.num_slots} slots")
        self._kept = (slot, step, released, self._clock.now())

    def slot_of(self, step: int) -> int | None:
        """The slot holding this rank's newest complete snapshot of `step`, if any."""
        held = [v for v in self._slot_views() if v.step == step and v.state >= SlotState.COMPLETE]
        return max(held, key=lambda v: v.seq).index if held else None

    def release_kept(self, reason: str) -> None:
        """Let a later save write over the kept slot now (see `keep_until`); a ``keep_released``
        event names its step and `reason`, for the persist of that step may fail."""
        if self._kept is not None:
            _, step, _, _ = self._kept
            self._kept = None
            self._record("keep_released", step, f"step {step}'s snapshot may be written over: {reason}")

    def _kept_slot(self) -> tuple[int, int] | None:
        """(slot, step) of the snapshot kept now, if any (a released or expired keep is dropped)."""
        if self._kept is None:
            return None
        slot, step, released, since = self._kept
        if released():
            self._kept = None
            return None
        if self._clock.now() - since >= self.config.busy_wait_timeout_s:
            self.release_kept(f"kept for busy_wait_timeout_s={self.config.busy_wait_timeout_s} s")
            return None
        return slot, step

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every snapshot saved so far is sealed (and the slots being allocated in the
        background are ready)."""
        self._join_prefault()
        with self._lock:
            pending = list(self._sealing.values())
        for f in pending:
            f.result(timeout=timeout_s)

    def close(self, remove: bool | None = None) -> None:
        """Finish sealing, stop the threads and unmap.

        Args:
            remove: unlink this rank's segments (default: when this stager owns them). The owner
                record goes too once no segment of the run is left.
        """
        if self._closed:
            return
        self._closed = True
        self._stop_prefault.set()
        self._join_prefault()
        self._sealer.shutdown(wait=True)
        self._copier.close()
        for i, seg in enumerate(self._segments):
            self._views[i] = None
            if seg is not None:
                seg.close()
        if self.owns_segments if remove is None else remove:
            for slot in range(self.config.num_slots):
                self._path(slot).unlink(missing_ok=True)
            c = self.config
            owner_file = owner_path(c.shm_dir, c.job_id, c.run_id)
            # The record goes with the last segment when it is ours, or names this process (an
            # earlier stager of it) or a dead one: a record of nothing would only linger.
            if self.owns_segments or _recorded_by_this_process(owner_file) or not owner_alive(owner_file):
                files = list_run_files(c.shm_dir, c.job_id, c.run_id)
                if files == [owner_file]:
                    owner_file.unlink(missing_ok=True)

    # -- internals ------------------------------------------------------------------------------

    def _join_prefault(self) -> None:
        thread = self._prefault
        if thread is not None:
            thread.join()
            self._prefault = None

    def _start_prefault(self, written: int, flat: FlatState) -> None:
        """Allocate (and pin, for device state), in the background, the slots that have no file
        yet, laid out as `written`, which holds `flat`.

        Without it the next save into such a slot pays its page faults on the blocking path (at
        about 1 GB/s here, ten times the warm copy it then makes), and for device state the
        page-locking too (``cudaHostRegister``: about 1.2 s per GB measured on an H200 host, 60
        times the copy).
        """
        plan = self._plans[written]
        if plan is None or self._prefault is not None:
            return
        # `_acquire_slot` mapped every slot that has a file; only this rank's stager creates them.
        missing = [s for s in range(self.config.num_slots) if self._segments[s] is None and not self._path(s).exists()]
        if not missing:
            return
        pinner = None
        if self._wants_pin(flat):
            written_seg = self._segments[written]
            pinner = self._pinner if written_seg is not None and written_seg.pinned else None
        self._prefault = threading.Thread(
            target=self._prefault_slots, args=(missing, plan, pinner), name="flashckpt-prefault", daemon=True
        )
        self._prefault.start()

    def _prefault_slots(self, slots: list[int], plan: _SlotPlan, pinner: HostPinner | None) -> None:
        """The background thread: allocate and map `slots` for `plan`, and pin them with `pinner`
        (a failure leaves the slot to the save that takes it, which allocates it as it always did;
        a refused pin turns pinning off as on the blocking path, saying so)."""
        for slot in slots:
            try:
                path, size = self._path(slot), plan.layout.total_size
                seg = ShmSegment.create_unless_stopped(path, size, self._stop_prefault.is_set)
                if seg is None:
                    return  # stopped by close
                try:
                    views = tensor_views(seg, plan.layout.data_off, plan.layout.specs)
                except BaseException:
                    seg.close()
                    self._path(slot).unlink(missing_ok=True)
                    raise
            except Exception as e:
                _log.warning("rank %d: allocating slot %d in the background failed: %s", self.config.rank, slot, e)
                self._record("prefault_failed", -1, f"slot {slot}: {e}; the save that takes it allocates it instead")
                return
            # Published for the caller that joins this thread; the file reads as never written.
            self._segments[slot], self._plans[slot], self._views[slot] = seg, plan, views
            if self._stop_prefault.is_set():
                return  # closing: the slot stays unpinned, as one a save would pin
            if pinner is not None and not self._pin_in_background(slot, seg, pinner):
                pinner = None

    def _pin_in_background(self, slot: int, seg: ShmSegment, pinner: HostPinner) -> bool:
        """Pin a slot the prefault thread made; False when refused (pinning is then off, as when
        a save's own pin is refused). The caller joins this thread before reading the flag."""
        try:
            seg.pin(pinner)
        except Exception as e:  # any refusal, reported: this thread has no caller to raise to
            self._pin_failed = True
            self._record("pin_failed", -1, f"slot {slot}: {e}; device copies go through pageable memory")
            return False
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise FlashCkptError("the stager is closed")

    def _record(self, kind: str, step: int, reason: str) -> None:
        self.events.record(FlashEvent(kind, step, reason, self._clock.wall_time()))

    def _new_plan(
        self, flat: FlatState, signature: tuple[Any, ...], current: _SlotPlan | None
    ) -> tuple[_SlotPlan, bytes]:
        """A layout for `flat` and its manifest, keeping `current`'s manifest region when it fits."""
        layout = plan_layout(flat, 0, current.layout.manifest_capacity if current else None)
        specs_json = encode_specs(layout.specs)
        tree_json = self._tree_json.encode(flat.tree, flat.negative_zero)
        manifest = encode_manifest(flat.tree, layout.specs, specs_json, tree_json)
        if len(manifest) + ALIGN > layout.manifest_capacity:
            layout = plan_layout(flat, len(manifest))
            specs_json = encode_specs(layout.specs)
        return _SlotPlan(layout, signature, specs_json), manifest

    def _acquire_slot(self, step: int, start: float) -> tuple[int, str, int]:
        """Lock a slot for writing, applying the busy policy.

        Returns:
            (slot, reason, the sequence number its snapshot takes), or (-1, reason, -1).
        """
        while True:
            views = self._slot_views()
            choice = rank_slots(views)
            kept = self._kept_slot()
            for slot in choice.candidates:
                if kept is not None and slot == kept[0]:
                    continue
                with self._lock:
                    if slot in self._sealing and not self._sealing[slot].done():
                        continue
                    self._sealing.pop(slot, None)
                seg = self._segment(slot)
                # A slot with no file yet is created (and locked) by `_write` once the layout is known.
                if seg is None or seg.try_lock(exclusive=True):
                    return slot, choice.reason, max((v.seq for v in views), default=0) + 1
            waited = self._clock.now() - start
            action, reason = decide_busy(self.config.busy_policy, waited, self.config.busy_wait_timeout_s)
            why = choice.reason
            if kept is not None:
                why += f"; slot {kept[0]} keeps step {kept[1]} until the saver holds it for its persist"
            if action is BusyAction.RAISE:
                self._record("save_skipped", step, reason)
                raise SlotBusyError(f"step {step}: {reason} ({why})")
            if action is BusyAction.SKIP:
                self._record("save_skipped", step, f"{reason} ({why})")
                return -1, reason, -1
            self._clock.sleep(self.config.busy_poll_interval_s)

    def _write(self, slot: int, step: int, flat: FlatState, seq: int) -> SlotHeader:
        signature = _leaf_signature(flat)
        current = self._plans[slot]
        if current is not None and current.signature == signature:
            # The slot keeps its layout, so the copy need not wait for the manifest: it is encoded
            # and written while the copy threads run (the walk and the manifest are the blocking
            # path's only work besides the copy).
            seg, pending = self._start_copy(slot, seq, step, flat, current)
            layout = current.layout
            try:
                tree_json = self._tree_json.encode(flat.tree, flat.negative_zero)
                manifest = encode_manifest(flat.tree, layout.specs, current.specs_json, tree_json)
                fits = len(manifest) + ALIGN <= layout.manifest_capacity
                if fits:
                    write_manifest(seg, manifest, HEADER_SIZE)
                    header = self._header(SlotState.COMPLETE, seq, step, layout, seg, manifest=manifest)
            finally:
                pending.wait()
            if fits:
                write_header(seg, header)
                return header
            # The non-tensor values outgrew the manifest region: the slot is laid out again below
            # and the tensors copied again (the slot is locked and marked WRITING throughout).
        plan, manifest = self._new_plan(flat, signature, current)
        seg, pending = self._start_copy(slot, seq, step, flat, plan)
        pending.wait()
        write_manifest(seg, manifest, HEADER_SIZE)
        header = self._header(SlotState.COMPLETE, seq, step, plan.layout, seg, manifest=manifest)
        write_header(seg, header)
        return header

    def _start_copy(
        self, slot: int, seq: int, step: int, flat: FlatState, plan: _SlotPlan
    ) -> tuple[ShmSegment, PendingCopy]:
        """Make `slot` fit `plan`, mark it WRITING and start copying `flat`'s tensors into it."""
        layout = plan.layout
        existed = self._segments[slot] is not None
        seg = self._ensure_capacity(slot, layout.total_size, step)
        if not existed and not seg.try_lock(exclusive=True):  # a fresh file nobody else knows yet
            raise FlashCkptError(f"cannot lock new segment {seg.path}")
        if not seg.pinned and self._wants_pin(flat):
            self._pin(slot, seg, step, flat)
        previous_plan = self._plans[slot]
        previous = previous_plan.layout if previous_plan is not None else None
        if previous is not None and previous is not layout and previous.data_signature != layout.data_signature:
            self._record("relayout", step, f"slot {slot}: the state's tensors changed; the slot is laid out again")
        moved = previous is None or (
            previous is not layout
            and (previous.data_signature, previous.data_off) != (layout.data_signature, layout.data_off)
        )
        if moved or self._views[slot] is None:
            self._views[slot] = tensor_views(seg, layout.data_off, layout.specs)
        self._plans[slot] = plan
        # Before the first byte of data: a crash during the copy leaves a slot nobody persists or loads.
        write_header(seg, self._header(SlotState.WRITING, seq, step, layout, seg, manifest=b""))
        views = self._views[slot]
        assert views is not None
        return seg, self._copier.start([(dst, leaf.tensor) for dst, leaf in zip(views, flat.leaves, strict=True)])

    @staticmethod
    def _header(
        state: SlotState, seq: int, step: int, layout: SlotLayout, seg: ShmSegment, *, manifest: bytes
    ) -> SlotHeader:
        return SlotHeader(
            state=state,
            seq=seq,
            step=step,
            manifest_len=len(manifest),
            manifest_crc=crc32(manifest),
            n_tensors=len(layout.specs),
            checksum_off=layout.checksum_off,
            data_off=layout.data_off,
            data_len=layout.data_len,
            capacity=seg.size,
        )

    def _wants_pin(self, flat: FlatState) -> bool:
        choice = self.config.pin_host_memory
        if choice is False or self._pin_failed:
            return False
        return choice is True or any(leaf.tensor.is_cuda for leaf in flat.leaves)

    def _pin(self, slot: int, seg: ShmSegment, step: int, flat: FlatState) -> None:
        """Page-lock `seg` unless it is; a refusal turns pinning off for this stager, with an event."""
        if seg.pinned or self._pin_failed:
            return
        try:
            if self._pinner is None:
                self._pinner = CudaHostPinner(_cuda_device(flat))
            seg.pin(self._pinner)
        except CudaErrorPending:
            self._pin_failed = True  # not again: this save reports it, later ones copy unpinned
            raise
        except PinError as e:
            self._pin_failed = True
            self._record("pin_failed", step, f"slot {slot}: {e}; device copies go through pageable memory")

    def _lower_seal_priority(self) -> None:
        # Runs on the sealing thread: on Linux a thread id names one thread for setpriority, so
        # only sealing yields; the copy threads and the training threads keep their priority.
        if not self.config.seal_nice:
            return
        try:
            lower_thread_priority(self.config.seal_nice)
        except OSError as e:
            self._record("priority_unchanged", -1, f"cannot lower the sealing thread's priority: {e}")

    def _seal(self, slot: int, header: SlotHeader) -> None:
        seg = self._segments[slot]
        plan = self._plans[slot]
        assert seg is not None
        assert plan is not None
        try:
            sealed = seal_slot(seg, header, plan.layout.specs)
        except Exception as e:
            self._record("seal_failed", header.step, f"slot {slot}: {e}")
            seg.unlock()
            raise
        seg.unlock()
        if self._on_sealed is not None:
            try:
                self._on_sealed(SealedNotice(self.config.rank, slot, sealed.seq, sealed.step))
            except Exception as e:  # the saver link reports its own failures; never lose the snapshot
                self._record("notify_failed", sealed.step, f"on_sealed failed: {e}")


@attrs.frozen
class _SlotPlan:
    """A slot's layout, the leaf signature it was planned for, and its encoded tensor list."""

    layout: SlotLayout
    signature: tuple[Any, ...]
    specs_json: str


def _cuda_device(flat: FlatState) -> int | None:
    """The device index of the state's first CUDA tensor (None when it has none)."""
    for leaf in flat.leaves:
        if leaf.tensor.is_cuda:
            return leaf.tensor.device.index
    return None


def _leaf_signature(flat: FlatState) -> tuple[Any, ...]:
    """What a slot's layout depends on: each leaf's path, dtype, shape and kind, in order."""
    return tuple((leaf.path, leaf.tensor.dtype, leaf.tensor.shape, leaf.is_ndarray) for leaf in flat.leaves)


def _empty_header(capacity: int) -> SlotHeader:
    return SlotHeader(
        state=SlotState.EMPTY,
        seq=0,
        step=-1,
        manifest_len=0,
        manifest_crc=0,
        n_tensors=0,
        checksum_off=HEADER_SIZE,
        data_off=HEADER_SIZE,
        data_len=0,
        capacity=capacity,
    )


def _recorded_by_this_process(path: Path) -> bool:
    try:
        return int(json.loads(path.read_text())["pid"]) == os.getpid()
    except (OSError, ValueError, KeyError, TypeError):
        return False
