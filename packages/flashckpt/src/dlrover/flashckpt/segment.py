"""Shared-memory segments: plain files in ``/dev/shm`` mapped with ``mmap``.

Why not `multiprocessing.shared_memory`: its resource tracker unlinks a segment when the process
that created it exits, which is exactly when a checkpoint in memory is needed most. Plain files
have no tracker; ownership is explicit instead:

* **Owner.** Each (job, run) has one owner recorded in ``<dir>/dlrover-fc.<job>.<run>.owner``
  (JSON: pid and process start time). The owner is the node's saver when one runs (it outlives
  training processes), else the stager that created the segments. Only the owner removes a run's
  segments, when the job ends (`remove_run`).
* **Attachers** (stagers, loaders, the saver) map existing segments and never unlink them.
* **Stale runs.** `cleanup_stale` removes every run whose owner process is gone (or which has no
  owner file), except a run the caller names to keep: a restarted training process adopts its own
  run's segments to load from them.

Segments are named ``dlrover-fc.<job>.<run>.r<rank>.s<slot>``. Concurrency between processes uses
``flock``: a writer holds an exclusive lock on a slot while writing and sealing it, a reader holds a
shared one while reading; the kernel drops locks of a process that dies, so a crash never leaves a
slot locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import mmap
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# process_start_ticks moved to dlrover.common.process; it stays importable from here (in __all__).
from dlrover.common import ConfigError
from dlrover.common.process import ProcessIdentity, process_start_ticks
from dlrover.flashckpt.errors import FlashCkptError
from dlrover.flashckpt.pinning import CudaErrorPending, HostPinner, PinError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_SHM_DIR",
    "SEGMENT_PREFIX",
    "SHM_DIR_ENV_VAR",
    "ShmSegment",
    "cleanup_stale",
    "default_shm_dir",
    "list_run_files",
    "owner_alive",
    "owner_record_alive",
    "owner_path",
    "process_start_ticks",
    "remove_run",
    "run_ranks",
    "segment_path",
    "validate_id",
    "write_owner",
]

DEFAULT_SHM_DIR = "/dev/shm"  # noqa: S108 (the POSIX shared-memory mount, not a temp file)
SHM_DIR_ENV_VAR = "DLROVER_FLASHCKPT_SHM_DIR"
"""Where a process's snapshots go by default: ``dlrover-run --checkpoint-shm-dir`` sets it for its
workers (the directory its saver host serves), else `DEFAULT_SHM_DIR`."""
SEGMENT_PREFIX = "dlrover-fc."
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SLOT_NAME_RE = re.compile(r"r(\d+)\.s\d+")
_log = logging.getLogger(__name__)


def default_shm_dir() -> str:
    """`SHM_DIR_ENV_VAR` if set and not empty, else `DEFAULT_SHM_DIR`."""
    return os.environ.get(SHM_DIR_ENV_VAR) or DEFAULT_SHM_DIR


def validate_id(kind: str, value: str) -> str:
    """Check a job or run id is safe in a file name.

    Raises:
        FlashCkptError: the id is empty, too long, or has characters other than letters, digits,
            ``_`` and ``-``.
    """
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise FlashCkptError(f"{kind} id {value!r} must be 1-64 characters of [A-Za-z0-9_-]")
    return value


def segment_path(shm_dir: str | Path, job: str, run: str, rank: int, slot: int) -> Path:
    """The file of one rank's slot."""
    return Path(shm_dir) / f"{SEGMENT_PREFIX}{job}.{run}.r{rank}.s{slot}"


def owner_path(shm_dir: str | Path, job: str, run: str) -> Path:
    """The owner record of a run."""
    return Path(shm_dir) / f"{SEGMENT_PREFIX}{job}.{run}.owner"


def write_owner(
    shm_dir: str | Path, job: str, run: str, pid: int | None = None, extra: dict[str, Any] | None = None
) -> Path:
    """Record `pid` (default: this process) as the owner of a run's segments; returns the file.

    `extra` adds fields (a saver host records what it is and its pid scope, see
    `dlrover.flashckpt.host.remove_dead_hosts`).
    """
    pid = os.getpid() if pid is None else pid
    path = owner_path(shm_dir, job, run)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    record = {**(extra or {}), "pid": pid, "start_ticks": process_start_ticks(pid), "job": job, "run": run}
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path


