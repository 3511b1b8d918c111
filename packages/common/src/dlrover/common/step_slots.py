"""Step reports from training processes to their node's agent through a shared file.

The agent creates one small file (a tmpfs file under its own node directory) with one 128-byte
slot per local worker and tells every worker its path (`STEP_SLOTS_ENV_VAR`) and its slot
(`STEP_SLOT_ENV_VAR`). A worker maps the file and writes its progress into its slot; the agent
reads every slot each monitor tick. A report is a few stores into mapped memory and a read of
CLOCK_MONOTONIC (a vDSO call): no system call, no RPC, cheap enough for every step.

File layout (little endian):

* header, 64 bytes: magic ``b"DLRSLOT3"``, u32 slot count, u32 slot size (128), u64 save request
  (written by the agent only: a counter it raises to ask the workers for a flash checkpoint before
  a planned rendezvous round; see `StepSlotFile.request_save`), zero padding;
* slot ``i`` at ``64 + 128 * i``: u64 sequence, i64 step, i64 samples, f64 step end (seconds on
  CLOCK_MONOTONIC, shared by every process of the node), f64 phase start, u32 phase code, u32 pid,
  f64 ready (when the worker was ready to train: its first write, or the end of a checkpoint
  phase before its first step), f64 load seconds (in the checkpoint phase before the first step),
  f64 save seconds (in the checkpoint phase after it), u64 served save request (the newest agent
  request a sealed flash checkpoint of this worker answered), u32 polls save requests (1 once the
  worker's script has asked whether the agent wants a save: it answers requests), u32 marks (how
  many step marks moved the step, modulo 2**32: with the step it tells how many steps one mark
  covers, which the agent's reads cannot when several marks fall between two), i64 synced step
  (the step mark after which the last lead was counted, see `StepReporter.synchronizing`), f64
  lead seconds and u64 lead count (the summed time from a step's start to its first
  synchronization point, and how many steps that sum covers), i64 first mark (the step of the
  first step mark in the slot), i64 sync group (the smallest global rank of the group the rank
  synchronizes with).

The goodput accounting reads ready, load and save seconds: a checkpoint phase before the first
step is the checkpoint load, one after it is training blocked by a save.

The lead time finds a straggler in a synchronous job, where every rank's step takes as long as
the slowest rank's (the others wait for it in the gradient all-reduce): the time from the start
of a step to the rank's first synchronization point is its own work, and the slow rank's is the
longest. A step starts at the rank's last step mark, or when it last came back to the ``train``
phase after that (a save between two steps is not the next step's work). The first two steps
after the slot's first mark count no lead: the first compiles and warms caches, and a restored
process's first mark is its checkpoint's step, not a trained one.

Writers of one slot must not write at the same moment from two threads (the seqlock has one
writer at a time): a DDP communication hook runs on autograd's thread while the training thread
waits in ``backward()``, which is fine; a thread of one's own that reports while the training
thread does is not.

The sequence is a seqlock: a writer makes it odd, writes the fields, makes it even again; a reader
retries while it is odd or changed under it (sleeping between tries after the first hundred, for
at most 20 ms: a writer may be descheduled inside its write). Sequence 0 means the slot was never
written.

Writers read-modify-write the slot itself and keep no copy, so several writers in one process (the
script's own reports, a checkpointer's, a sampler's) never undo each other's fields.

This module imports only the standard library: training processes load it for free.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import mmap
import os
import signal
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import attrs

from dlrover.common.errors import ConfigError

__all__ = [
    "PHASES",
    "STACK_DUMP_ENV_VAR",
    "STEP_SLOTS_ENV_VAR",
    "STEP_SLOT_ENV_VAR",
    "SlotReading",
    "StepSlotFile",
    "StepReporter",
    "optional_reporter",
]

STEP_SLOTS_ENV_VAR = "DLROVER_STEP_SLOTS"
"""The path of the node's step slot file, set by the agent."""

STEP_SLOT_ENV_VAR = "DLROVER_STEP_SLOT"
"""This worker's slot in that file (its local rank), set by the agent."""

STACK_DUMP_ENV_VAR = "DLROVER_STACK_DUMP_FILE"
"""The file this worker's faulthandler writes its stacks to on SIGUSR1, set by the agent."""

_log = logging.getLogger(__name__)

PHASES: tuple[str, ...] = ("train", "checkpoint", "eval", "wait")
"""The phases a slot can carry, by code. ``wait``: the script holds training on purpose (for an
operator, for data to arrive, for the job to grow), so it is not judged by its step pace. The slot
keeps no sum of it: the goodput accounting counts a hold as part of the step after it."""

