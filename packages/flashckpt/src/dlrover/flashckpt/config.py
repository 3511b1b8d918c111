"""Configuration of the stager, loader and saver: frozen, validated at construction."""

from __future__ import annotations

import os
from typing import Any

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative, positive
from dlrover.flashckpt.errors import FlashCkptError
from dlrover.flashckpt.segment import default_shm_dir, validate_id
from dlrover.flashckpt.slots import BusyPolicy

__all__ = ["StagerConfig"]


def _id(kind: str) -> Any:
    def check(_inst: object, _attr: object, value: str) -> None:
        try:
            validate_id(kind, value)
        except FlashCkptError as e:
            raise ConfigError(str(e)) from None

    return check


def _default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@attrs.frozen
class StagerConfig:
    """Where a rank's snapshots live in shared memory and how they are written.

    Attributes:
        job_id: names the job in segment names (letters, digits, ``_``, ``-``).
        run_id: names this run of the job; segments of other runs of dead jobs are cleaned up.
        rank: the global rank whose state this stager holds.
        world_size: ranks in the job.
        shm_dir: where segments live (default: ``$DLROVER_FLASHCKPT_SHM_DIR``, which
            ``dlrover-run --checkpoint-shm-dir`` sets for its workers, else ``/dev/shm``).
        num_slots: slots per rank (two for double buffering).
        copy_threads: threads copying tensors into shared memory.
        copy_chunk_bytes: large tensors are copied in pieces of this size.
        busy_policy: what `save` does when no slot is free (`BusyPolicy`).
        busy_wait_timeout_s: how long the ``wait`` policy waits before skipping.
        busy_poll_interval_s: how often a waiting `save` checks the slots again.
        seal_in_background: compute checksums on a background thread (True) or before `save`
            returns (False).
        verify_on_load: check checksums when loading from memory.
        seal_nice: niceness added to the sealing thread only (Linux sets it per thread), 0-19.
            Sealing computes a CRC-32 of the whole state; at the training threads' priority it
            takes a core from them right after every save (a 2-core machine measured training
            steps about 2x slower while it ran). At 19 it runs on CPU time training leaves idle.
        lock_timeout_s: how long a loader waits for a slot another party holds.
        prefault_in_background: after a save, allocate and pre-fault on a background thread the
            slots that have no shared memory yet, laid out as the slot just written, so the next
            save does not pay their page faults (about ten times a warm copy). Without
            `Stager.prepare` only the first save pays them. A save waits for that thread rather
            than write into a slot it is still allocating; ``close`` stops it.
        pin_host_memory: page-lock the slots for device copies (`dlrover.flashckpt.pinning`).
            None (default): when the state holds CUDA tensors, so their copies run on the copy
            engine straight into shared memory; False: never (copies go through the driver's
            pageable path, slower, but no memory is locked); True: always.
    """

    job_id: str = attrs.field(validator=_id("job"))
    run_id: str = attrs.field(validator=_id("run"))
    rank: int = attrs.field(default=0, validator=non_negative)
    world_size: int = attrs.field(default=1, validator=positive)
    shm_dir: str = attrs.field(factory=default_shm_dir)
    num_slots: int = attrs.field(default=2)
    copy_threads: int = attrs.field(factory=_default_threads, validator=positive)
    copy_chunk_bytes: int = attrs.field(default=32 << 20, validator=positive)
    busy_policy: BusyPolicy = attrs.field(default=BusyPolicy.WAIT, converter=BusyPolicy)
    busy_wait_timeout_s: float = attrs.field(default=30.0, validator=non_negative)
    busy_poll_interval_s: float = attrs.field(default=0.005, validator=positive)
    seal_in_background: bool = True
    verify_on_load: bool = True
    lock_timeout_s: float = attrs.field(default=30.0, validator=non_negative)
    seal_nice: int = attrs.field(default=19)
    prefault_in_background: bool = True
    pin_host_memory: bool | None = attrs.field(default=None)

    @pin_host_memory.validator
    def _check_pin(self, _attr: object, value: object) -> None:
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"pin_host_memory must be True, False or None, got {value!r}")

    @num_slots.validator
    def _check_slots(self, _attr: object, value: int) -> None:
        if value < 2:
            raise ConfigError(f"num_slots must be >= 2 for double buffering, got {value!r}")

    @seal_nice.validator
    def _check_seal_nice(self, _attr: object, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 19:
            raise ConfigError(f"seal_nice must be an int from 0 to 19, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.rank >= self.world_size:
            raise ConfigError(f"rank {self.rank} is not below world_size {self.world_size}")
        if not os.path.isdir(self.shm_dir):
            raise ConfigError(f"shm_dir {self.shm_dir!r} is not a directory")