def owner_alive(path: Path) -> bool:
    """Whether the process named in an owner file still runs (same pid and start time, no zombie)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return owner_record_alive(doc)


def owner_record_alive(doc: Any) -> bool:
    """`owner_alive` of an owner file's parsed contents (False when malformed)."""
    try:
        # No start time recorded (None) means the process was already gone when it was written.
        owner = ProcessIdentity(doc["pid"], doc.get("start_ticks"))
    except (KeyError, TypeError, AttributeError, ValueError, ConfigError):
        return False
    return owner.alive()


def list_run_files(shm_dir: str | Path, job: str, run: str) -> list[Path]:
    """Every file of a run (segments and owner record)."""
    prefix = f"{SEGMENT_PREFIX}{job}.{run}."
    return sorted(p for p in Path(shm_dir).glob(f"{SEGMENT_PREFIX}*") if p.name.startswith(prefix))


def run_ranks(shm_dir: str | Path, job: str, run: str) -> list[int]:
    """The ranks that have a slot file of the run in `shm_dir`, ascending."""
    prefix = f"{SEGMENT_PREFIX}{job}.{run}."
    ranks = set()
    for path in list_run_files(shm_dir, job, run):
        match = _SLOT_NAME_RE.fullmatch(path.name[len(prefix) :])
        if match is not None:
            ranks.add(int(match.group(1)))
    return sorted(ranks)


def remove_run(shm_dir: str | Path, job: str, run: str) -> list[Path]:
    """Unlink every file of a run; returns what was removed. Called by the owner at job end."""
    removed = []
    for path in list_run_files(shm_dir, job, run):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def cleanup_stale(shm_dir: str | Path, keep: tuple[str, str] | None = None) -> list[Path]:
    """Remove segments of runs whose owner is gone.

    Args:
        shm_dir: where segments live.
        keep: a (job, run) never removed, even without a live owner: the caller's own run.

    Returns:
        The files removed.
    """
    runs: set[tuple[str, str]] = set()
    for path in Path(shm_dir).glob(f"{SEGMENT_PREFIX}*"):
        parts = path.name[len(SEGMENT_PREFIX) :].split(".")
        if len(parts) >= 3:
            runs.add((parts[0], parts[1]))
    removed: list[Path] = []
    for job, run in sorted(runs):
        if (job, run) == keep or owner_alive(owner_path(shm_dir, job, run)):
            continue
        removed += remove_run(shm_dir, job, run)
    return removed