_MAGIC = b"DLRSLOT3"
_HEADER = struct.Struct("<8sII")
_SAVE_REQUEST = struct.Struct("<Q")
_SAVE_REQUEST_OFFSET = _HEADER.size
_SLOT = struct.Struct("<QqqddIIdddQIIqdQqq")
_MARKS_MODULUS = 1 << 32
_SLOT_SIZE = 128
_CHECKPOINT_CODE = PHASES.index("checkpoint")
_TRAIN_CODE = PHASES.index("train")
_HEADER_SIZE = 64
_MAX_SLOTS = 4096
_READ_TRIES = 100
# A writer descheduled inside its write leaves the sequence odd for a scheduler tick or more (a
# loaded host runs the training processes on every core), far longer than the tight retries last:
# the reader then sleeps between tries, for at most this long, before it reports no reading.
_READ_BACKOFF_S = 0.0005
_READ_PATIENCE_S = 0.02


@attrs.frozen
class SlotReading:
    """One consistent read of a slot.

    Attributes:
        seq: the slot's sequence (grows with every write; even).
        step: the steps the worker finished.
        samples: the samples it consumed, in total.
        step_end_s: when it finished its last step (CLOCK_MONOTONIC seconds; 0 before the first).
        phase: what it does now (one of `PHASES`).
        phase_since_s: when it entered that phase.
        pid: the writer's process id.
        ready_s: when it was ready to train (CLOCK_MONOTONIC seconds): its first write, or the
            end of its last checkpoint phase before its first step (a checkpoint load).
        load_s: seconds it spent in the checkpoint phase before its first step.
        save_s: seconds it spent in the checkpoint phase after that (blocked by saves).
        served_request: the newest save request (`StepSlotFile.request_save`) a flash checkpoint
            of this worker answered; 0 before any.
        polls_save_requests: the worker's script asks whether the agent wants a save (see
            `StepReporter.mark_polling_save_requests`), so a request gets an answer.
        lead_s: the summed seconds from the start of a step to the rank's first synchronization
            point in it, over `lead_steps` steps (see `StepReporter.synchronizing`).
        lead_steps: how many steps `lead_s` covers; 0 when the worker reports none.
        sync_group: the smallest global rank of the group the worker synchronizes with (0: the
            whole job); lead times compare only within one group.
        marks: how many step marks moved the step, modulo 2**32 (see `steps_per_mark`).
    """

    seq: int
    step: int
    samples: int
    step_end_s: float
    phase: str
    phase_since_s: float
    pid: int
    ready_s: float = 0.0
    load_s: float = 0.0
    save_s: float = 0.0
    served_request: int = 0
    polls_save_requests: bool = False
    lead_s: float = 0.0
    lead_steps: int = 0
    sync_group: int = 0
    marks: int = 0

    def steps_per_mark(self, before: SlotReading) -> float | None:
        """How many steps each mark since `before` (an older read of the same slot) covered on
        average; None when no mark moved the step in between, when `before` had no mark yet (a
        process's first mark may be a restored checkpoint's step, not steps it took), or when the
        step went down (a reset slot)."""
        marks = (self.marks - before.marks) % _MARKS_MODULUS
        steps = self.step - before.step
        if before.marks == 0 or marks == 0 or steps < marks:
            return None
        return steps / marks


def _offset(index: int) -> int:
    return _HEADER_SIZE + _SLOT_SIZE * index


def _read_slot(buf: mmap.mmap, index: int) -> SlotReading | None:
    consistent, reading = _try_read_slot(buf, index, _READ_TRIES)
    if consistent:
        return reading
    deadline = time.monotonic() + _READ_PATIENCE_S
    while not consistent and time.monotonic() < deadline:
        time.sleep(_READ_BACKOFF_S)
        consistent, reading = _try_read_slot(buf, index, 1)
    return reading  # None when inconsistent still: its writer died inside a write, or stays descheduled


def _try_read_slot(buf: mmap.mmap, index: int, tries: int) -> tuple[bool, SlotReading | None]:
    """Whether a consistent read of slot `index` came within `tries` tries, and the reading (None
    when the slot was never written)."""
    off = _offset(index)
    for _ in range(tries):
        (
            seq,
            step,
            samples,
            end_s,
            since_s,
            code,
            pid,
            ready_s,
            load_s,
            save_s,
            served,
            polls,
            marks,
            _,
            lead_s,
            leads,
            _,
            group,
        ) = _SLOT.unpack_from(buf, off)
        if seq == 0:
            return True, None
        if seq % 2 == 1:
            continue  # a write is under way
        if struct.unpack_from("<Q", buf, off)[0] != seq:
            continue
        phase = PHASES[code] if code < len(PHASES) else PHASES[0]
        return True, SlotReading(
            seq,
            step,
            samples,
            end_s,
            phase,
            since_s,
            pid,
            ready_s,
            load_s,
            save_s,
            served,
            bool(polls),
            lead_s,
            leads,
            group,
            marks,
        )
    return False, None


