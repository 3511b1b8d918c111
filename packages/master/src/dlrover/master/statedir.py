"""The state directory: private to its owner, and used by one master at a time.

A master keeps everything it resumes from in its state directory: the journal (`master.db` and
SQLite's `-wal`, `-shm` and `-journal` side files), the event log (`events.jsonl`), the job token
(`token`), the node secret (`node-secret`) and the local agents' logs (`logs/`). Two masters on
one directory would interleave two jobs in one journal, so `StateDirLock.acquire` takes an
exclusive lock on `<state_dir>/master.lock` before anything else in the directory is read or
written, and the master holds it until it stops.

The lock is `flock(2)`: the kernel releases it when the holder exits, however it exits (a SIGKILL
included), so a stale lock file never blocks a restarted master, and no pid liveness check is
needed. The holder writes its pid, host, job and start time into the file; a second master reads
them only to say who holds the directory. The file is never deleted: a master that unlinked it on
exit could let two later masters lock two different files of the same name.

On NFS, Linux emulates `flock` with NFS byte-range locks: the lock holds across hosts only when the
mount supports locking (not with `nolock`, where each host sees only its own locks), and the lock
of a host that crashed is released only when the server's lease expires (about 90 s on NFSv4), so
a master restarted elsewhere within that time is refused. SQLite itself is not safe on every NFS
setup either; prefer a local disk for the state directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import BinaryIO

import attrs

from dlrover.common import Clock, ConfigError

__all__ = [
    "LOCK_FILE_NAME",
    "LockHolder",
    "StateDirError",
    "StateDirInUseError",
    "StateDirLock",
    "prepare_state_dir",
]

LOCK_FILE_NAME = "master.lock"
_PRIVATE_FILE_MODE = 0o600
_PRIVATE_DIR_MODE = 0o700
_MAX_HOLDER_BYTES = 4096
# A lock file replaced between our open and our lock is opened again; more than a few
# replacements in a row means something keeps replacing it.
_MAX_OPEN_ATTEMPTS = 5


class StateDirError(ConfigError):
    """The state directory cannot be used (not a directory, another owner, open to others)."""


class StateDirInUseError(StateDirError):
    """Another master holds the state directory's lock.

    Attributes:
        holder: who holds it, as the holder wrote it (None when it has not written it yet or the
            file could not be read).
    """

    def __init__(self, message: str, holder: LockHolder | None) -> None:
        super().__init__(message)
        self.holder = holder


@attrs.frozen
class LockHolder:
    """The master holding a state directory, as written into its lock file.

    Attributes:
        pid: its process id.
        host: the host it runs on.
        job_name: its job.
        started_wall_time: when it took the lock, seconds since the epoch.
    """

    pid: int
    host: str
    job_name: str
    started_wall_time: float

    def describe(self) -> str:
        """`pid 123 on host h (job 'j', holding it since 2026-01-01 12:00:00 UTC)`."""
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_wall_time))
        return f"pid {self.pid} on host {self.host} (job {self.job_name!r}, holding it since {started})"

    def to_json(self) -> str:
        """The lock file's text."""
        fields = {"pid": self.pid, "host": self.host, "job_name": self.job_name}
        return json.dumps({**fields, "started_wall_time": self.started_wall_time}, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LockHolder:
        """Parse a lock file's text.

        Raises:
            ValueError: the text is not what `to_json` writes.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object: {text[:200]!r}")
        try:
            return cls(
                pid=int(data["pid"]),
                host=str(data["host"]),
                job_name=str(data["job_name"]),
                started_wall_time=float(data["started_wall_time"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"missing or bad field in {text[:200]!r}: {exc}") from exc


def prepare_state_dir(state_dir: str | os.PathLike[str]) -> Path:
    """Create the state directory with mode 0700, or check that an existing one is private.

    An existing directory must belong to the current user and give group and others no access:
    it holds the job token and the node secret. One that does is refused rather than tightened,
    since it may be a directory others rely on (a home directory, a shared scratch space); the
    message says how to fix it.

    Returns:
        The directory.

    Raises:
        StateDirError: the path is not a directory, belongs to another user, or is open to group
            or others; or it cannot be created.
    """
    path = Path(state_dir)
    try:
        with contextlib.suppress(FileExistsError):  # something else by that name: refused below
            path.mkdir(mode=_PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise StateDirError(f"cannot create the state directory {str(path)!r}: {exc.strerror}") from exc
    if stat.S_ISLNK(info.st_mode):
        # Resolve once, then hold the target to the same rules as a directory named directly.
        try:
            info = path.stat()
        except OSError as exc:
            raise StateDirError(f"the state directory {str(path)!r} is a broken link: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirError(f"the state directory {str(path)!r} is not a directory")
    if info.st_uid != os.getuid():
        raise StateDirError(
            f"the state directory {str(path)!r} belongs to uid {info.st_uid}, not to this user ({os.getuid()})"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise StateDirError(
            f"the state directory {str(path)!r} has mode {mode:04o}; it holds the job token and the node secret, "
            f"so group and others must have no access: chmod 700 {str(path)!r} (or name a new directory, which "
            "the master creates with mode 0700)"
        )
    return path


def _read_holder(fd: int) -> tuple[LockHolder | None, str]:
    """Who holds the lock, and how to say it; reads through `fd`, never changes the file."""
    try:
        raw = os.pread(fd, _MAX_HOLDER_BYTES, 0)
    except OSError as exc:
        return None, f"another master (its lock file cannot be read: {exc.strerror})"
    if not raw.strip():
        return None, "another master (it has not written who it is yet)"
    try:
        holder = LockHolder.from_json(raw.decode("utf-8", "replace"))
    except ValueError:
        return None, f"another master (its lock file holds {raw[:200]!r})"
    return holder, holder.describe()


class StateDirLock:
    """The exclusive lock of one state directory, held by one master for its whole life.

    Build it with `acquire`; `release()` (or leaving a `with` block) lets it go. A process that
    dies releases it as well.
    """

    def __init__(self, path: Path, fd: int, holder: LockHolder) -> None:
        self._path = path
        # A file object, not a bare descriptor: a lock whose owner is dropped without `release()`
        # is released when it is collected instead of holding the directory until the process exits.
        self._file: BinaryIO | None = os.fdopen(fd, "r+b", buffering=0)
        self._holder = holder

    @classmethod
    def acquire(
        cls,
        state_dir: str | os.PathLike[str],
        *,
        job_name: str,
        clock: Clock,
        host: str | None = None,
        pid: int | None = None,
    ) -> StateDirLock:
        """Prepare the directory (see `prepare_state_dir`) and lock it, without waiting.

        Nothing else in the directory is read or written, whether the lock is taken or not.

        Args:
            state_dir: the state directory.
            job_name: written into the lock file, for a refused master's message.
            clock: gives the start time written into the lock file.
            host: this host's name (default: `socket.gethostname()`).
            pid: this process' id (default: `os.getpid()`).

        Returns:
            The held lock.

        Raises:
            StateDirInUseError: another master holds it; the message names the holder.
            StateDirError: the directory is unusable, or the lock file cannot be opened or locked.
        """
        directory = prepare_state_dir(state_dir)
        path = directory / LOCK_FILE_NAME
        fd = cls._open_locked(path)
        holder = LockHolder(
            pid=os.getpid() if pid is None else pid,
            host=socket.gethostname() if host is None else host,
            job_name=job_name,
            started_wall_time=clock.wall_time(),
        )
        try:
            os.fchmod(fd, _PRIVATE_FILE_MODE)
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.to_json().encode("utf-8"), 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise StateDirError(f"cannot write the lock file {str(path)!r}: {exc.strerror}") from exc
        return cls(path, fd, holder)

    @staticmethod
    def _open_locked(path: Path) -> int:
        for _ in range(_MAX_OPEN_ATTEMPTS):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _PRIVATE_FILE_MODE)
            except OSError as exc:
                raise StateDirError(f"cannot open the lock file {str(path)!r}: {exc.strerror}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    holder, who = _read_holder(fd)
                    os.close(fd)
                    raise StateDirInUseError(
                        f"the state directory {str(path.parent)!r} is in use by {who}; one master per state "
                        f"directory: stop that master first, or use another --state-dir (lock file {str(path)!r})",
                        holder,
                    ) from None
                os.close(fd)
                raise StateDirError(
                    f"cannot lock {str(path)!r}: {exc.strerror} (on NFS the mount must support locks)"
                ) from exc
            try:
                held, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
                same = (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                return fd
            # Replaced or removed between open and lock: the lock we hold guards nothing.
            os.close(fd)
        raise StateDirError(f"the lock file {str(path)!r} keeps being replaced; is something deleting it?")

    @property
    def path(self) -> Path:
        """The lock file."""
        return self._path

    @property
    def holder(self) -> LockHolder:
        """What this master wrote into the lock file."""
        return self._holder

    @property
    def held(self) -> bool:
        """Whether the lock is still held."""
        return self._file is not None

    def release(self) -> None:
        """Let the lock go; safe to call twice. The file stays (see the module's docstring)."""
        file, self._file = self._file, None
        if file is not None:
            # Emptied first, so a master that locks it next is not described by our stale lines
            # in the instant before it writes its own (on a read-only disk they stay, naming a
            # holder that has left).
            with contextlib.suppress(OSError):
                os.ftruncate(file.fileno(), 0)
            file.close()

    def __enter__(self) -> StateDirLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