class ShmSegment:
    """One mapped shared-memory file.

    `u8` is a torch uint8 view of the whole mapping; every other view is derived from it and must
    be dropped before `resize` or `close`. It is made on first use, so a process that only moves
    bytes (the saver) never imports torch.

    A mapping pinned with `pin` is unpinned before it is unmapped (`resize`, `close`); after a
    `resize` it is pageable until pinned again.
    """

    def __init__(self, path: Path, fd: int, mm: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self._mm: mmap.mmap | None = mm
        self._u8: torch.Tensor | None = None
        self._pin: tuple[HostPinner, int] | None = None

    @property
    def u8(self) -> torch.Tensor:
        """A uint8 tensor over the whole mapping (no copy)."""
        if self._u8 is None:
            import torch

            self._u8 = torch.frombuffer(self.mm, dtype=torch.uint8)
        return self._u8

    @property
    def size(self) -> int:
        """Bytes mapped."""
        return len(self._mm) if self._mm is not None else 0

    @property
    def mm(self) -> mmap.mmap:
        """The mapping.

        Raises:
            FlashCkptError: the segment is closed.
        """
        if self._mm is None:
            raise FlashCkptError(f"segment {self.path} is closed")
        return self._mm

    @property
    def pinned(self) -> bool:
        """Whether the current mapping is page-locked for device copies."""
        return self._pin is not None

    def pin(self, pinner: HostPinner) -> None:
        """Page-lock the whole mapping with `pinner` (nothing to do when it already is).

        Raises:
            PinError: the pinner refused; the mapping stays pageable and usable.
            FlashCkptError: the segment is closed.
        """
        if self._pin is not None:
            return
        address = self.u8.data_ptr()
        pinner.pin(address, self.size)
        self._pin = (pinner, address)

    def _unpin(self) -> CudaErrorPending | None:
        """Release the pin; a runtime error that stays pending is returned for the caller to raise."""
        if self._pin is None:
            return None
        pinner, address = self._pin
        self._pin = None
        try:
            pinner.unpin(address)
        except PinError as e:
            # The range is unmapped next either way; a runtime that lost track of it has nothing
            # left to release.
            _log.warning("unpinning %s before unmapping it: %s", self.path, e)
        except CudaErrorPending as e:
            _log.error("unpinning %s before unmapping it: %s", self.path, e)
            return e
        return None

    @classmethod
    def create(cls, path: Path, size: int) -> ShmSegment:
        """Create (or reuse) the file at `path`, allocate `size` bytes and map them pre-faulted.

        `posix_fallocate` makes the kernel allocate every page now, and ``MAP_POPULATE`` fills the
        page tables, so the first copy into the segment runs as fast as later ones.

        Raises:
            FlashCkptError: the memory cannot be allocated (the message names the file and size).
        """
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            return cls(path, fd, _map(fd, path, size, grow=True))
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def create_unless_stopped(
        cls, path: Path, size: int, should_stop: Callable[[], bool], chunk_bytes: int = 64 << 20
    ) -> ShmSegment | None:
        """Create a new segment at `path` as `create` does, allocating it `chunk_bytes` at a time and
        giving up between two chunks once `should_stop` says so.

        For a background thread: allocating gigabytes takes seconds (the kernel zeroes every
        page), and whoever stops the thread should not wait for all of them. The file grows chunk
        by chunk, each chunk allocated before the size covers it (never a page a writer could
        fault on and find unbacked), and reads as never written (all zeros) throughout.

        Returns:
            The mapped segment; None when stopped, the partial file then removed.

        Raises:
            FlashCkptError: the file exists already, or the memory cannot be allocated (the
                partial file is removed).
        """
        if size <= 0:
            raise FlashCkptError(f"shared-memory segment {path} cannot have size {size}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise FlashCkptError(f"segment {path} exists already") from None
        try:
            for offset in range(0, size, chunk_bytes):
                if should_stop():
                    break
                try:
                    os.posix_fallocate(fd, offset, min(chunk_bytes, size - offset))
                except OSError as e:
                    raise FlashCkptError(f"cannot allocate {size} bytes of shared memory for {path}: {e}") from e
            else:
                return cls(path, fd, mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE))
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        path.unlink(missing_ok=True)
        return None

    @classmethod
    def attach(cls, path: Path) -> ShmSegment:
        """Map an existing segment (read and write, pre-faulted).

        Raises:
            FileNotFoundError: no such segment.
        """
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            return cls(path, fd, _map(fd, path, size, grow=False))
        except BaseException:
            os.close(fd)
            raise

    def resize(self, size: int) -> None:
        """Grow or shrink the segment to `size` bytes and map it again (pre-faulted).

        Views derived from `u8` become invalid: callers must drop them first.

        Raises:
            CudaErrorPending: unpinning the old mapping left a CUDA error the next kernel would
                raise as its own (the segment is mapped again first).
        """
        pending = self._unmap()
        self._mm = _map(self._fd, self.path, size, grow=True)
        if pending is not None:
            raise pending

    def try_lock(self, exclusive: bool) -> bool:
        """Take the slot's flock without waiting; False if another holder conflicts."""
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self) -> None:
        """Release this descriptor's flock."""
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _unmap(self) -> CudaErrorPending | None:
        pending = self._unpin()
        self._u8 = None
        if self._mm is not None:
            # A view may still exist (e.g. held by a traceback): the mapping then goes when it does.
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None
        return pending

    def close(self) -> None:
        """Unmap and close (the file stays; only the owner unlinks). An unpin error is logged:
        closing goes on, so every segment of a stager is released."""
        self._unmap()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _map(fd: int, path: Path, size: int, grow: bool) -> mmap.mmap:
    if size <= 0:
        # A zero-length file is a segment whose creator died before sizing it: nothing to read.
        raise FlashCkptError(f"shared-memory segment {path} has size {size}")
    if grow:
        before = os.fstat(fd).st_size
        try:
            if size > before:
                # fallocate sets the size only once every page is allocated: a full /dev/shm
                # leaves the file as it was, never a sized file of unbacked pages (which would
                # kill the next writer with SIGBUS).
                os.posix_fallocate(fd, 0, size)
            elif size < before:
                os.ftruncate(fd, size)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, before)
            raise FlashCkptError(f"cannot allocate {size} bytes of shared memory for {path}: {e}") from e
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