class StepSlotFile:
    """The agent's side: creates the file and reads every slot.

    Args:
        path: the file to create (replaced if it exists).
        slots: how many workers report (1 to 4096).

    Raises:
        ConfigError: if `slots` is out of range.
    """

    def __init__(self, path: str | os.PathLike[str], slots: int) -> None:
        if not isinstance(slots, int) or not 1 <= slots <= _MAX_SLOTS:
            raise ConfigError(f"slots must be an integer in [1, {_MAX_SLOTS}], got {slots!r}")
        self.path = Path(path)
        self.slots = slots
        size = _offset(slots)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._buf: mmap.mmap | None = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _HEADER.pack_into(self._buf, 0, _MAGIC, slots, _SLOT_SIZE)

    def _mapped(self) -> mmap.mmap:
        if self._buf is None:
            raise ConfigError(f"step slot file {self.path} is closed")
        return self._buf

    def request_save(self) -> int:
        """Ask every worker for a flash checkpoint (a planned round is coming); returns the new
        request number. Workers see it through `StepReporter.save_request` (a checkpointer's
        ``save_requested()``); the counter survives `reset`, so a new worker never mistakes an
        old request for a new one (it remembers the number it found when it started)."""
        buf = self._mapped()
        number = int(_SAVE_REQUEST.unpack_from(buf, _SAVE_REQUEST_OFFSET)[0]) + 1
        _SAVE_REQUEST.pack_into(buf, _SAVE_REQUEST_OFFSET, number)  # one aligned 8-byte store
        return number

    def reset(self) -> None:
        """Clear every slot (before a new set of workers starts)."""
        buf = self._mapped()
        buf[_HEADER_SIZE:] = bytes(len(buf) - _HEADER_SIZE)

    def read(self, index: int) -> SlotReading | None:
        """Slot `index`, or None while it was never written (or no consistent read was possible)."""
        if not 0 <= index < self.slots:
            raise ConfigError(f"slot index must be in [0, {self.slots}), got {index!r}")
        return _read_slot(self._mapped(), index)

    def read_all(self) -> dict[int, SlotReading]:
        """Every written slot, by index."""
        buf = self._mapped()
        out = {}
        for index in range(self.slots):
            reading = _read_slot(buf, index)
            if reading is not None:
                out[index] = reading
        return out

    def close(self, *, remove: bool = True) -> None:
        """Unmap the file and (by default) remove it. Idempotent."""
        if self._buf is not None:
            self._buf.close()
            self._buf = None
        if remove:
            self.path.unlink(missing_ok=True)


