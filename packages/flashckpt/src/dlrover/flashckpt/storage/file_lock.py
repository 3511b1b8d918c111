"""An exclusive ``flock`` on a file, waited for up to a bound.

The kernel drops a ``flock`` when the last descriptor of its open file goes, so a holder that dies
never leaves the lock taken. Each call opens the file anew: two holders in one process exclude
each other as two processes do.

A process that forks while it holds the lock would hand the child a descriptor of the same open
file, and with it the lock, for as long as the child lives (a data loader's worker forked by the
training loop while a background persist commits, say). Children therefore close the descriptors
of the locks held at the fork (`os.register_at_fork`); the parent's lock is unaffected.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from dlrover.common import Clock
from dlrover.flashckpt.errors import StorageError

__all__ = ["exclusive_flock"]

# Polling starts fine-grained (a commit holds the lock for milliseconds) and backs off.
_FIRST_WAIT_S = 0.001
_LONGEST_WAIT_S = 0.05

# flock itself is unavailable for this file (a filesystem mounted without lock support).
_NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})

# Descriptors of the locks this process holds: a forked child closes them (see the module doc).
# Process-wide by nature: a fork copies every descriptor of the process, whoever opened it.
_held_fds: set[int] = set()


def _close_held_in_child() -> None:
    for fd in list(_held_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_fds.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


@contextlib.contextmanager
def exclusive_flock(path: Path, timeout_s: float, clock: Clock) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on `path` (created if missing) while the block runs.

    Args:
        path: the lock file.
        timeout_s: how long to wait for another holder.
        clock: time source for the wait.

    Yields:
        True while the lock is held; False when the file's filesystem supports no ``flock``
        (``ENOLCK``, ``EOPNOTSUPP``, ``ENOSYS``, ``EINVAL``): the block then runs unlocked and the
        caller decides what that means.

    Raises:
        StorageError: the file cannot be opened or locked, or another holder kept the lock for
            `timeout_s`.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StorageError(f"cannot open the lock file {path}: {e}") from e
    try:
        deadline = clock.now() + timeout_s
        wait = _FIRST_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - clock.now()
                if left <= 0:
                    raise StorageError(f"{path} stayed locked by another writer for {timeout_s:g} s") from None
                clock.sleep(min(wait, left))
                wait = min(wait * 2, _LONGEST_WAIT_S)
            except OSError as e:
                if e.errno in _NO_FLOCK:
                    yield False
                    return
                raise StorageError(f"cannot lock {path}: {e}") from e
        _held_fds.add(fd)
        try:
            yield True
        finally:
            _held_fds.discard(fd)
    finally:
        os.close(fd)  # drops the lock
