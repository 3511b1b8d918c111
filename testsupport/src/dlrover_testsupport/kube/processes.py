"""Container processes of the test kubelet: started in their own session, waited for, signalled.

A container's main process is the leader of its own process group (session). When it ends, what
is left of the group is SIGKILLed before the pid is reaped (so the group id cannot have been reused
by then), as a runtime ends a container with its init process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["descendants", "reap", "signal_group", "start"]


def start(argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session, stdout and stderr appended to `log_path`.

    Raises:
        OSError: it cannot be started.
    """
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def reap(popen: subprocess.Popen[bytes]) -> int:
    """Wait for the main process to end, SIGKILL what is left of its group, then reap it; returns
    its return code (negative: the signal that ended it)."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    return popen.wait()


def signal_group(popen: subprocess.Popen[bytes], sig: int, *, strays: bool) -> None:
    """Send `sig` to the main process's group while it is unreaped; with `strays`, also to its
    descendants that left the group (for containers no cgroup tracks)."""
    if popen.returncode is not None:
        return
    others = descendants(popen.pid) if strays else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)
    for pid in others:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def descendants(root: int) -> list[int]:
    """The live descendants of `root` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found