class StepReporter:
    """A training process's side: writes its own slot.

    Args:
        path: the slot file the agent created.
        index: this process's slot.
        clock: seconds on CLOCK_MONOTONIC (injectable for tests).

    Raises:
        ConfigError: if the file is not a step slot file or `index` is out of range.
    """

    def __init__(
        self, path: str | os.PathLike[str], index: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _HEADER_SIZE:
                raise ConfigError(f"{path} is not a step slot file ({size} bytes)")
            buf = mmap.mmap(f.fileno(), size)
        magic, slots, slot_size = _HEADER.unpack_from(buf, 0)
        if magic != _MAGIC or slot_size != _SLOT_SIZE or size < _offset(slots):
            buf.close()
            raise ConfigError(f"{path} is not a step slot file (magic {magic!r}, {slots} slots of {slot_size} bytes)")
        if not isinstance(index, int) or not 0 <= index < slots:
            buf.close()
            raise ConfigError(f"slot index must be in [0, {slots}), got {index!r}")
        self._buf: mmap.mmap | None = buf
        self._off = _offset(index)
        self._pid = os.getpid()
        self._dump_file: IO[str] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StepReporter | None:
        """The writer the agent set up for this process, or None when not run by `dlrover-run`.

        When the agent names a stack-dump file (`STACK_DUMP_ENV_VAR`), this also registers
        ``faulthandler`` for SIGUSR1 to write every thread's stack there, so the agent can see
        where a hung process is blocked; it stays registered for the life of the process.

        Raises:
            ConfigError: if the variables are set but wrong.
        """
        env = os.environ if environ is None else environ
        path = env.get(STEP_SLOTS_ENV_VAR, "")
        if not path:
            return None
        raw = env.get(STEP_SLOT_ENV_VAR, "")
        try:
            index = int(raw)
        except ValueError:
            raise ConfigError(f"{STEP_SLOT_ENV_VAR} must be an integer, got {raw!r}") from None
        writer = cls(path, index)
        dump = env.get(STACK_DUMP_ENV_VAR, "")
        if dump:
            writer._register_stack_dump(dump)
        return writer

    def _register_stack_dump(self, path: str) -> None:
        # Opened once and kept: the handler writes from signal context, where nothing can be opened.
        self._dump_file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR1, file=self._dump_file, all_threads=True, chain=False)

    def _mapped(self) -> mmap.mmap:
        if self._buf is None:
            raise ConfigError("the step slot writer is closed")
        return self._buf

    def _write(
        self,
        *,
        step: int | None = None,
        add_samples: int = 0,
        phase: str | None = None,
        served_request: int = 0,
        polls_save_requests: bool = False,
        synchronizing: bool = False,
        sync_group: int = 0,
        earlier_lead_s: float = 0.0,
        now: float | None = None,
    ) -> float | None:
        buf = self._mapped()
        off = self._off
        (
            seq,
            cur_step,
            samples,
            end_s,
            since_s,
            code,
            _pid,
            ready_s,
            load_s,
            save_s,
            served,
            polls,
            marks,
            synced_step,
            lead_s,
            leads,
            first_mark,
            group,
        ) = _SLOT.unpack_from(buf, off)
        t = self._clock() if now is None else now
        lead: float | None = None
        if synchronizing:
            # Only the first synchronization point of a step, in training (an eval's collectives
            # are not a step's), from the third step after the slot's first mark (see above).
            if first_mark <= 0 or cur_step <= first_mark or code != _TRAIN_CODE or synced_step >= cur_step:
                return None
            started = max(end_s, since_s)  # the step mark, or the return to train after a save
            lead = max(t - started, 0.0)
            synced_step, lead_s, leads, group = cur_step, lead_s + lead + earlier_lead_s, leads + 1, sync_group
        if seq == 0:
            since_s = ready_s = t  # the first write starts the phase clock
        new_step = cur_step
        if step is not None and step > cur_step:
            new_step, end_s = step, t
            first_mark = first_mark or step
            marks = (marks + 1) % _MARKS_MODULUS
        if phase is not None:
            new_code = PHASES.index(phase)
            if new_code != code:
                if code == _CHECKPOINT_CODE and seq != 0:
                    # Leaving a checkpoint phase: a load before the first step, a save after it.
                    if cur_step <= 0:
                        load_s += max(t - since_s, 0.0)
                        ready_s = t
                    else:
                        save_s += max(t - since_s, 0.0)
                code, since_s = new_code, t
        struct.pack_into("<Q", buf, off, seq | 1)
        _SLOT.pack_into(
            buf,
            off,
            seq | 1,
            new_step,
            samples + add_samples,
            end_s,
            since_s,
            code,
            self._pid,
            ready_s,
            load_s,
            save_s,
            max(served, served_request),
            1 if polls or polls_save_requests else 0,
            marks,
            synced_step,
            lead_s,
            leads,
            first_mark,
            group,
        )
        struct.pack_into("<Q", buf, off, (seq | 1) + 1)
        return lead

    def step(self, step: int | None = None, *, samples: int = 0) -> None:
        """Mark the end of a step.

        Args:
            step: the steps finished so far; None counts one more than the slot holds. A value not
                above the slot's keeps the step (the end time moves only when it grows).
            samples: samples consumed since the last report.

        Raises:
            ConfigError: on a negative step or sample count.
        """
        if step is not None and step < 0:
            raise ConfigError(f"step must be >= 0, got {step!r}")
        if samples < 0:
            raise ConfigError(f"samples must be >= 0, got {samples!r}")
        if step is None:
            step = _SLOT.unpack_from(self._mapped(), self._off)[1] + 1
        self._write(step=step, add_samples=samples)

    def synchronizing(self, group: int = 0, *, earlier_lead_s: float = 0.0) -> float | None:
        """Mark that this rank reached the first synchronization point of its step: it is about
        to enter the gradient all-reduce (or the first collective its peers wait in). Call it as
        often as convenient (every gradient bucket): only the first call after a step mark
        counts, as the end of the rank's own work in that step.
        `dlrover.diagnosis.report_gradient_sync` calls it from a DDP model's communication hook.

        The master compares these lead times across the ranks of one group: in a synchronous job
        a rank whose own work is slow (a slow input pipeline, a slow host, CPU-bound work) makes
        every rank's step slow, but only its own lead is long. The time is read on the CPU: work
        queued on an accelerator and not yet waited for is not in it; a caller that times the
        accelerator's side too adds what it found there with a later call (`earlier_lead_s`).

        Args:
            group: the smallest global rank of the group this rank synchronizes with (its
                data-parallel group; 0, the default, when that is the whole job): ranks of
                different groups (pipeline stages) may differ in lead by design.
            earlier_lead_s: seconds to add to the leads of steps counted before this one (their
                own work on an accelerator, longer than the CPU saw, known only once the
                accelerator got there). Written with this step's lead, so a reader sees the sum
                and the count move together; not written when this call counts no lead.

        Returns:
            The lead counted for this step (seconds on the CPU), or None when this call counted
            none (not the step's first, not in training, or one of the first steps).

        Raises:
            ConfigError: on a negative group or `earlier_lead_s` that is negative or not finite.
        """
        if not isinstance(group, int) or isinstance(group, bool) or group < 0:
            raise ConfigError(f"group must be an integer >= 0, got {group!r}")
        if (
            isinstance(earlier_lead_s, bool)
            or not isinstance(earlier_lead_s, (int, float))
            or not (0.0 <= earlier_lead_s < math.inf)
        ):
            raise ConfigError(f"earlier_lead_s must be a finite number >= 0, got {earlier_lead_s!r}")
        return self._write(synchronizing=True, sync_group=group, earlier_lead_s=float(earlier_lead_s))

    def save_request(self) -> int:
        """The agent's save request number (see `StepSlotFile.request_save`); 0 before any."""
        return int(_SAVE_REQUEST.unpack_from(self._mapped(), _SAVE_REQUEST_OFFSET)[0])

    def serve_save_request(self, request: int) -> None:
        """Record that a sealed flash checkpoint answered the agent's save request `request`
        (the number `save_request` read before the save began): the agent's wait before a planned
        round ends once every worker has answered its request. The recorded number only grows.

        Raises:
            ConfigError: on a negative number.
        """
        if not isinstance(request, int) or request < 0:
            raise ConfigError(f"request must be an integer >= 0, got {request!r}")
        self._write(served_request=request)

    def mark_polling_save_requests(self) -> None:
        """Record that this worker's script asks for the agent's save requests (a checkpointer's
        ``save_requested()`` does, the first time it is called): the agent then knows a request
        will be answered, and waits for the answer before it stops the workers on SIGTERM. The
        mark stays for the life of the slot's worker."""
        self._write(polls_save_requests=True)

    def add_samples(self, samples: int) -> None:
        """Count `samples` more consumed samples without marking a step.

        Raises:
            ConfigError: on a negative count.
        """
        if samples < 0:
            raise ConfigError(f"samples must be >= 0, got {samples!r}")
        self._write(add_samples=samples)

    @property
    def current_phase(self) -> str:
        """The phase this process is in (one of `PHASES`): the last `phase` entered, "train" before any.

        Raises:
            ConfigError: the writer is closed.
        """
        code = _SLOT.unpack_from(self._mapped(), self._off)[5]
        return PHASES[code] if code < len(PHASES) else PHASES[0]

    def phase(self, name: str) -> None:
        """Enter phase `name` (one of `PHASES`): checkpoint, eval and wait get their own hang
        allowances; enter ``train`` again when the phase ends.

        Raises:
            ConfigError: on an unknown phase.
        """
        if name not in PHASES:
            raise ConfigError(f"phase must be one of {', '.join(PHASES)}; got {name!r}")
        self._write(phase=name)

    def close(self) -> None:
        """Unmap the slot (the stack-dump handler, if any, stays). Idempotent."""
        if self._buf is not None:
            self._buf.close()
            self._buf = None


def optional_reporter(environ: Mapping[str, str] | None = None) -> StepReporter | None:
    """`StepReporter.from_env`, for libraries that report on the user's behalf (a checkpointer's
    save, a sampler's commit): None when not under `dlrover-run`, and a warning instead of an
    error when the agent's file cannot be used, so reporting never stops training."""
    try:
        return StepReporter.from_env(environ)
    except (ConfigError, OSError, ValueError) as exc:
        _log.warning("step reports are off in this process: %s", exc)
        return None
