"""Flash checkpoints for a PS job: the chief saves into memory and the master persists each save in the background.

Under `ParameterServerStrategy` every task holding variables writes its own share of a checkpoint: each parameter
server its data file, the chief the merged index and then the `checkpoint` state file. So the checkpoint directory
must be one the chief and every server see. On the local backend they all run on this host, and a memory file
system (`/dev/shm`, tmpfs) is such a place: a save there is a copy in memory rather than a write to storage (a
network file system's costs seconds, during which the chief does not train), and the chief restores from memory
after a lost server or a restart of its own.

`FlashCheckpoints` decides where the chief saves, `live_dir` (its `DLROVER_CHECKPOINT_DIR`):

- **in memory**: `<memory_root>/dlrover-<job>-<hash of the storage path>` (0700, a marker file naming the storage,
  locked while a master uses it), while memory has room for what storage holds, two more checkpoints of the
  newest one's size and a reserve. It is filled from storage first; a `CheckpointMirror` thread then copies every
  checkpoint the chief commits to storage (`--checkpoint-dir`) every `poll_s`;
- **in storage** otherwise, and from a chief's launch on which memory has no room left, for the rest of the job
  (the move waits for a last copy that leaves storage holding what memory holds; while it cannot, the chief stays
  in memory).

When the job ends the last copy is made and the memory directory removed, unless the copy failed (it holds the only
copy then; the event says where). A master killed with SIGKILL cannot remove it; the next master of the same job
and storage adopts it, persisting what it had not, when it holds storage's newest checkpoints (else storage moved
on without it, and it is discarded). A directory by that name that this user did not make private is never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

from dlrover.common import Clock
from dlrover.master.psjob.checkpoint_mirror import MirrorPass, checkpoint_files, in_progress, mirror_once, state_digests
from dlrover.master.psjob.core import PsEvent
from dlrover.master.psjob.mirror_thread import CheckpointMirror, read_record, write_record
from dlrover.master.psjob.state_file import STATE_FILE, state_paths
from dlrover.master.psjob.tf_checkpoint import CheckpointReadError, newest_checkpoint

__all__ = ["DEFAULT_FLASH_ROOT", "MARKER_FILE", "FlashCheckpoints", "checkpoint_number", "free_bytes"]

DEFAULT_FLASH_ROOT = "/dev/shm"  # noqa: S108 (the directory made in it is 0700 and checked before it is reused)
"""Linux's memory file system, which every process of the host sees."""
MARKER_FILE = ".dlrover-flash"
"""In a memory directory: the storage directory it is the memory copy of (locked while a master uses it)."""
_MIB = 1024 * 1024
RECORD_FILE = ".dlrover-flash-storage"
"""In a memory directory: the digests of storage's state files as the copies left them (`mirror_thread`)."""
_IGNORED = frozenset({MARKER_FILE, RECORD_FILE})
_NUMBER = re.compile(r"-(\d+)$")
_TOMBSTONE = ".removing-"


def free_bytes(path: Path) -> int:
    """The bytes a memory file system can still take: its free space, and no more than the host's available
    memory (tmpfs pages are memory, and its size is only a cap)."""
    free = shutil.disk_usage(path).free
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            line = next(entry for entry in meminfo if entry.startswith("MemAvailable:"))
        free = min(free, int(line.split()[1]) * 1024)
    return free


def _states(directory: Path) -> dict[str, list[str]]:
    """Each state file under `directory` (relative path) and the checkpoints it names, newest first."""
    out = {}
    for path in directory.rglob(STATE_FILE):
        with contextlib.suppress(OSError):
            out[path.relative_to(directory).as_posix()] = list(
                state_paths(path.read_text(encoding="utf-8", errors="replace"))
            )
    return out


def _sizes(directory: Path) -> dict[str, int]:
    """Every file under `directory` (relative paths) and its size; files that vanish meanwhile left out."""
    out = {}
    for path in directory.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                out[path.relative_to(directory).as_posix()] = st.st_size
    return out


