"""Private temp dirs that name their owner, so that a later process removes them once it is gone.

`tempfile.TemporaryDirectory` removes its dir when the block ends, which a process killed with
SIGKILL (a test killing an agent, the OOM killer, a node failure) never reaches: the dir, often
holding a secret such as the job token, stays in /tmp for good. `owned_temp_dir` names the dir
after its owner instead::

    <tempdir>/<prefix><pid>-<start ticks>-<pid scope>-<random>

and `remove_dead_owners`, run by the next process that uses the same prefix, removes every such
dir whose owner no longer runs. It is careful, as it deletes in a shared directory: only real
directories (never a symlink, never followed), only of the current user, only of an owner in
this pid scope (this boot of this host, this pid namespace: `dlrover.common.process.pid_scope`)
that is known to be gone (pid and start time, see
`dlrover.common.process.ProcessIdentity`); a name in any other shape is left alone. Two processes
sweeping at once is fine: what the other one removed first is skipped.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dlrover.common.process import ProcessIdentity, pid_scope

__all__ = ["owned_temp_dir", "remove_dead_owners"]

_log = logging.getLogger(__name__)
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ValueError(f"temp dir prefix {prefix!r} must be 1-64 characters of [A-Za-z0-9._-]")
    return prefix


def _owner_pattern(prefix: str) -> re.Pattern[str]:
    # mkdtemp's random part never holds '-', and the digits groups cannot either, so the parse is
    # unambiguous even for a prefix that ends in digits.
    return re.compile(re.escape(prefix) + r"([0-9]{1,10})-([0-9]{1,20})-([0-9]{1,20})-[^/]+")


@contextmanager
def owned_temp_dir(prefix: str, dir: str | Path | None = None) -> Iterator[Path]:
    """A new private (0700) directory named after this process, removed when the block ends.

    Where this process's identity cannot be read (no ``/proc``) the name carries none: the dir is
    then removed on exit as usual but never by `remove_dead_owners`.

    Args:
        prefix: the start of the dir's name, e.g. ``"dlrover-token-"``; 1-64 characters of
            ``[A-Za-z0-9._-]``.
        dir: where to create it; the system temp dir (``$TMPDIR``, else /tmp) by default.

    Yields:
        The directory's path.

    Raises:
        ValueError: the prefix is empty, too long or has other characters.
        OSError: the directory cannot be created.
    """
    _check_prefix(prefix)
    me, scope = ProcessIdentity.current(), pid_scope()
    named = prefix if me is None or scope is None else f"{prefix}{me.pid}-{me.start_ticks}-{scope}-"
    path = Path(tempfile.mkdtemp(prefix=named, dir=dir))  # mkdtemp creates it 0700
    try:
        yield path
    finally:
        # Not raised: a dir that cannot be removed must not replace the block's own outcome (the
        # warning says which), and the next sweep tries again once this process is gone.
        _remove_tree(path)


def remove_dead_owners(prefix: str, dir: str | Path | None = None) -> list[Path]:
    """Remove the dirs `owned_temp_dir` made with `prefix` whose owner process is gone.

    A dir is removed only if its name parses (prefix, pid, start ticks, pid scope), the owner is
    in this process's pid scope (same host boot, same pid namespace) and no longer runs, and it is
    a real directory (not a symlink, which is never followed) owned by the current user. Errors
    removing one dir are logged and the sweep goes on; a dir another process removes at the same time is skipped.

    Args:
        prefix: the prefix given to `owned_temp_dir`.
        dir: where to look; the system temp dir by default.

    Returns:
        The dirs this call removed (each also logged at INFO).

    Raises:
        ValueError: the prefix is empty, too long or has other characters.
    """
    pattern = _owner_pattern(_check_prefix(prefix))
    scope = pid_scope()
    if scope is None:
        return []  # owners cannot be judged: keep everything
    root = Path(tempfile.gettempdir() if dir is None else dir)
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        _log.warning("cannot list %s to remove stale %s* dirs: %s", root, prefix, exc)
        return []
    removed = []
    uid = os.getuid()
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None:
            continue
        pid, ticks, owner_scope = (int(g) for g in match.groups())
        if owner_scope != scope or pid == 0:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # gone meanwhile (removed by another sweep), or unreadable: not ours to judge
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        if ProcessIdentity(pid, ticks).alive():
            continue
        path = Path(entry.path)
        if _remove_tree(path):
            _log.info("removed %s: its owner (pid %d) is gone", path, pid)
            removed.append(path)
    return removed


def _remove_tree(path: Path) -> bool:
    """Remove a directory tree without following symlinks; True if this call removed it.

    Entries that vanish meanwhile are fine (another process is removing the same tree); any other
    error is logged as a warning and leaves the rest of the tree in place.
    """
    problems: list[BaseException] = []
    gone_before = False

    def on_exc(_func: object, failed: str, exc: BaseException) -> None:
        nonlocal gone_before
        if isinstance(exc, FileNotFoundError):
            gone_before = gone_before or os.fspath(failed) == os.fspath(path)
        else:
            problems.append(exc)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=on_exc)
    else:
        shutil.rmtree(path, onerror=lambda func, failed, info: on_exc(func, failed, info[1]))
    if problems:
        _log.warning("could not remove %s: %s", path, problems[0])
        return False
    return not gone_before