def _newest_bytes(directory: Path) -> int:
    """The bytes of the largest newest checkpoint a state file under `directory` names (0: none)."""
    sizes = _sizes(directory)
    return max((sum(sizes[f] for f in checkpoint_files(sizes, rel, named[0]))
                for rel, named in _states(directory).items() if named), default=0)  # fmt: skip


def checkpoint_number(prefix: Path | None) -> int | None:
    """N of a checkpoint `<dir>/ckpt-N` (the step, where the program numbers its checkpoints by step)."""
    found = _NUMBER.search(prefix.name) if prefix is not None else None
    return int(found.group(1)) if found else None


class FlashCheckpoints:
    """Where the chief saves its checkpoints, and their copy to storage (see the module).

    Args:
        storage: the checkpoint directory in storage (`--checkpoint-dir`).
        memory_root: the memory file system the memory directory is made in; None: checkpoints go to storage.
        job_name: names the memory directory.
        clock: the time source.
        off_reason: why checkpoints cannot go to memory on this job's backend (None: they can).
        reserve_bytes: what the memory file system keeps free beyond the checkpoints.
        poll_s: seconds between the mirror's passes.
        last_copy_timeout_s: the longest the last copy (at the end, or before a move to storage) may take.
        slow_copy_s: a copy running longer than this is a problem said in an event.
        free: the bytes a file system can take (tests give their own).
    """

    def __init__(
        self,
        storage: Path,
        memory_root: Path | None,
        job_name: str,
        *,
        clock: Clock,
        off_reason: str | None = None,
        reserve_bytes: int = 1024 * _MIB,
        poll_s: float = 1.0,
        last_copy_timeout_s: float = 600.0,
        slow_copy_s: float = 60.0,
        free: Callable[[Path], int] = free_bytes,
    ) -> None:
        self._storage = storage
        self._root = memory_root
        self._clock = clock
        self._off_reason = off_reason or ("no memory file system was given" if memory_root is None else None)
        self._reserve = reserve_bytes
        self._poll_s = poll_s
        self._last_copy_timeout_s = last_copy_timeout_s
        self._slow_copy_s = slow_copy_s
        self._free = free
        self._owner = str(storage.resolve())
        digest = hashlib.sha256(self._owner.encode()).hexdigest()[:12]
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)[:64]
        self._memory = (memory_root or Path("/nonexistent")) / f"dlrover-{safe}-{digest}"
        self._mirror: CheckpointMirror | None = None
        self._lock: IO[str] | None = None
        self._ours = False  # the memory directory is this master's to remove (made or adopted by it)
        self._last_problem = ""

    @property
    def in_memory(self) -> bool:
        """Whether the chief saves to memory now."""
        return self._mirror is not None

    @property
    def live_dir(self) -> Path:
        """Where the chief saves (its `DLROVER_CHECKPOINT_DIR`)."""
        return self._memory if self._mirror is not None else self._storage

    @property
    def memory_dir(self) -> Path:
        """The memory directory this job uses or would use."""
        return self._memory

    def persisted(self, path: Path) -> Path:
        """Where a path of the chief's checkpoints persists: its copy in storage for one in the memory directory."""
        try:
            return self._storage / path.relative_to(self._memory)
        except ValueError:
            return path

    def committed(self) -> tuple[Path | None, float]:
        """(the newest checkpoint in storage, when it was committed there in wall seconds)."""
        if self._mirror is not None:
            status = self._mirror.status
            if status.committed is not None:
                return status.committed, status.committed_wall_time
        try:
            newest = newest_checkpoint(self._storage)
            return newest, (newest.parent / STATE_FILE).stat().st_mtime if newest is not None else 0.0
        except (OSError, CheckpointReadError):
            return None, 0.0

    def _room(self, needed_beyond_reserve: int, what: str) -> tuple[bool, str]:
        free = self._free(self._root) if self._root is not None else 0
        needed = self._reserve + needed_beyond_reserve
        return free >= needed, (f"{self._root} can take {free / _MIB:.0f} MiB, and {what} and the "
                                f"{self._reserve / _MIB:.0f} MiB reserve need {needed / _MIB:.0f}")  # fmt: skip

    def _to_storage(self, why: str) -> list[PsEvent]:
        return [PsEvent("flash_checkpoints", f"checkpoints are saved to storage, {self._storage}: {why}",
                        data={"in_memory": False, "memory_dir": None})]  # fmt: skip

    # ------------------------------------------------------------------ start

    def start(self) -> list[PsEvent]:
        """Choose where the chief saves first: fill (or adopt) the memory directory and start the mirror where
        there is room; anything in the way puts the checkpoints in storage, and the event says why."""
        if self._off_reason is not None:
            return self._to_storage(self._off_reason)
        began = self._clock.now()
        try:
            self._sweep_tombstones()
            adopted = self._adopt()
        except OSError as exc:
            return self._to_storage(f"the memory directory {self._memory} cannot be used: {exc}")
        if adopted is None:
            try:
                carried, refusal = self._fill()
            except OSError as exc:
                self._leave_memory()
                return self._to_storage(f"the memory directory {self._memory} could not be filled: {exc}")
            if refusal:
                self._leave_memory()
                return self._to_storage(refusal)
            how = f"filled from storage ({carried / _MIB:.1f} MiB)"
        else:
            how = f"adopted from this job's previous master ({adopted})"
        self._mirror = self._mirror or self._new_mirror()
        self._mirror.start()
        events = [PsEvent(
            "flash_checkpoints",
            f"checkpoints are saved to memory, {self._memory}, {how} in {self._clock.now() - began:.2f} s, and "
            f"copied to storage, {self._storage}, every {self._poll_s:g} s",
            data={"in_memory": True, "memory_dir": str(self._memory)},
        )]  # fmt: skip
        # An adopted directory without room moves to storage at the chief's first launch, after a last copy.
        return events + self.before_chief_launch()

    def _new_mirror(self) -> CheckpointMirror:
        return CheckpointMirror(self._memory, self._storage, poll_s=self._poll_s, clock=self._clock,
                                ignored=_IGNORED, sentinel=MARKER_FILE, record=RECORD_FILE)  # fmt: skip

    def _sweep_tombstones(self) -> None:
        """Finish removals a killed master left (a directory is renamed before it is removed, so a half-removed
        one is never taken for a memory directory)."""
        for stale in self._memory.parent.glob(f"{self._memory.name}{_TOMBSTONE}*"):
            shutil.rmtree(stale, ignore_errors=True)

    def _take_lock(self) -> None:
        """Lock the marker: two masters of the same job and storage never share a memory directory.

        Raises:
            OSError: another master holds it.
        """
        handle = open(self._memory / MARKER_FILE, encoding="utf-8")  # noqa: SIM115 (held until the job leaves memory)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise BlockingIOError(f"another master of this job uses {self._memory}") from None
        self._lock = handle

    def _private(self) -> None:
        """Raises OSError unless the memory directory is a real directory of this user that no one else can read."""
        st = self._memory.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(f"{self._memory} exists and is not a private directory of this user (mode "
                                  f"{stat.filemode(st.st_mode)}, owner {st.st_uid})")  # fmt: skip

    def _adopt(self) -> str | None:
        """Adopt the memory directory a previous master of this job left (None: there is none to adopt, and any
        by that name is gone); what it persisted, said.

        Raises:
            OSError: a directory by that name exists that is not this job's to use or remove, or another master
                holds it.
        """
        if not self._memory.exists() and not self._memory.is_symlink():
            return None
        st = self._memory.lstat()
        marker = self._memory / MARKER_FILE
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not marker.exists():
            # Only a save's leftovers (a server finishing its share after the directory was removed, TensorFlow
            # making it again with its own mode): this user's, and nothing else is in it.
            if all(in_progress(p.name) for p in self._memory.iterdir()):
                shutil.rmtree(self._memory)
                return None
            raise FileExistsError(f"{self._memory} exists and is not a DLRover memory directory")
        self._private()
        try:
            owner = marker.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise FileExistsError(f"{marker} is not a DLRover marker") from None
        self._take_lock()
        self._ours = True
        try:
            # Storage is as the copies left it (another storage's, or one a later master saved to, is not).
            current = owner == self._owner and read_record(self._memory / RECORD_FILE) == state_digests(self._storage)
        except OSError:
            self._ours = False
            self._release_lock()
            raise
        if not current:
            self._leave_memory()
            return None
        self._mirror = mirror = self._new_mirror()
        done, problem = mirror.sync_within(self._last_copy_timeout_s)
        if done is None:
            return f"what it holds could not be copied to storage yet ({problem}); the mirror tries again"
        return f"{done.copied_bytes / _MIB:.1f} MiB it had not persisted copied to storage"

    def _fill(self) -> tuple[int, str]:
        """Make the memory directory and copy storage into it: (the bytes copied, why memory is not used ("" when
        it is))."""
        storage = _sizes(self._storage)
        newest = _newest_bytes(self._storage)
        total = sum(storage.values())
        fits, room = self._room(total + 2 * newest, f"storage's {total / _MIB:.1f} MiB and two more checkpoints "
                                f"of the newest's {newest / _MIB:.1f} MiB")  # fmt: skip
        if not fits:
            return 0, room
        try:
            self._memory.mkdir(mode=0o700)
        except FileExistsError:
            return 0, f"{self._memory} was made meanwhile by another process, whose it stays"
        self._ours = True
        (self._memory / MARKER_FILE).write_text(self._owner, encoding="utf-8")
        self._take_lock()
        filled = mirror_once(self._storage, self._memory, ignored=_IGNORED)
        if not filled.caught_up:
            why = "; ".join((*filled.behind, *filled.skipped))
            return filled.copied_bytes, f"storage's checkpoints cannot be restored from a copy ({why})"
        write_record(self._memory / RECORD_FILE, state_digests(self._storage))
        return filled.copied_bytes, ""

    # ------------------------------------------------------------------ while the job runs

    def before_chief_launch(self) -> list[PsEvent]:
        """Called before a chief is launched (it is not running): move the checkpoints to storage for good when
        memory has no room for the next ones and a last copy leaves storage holding what memory holds."""
        if self._mirror is None:
            return []
        if not (self._memory / MARKER_FILE).exists():
            return self._emptied("flash_to_storage", "checkpoints are saved to storage from now on")
        status = self._mirror.status
        newest = max(status.newest_bytes, _newest_bytes(self._memory))
        try:
            fits, room = self._room(2 * newest, f"two more checkpoints of the newest's {newest / _MIB:.1f} MiB")
        except OSError as exc:
            fits, room = False, f"its room cannot be measured: {exc}"
        if fits:
            return []
        done, problem = self._last_copy()
        if done is None:
            return [PsEvent("checkpoint_mirror_failed", f"memory has no room ({room}), but the chief saves there "
                            f"still: {problem}", data={"in_memory": True})]  # fmt: skip
        self._leave_memory()
        return [PsEvent("flash_to_storage", f"checkpoints are saved to storage, {self._storage}, from now on: {room}",
                        data={"in_memory": False})]  # fmt: skip

    def _emptied(self, kind: str, then: str) -> list[PsEvent]:
        """Memory lost its marker: someone else emptied it (or the program removed it); storage holds what the
        copies gave it, and memory is left."""
        committed, _when = self.committed()
        self._leave_memory()
        return [PsEvent(kind, f"the memory directory {self._memory} was emptied by someone else; {then}, where the "
                        f"newest checkpoint is {committed.name if committed is not None else 'none'}",
                        data={"in_memory": False})]  # fmt: skip

    def _last_copy(self, *, final: bool = False) -> tuple[MirrorPass | None, str]:
        """A last pass of the mirror, its background passes stopped: (the pass, "") when it left storage holding
        what memory holds, else (None, why). The background passes go on after a failure, unless `final` (the
        job has ended)."""
        assert self._mirror is not None
        timeout_s = self._last_copy_timeout_s
        deadline = self._clock.now() + timeout_s
        if self._mirror.close(timeout_s):
            done, problem = self._mirror.sync_within(max(deadline - self._clock.now(), 0.0), final=final)
        else:  # a background pass holds the copy (storage hangs): a last pass would only queue behind it
            done, problem = None, f"a copy under way did not finish within {timeout_s:g} s"
        if done is not None and not done.caught_up:
            problem = "not every state file could be copied: " + "; ".join((*done.behind, *done.skipped))
            done = None
        if done is None and not final:
            self._mirror.start()  # memory stays in use: its copies go on
        return done, problem

    def look(self) -> list[PsEvent]:
        """An event when the copies start failing or a copy runs slow (once per problem), and when they work
        again."""
        if self._mirror is None:
            return []
        status = self._mirror.status
        problem = status.problem
        running = None if status.running_since is None else self._clock.now() - status.running_since
        if not problem and running is not None and running > self._slow_copy_s:
            problem = f"a copy has been running for over {self._slow_copy_s:g} s (storage slow or hung)"
        if problem == self._last_problem:
            return []
        previous, self._last_problem = self._last_problem, problem
        if problem:
            return [PsEvent("checkpoint_mirror_failed", f"checkpoints in memory are not being copied to storage, "
                            f"{self._storage}: {problem}; a lost host would lose those since the last "
                            "copied")]  # fmt: skip
        return [PsEvent("checkpoint_mirror_recovered", f"checkpoints are copied to storage again (after: {previous})")]

    # ------------------------------------------------------------------ the end

    def close(self) -> list[PsEvent]:
        """The job has ended and its tasks have stopped: copy the last checkpoints to storage and remove the memory
        directory, kept (and said) when the copy fails, for it holds the only copy. Idempotent."""
        if self._mirror is None:
            return []
        if not (self._memory / MARKER_FILE).exists():
            return self._emptied("checkpoint_mirror_failed", "the job ended with storage")
        done, problem = self._last_copy(final=True)
        if done is None:
            assert self._mirror is not None
            self._mirror.close()
            self._mirror = None
            self._ours = False
            self._release_lock()
            return [PsEvent("checkpoint_mirror_failed", f"the last checkpoints could not be copied to storage "
                            f"({problem}): they are kept in {self._memory}, which the job's next master "
                            "adopts", data={"kept": str(self._memory)})]  # fmt: skip
        committed = self._mirror.status.committed
        self._leave_memory()
        return [PsEvent("flash_removed", f"the memory directory is removed; storage holds "
                        f"{committed.name if committed is not None else 'no checkpoint'}",
                        data={"committed": str(committed) if committed is not None else None})]  # fmt: skip

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _leave_memory(self) -> None:
        """Stop the mirror and remove the memory directory: renamed first, so a removal cut short is never taken
        for a memory directory (the next start removes the rest)."""
        if self._mirror is not None:
            # Bounded: a pass that hangs on storage must not hold the master; it fails once its source goes.
            self._mirror.close(self._last_copy_timeout_s)
            self._mirror = None
        if not self._ours:
            self._release_lock()
            return
        self._ours = False
        tombstone = self._memory.with_name(f"{self._memory.name}{_TOMBSTONE}{os.getpid()}")
        try:
            os.rename(self._memory, tombstone)
        except FileNotFoundError:
            tombstone = self._memory
        finally:
            self._release_lock()
        shutil.rmtree(tombstone, ignore_errors=True)
