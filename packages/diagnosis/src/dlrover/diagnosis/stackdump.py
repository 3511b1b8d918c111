"""Stack dumps of hung processes: py-spy when it is installed, faulthandler otherwise.

The faulthandler contract, which the training process opts into:

1. At start-up the target calls `install_stack_dump_handler(path)`. That opens `path` for
   appending (creating it) and registers ``faulthandler`` for `DEFAULT_DUMP_SIGNAL` (SIGUSR1), so
   the signal makes Python write every thread's stack to the file from inside the signal handler,
   even while the main thread is blocked in a collective.
2. The diagnoser calls `request_stack_dump(pid, dump_path=path)`. It refuses to signal when the file
   does not exist (an unregistered process would be *killed* by SIGUSR1's default action), sends
   the signal, waits (bounded) for the file to grow and settle, and returns only the new bytes.

A process stopped with SIGSTOP, or one stuck in native code with signals blocked, cannot run the
handler; the result then says so (``ok=False``). py-spy reads the stacks from outside through
ptrace and needs no cooperation, so it is tried first when it is on PATH.
"""

from __future__ import annotations

import faulthandler
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import IO

import attrs

from dlrover.common import Clock, ConfigError, SystemClock

__all__ = [
    "DEFAULT_DUMP_SIGNAL",
    "StackDump",
    "StackDumpHandler",
    "install_stack_dump_handler",
    "main_thread_frames",
    "request_stack_dump",
]

DEFAULT_DUMP_SIGNAL = signal.SIGUSR1
"""The signal a target registers for faulthandler dumps."""

MAX_DUMP_BYTES = 1024 * 1024
_POLL_S = 0.05


@attrs.frozen
class StackDump:
    """The outcome of one stack-dump request.

    Attributes:
        pid: the target process.
        method: ``"py-spy"``, ``"faulthandler"`` or ``"none"``.
        ok: True when `text` holds a dump.
        text: the dump (at most 1 MiB).
        reason: what happened, including why there is no dump.
    """

    pid: int
    method: str
    ok: bool
    text: str
    reason: str


class StackDumpHandler:
    """The target side: a registered faulthandler writing to a file. Close it at exit.

    Args:
        path: the dump file (appended to).
        signum: the signal to register.
    """

    def __init__(self, path: Path, signum: int) -> None:
        self.path = path
        self.signum = signum
        self._file: IO[str] | None = path.open("a", encoding="utf-8")
        faulthandler.register(signum, file=self._file, all_threads=True, chain=False)

    def close(self) -> None:
        """Unregister the handler and close the file (idempotent)."""
        if self._file is not None:
            faulthandler.unregister(self.signum)
            self._file.close()
            self._file = None

    def __enter__(self) -> StackDumpHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def install_stack_dump_handler(path: str | os.PathLike[str], signum: int = DEFAULT_DUMP_SIGNAL) -> StackDumpHandler:
    """Make this process dump all thread stacks to `path` when it receives `signum`.

    Args:
        path: the dump file; created if missing, appended to.
        signum: the signal (default SIGUSR1).

    Returns:
        The handler; call `close()` (or use it as a context manager) when done.
    """
    return StackDumpHandler(Path(path), signum)


def _py_spy(pid: int, timeout_s: float) -> StackDump | None:
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return StackDump(pid, "py-spy", False, "", f"py-spy did not finish within {timeout_s} s")
    if proc.returncode == 0 and proc.stdout.strip():
        return StackDump(pid, "py-spy", True, proc.stdout[-MAX_DUMP_BYTES:], "dumped with py-spy")
    return StackDump(pid, "py-spy", False, "", f"py-spy exited {proc.returncode}: {proc.stderr.strip()[-500:]}")


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(offset, size - MAX_DUMP_BYTES))
        return f.read(MAX_DUMP_BYTES).decode("utf-8", errors="replace")


def request_stack_dump(
    pid: int,
    *,
    dump_path: str | os.PathLike[str] | None = None,
    signum: int = DEFAULT_DUMP_SIGNAL,
    timeout_s: float = 10.0,
    use_py_spy: bool = True,
    clock: Clock | None = None,
) -> StackDump:
    """Get the Python stacks of process `pid`.

    Args:
        pid: the target.
        dump_path: the file the target registered with `install_stack_dump_handler`; needed
            for the faulthandler fallback.
        signum: the signal the target registered.
        timeout_s: how long to wait for py-spy or for the dump to appear.
        use_py_spy: try py-spy first when it is on PATH.
        clock: for waiting; `SystemClock` when omitted.

    Returns:
        The dump, or ``ok=False`` with the reason there is none. Never raises for a target that
        is gone or does not answer.

    Raises:
        ConfigError: if `timeout_s` is not positive.
    """
    if not timeout_s > 0:
        raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
    notes: list[str] = []
    if use_py_spy:
        spied = _py_spy(pid, timeout_s)
        if spied is not None and spied.ok:
            return spied
        notes.append(spied.reason if spied is not None else "py-spy is not installed")
    if dump_path is None:
        return StackDump(pid, "none", False, "", "; ".join([*notes, "no faulthandler dump file was given"]))
    path = Path(dump_path)
    if not path.exists():
        notes.append(
            f"{path} does not exist, so process {pid} did not install the stack-dump handler; "
            "not signalling it (the signal's default action would kill it)"
        )
        return StackDump(pid, "none", False, "", "; ".join(notes))
    return _faulthandler_dump(pid, path, signum, timeout_s, clk=clock or SystemClock(), notes=notes)


def _faulthandler_dump(
    pid: int, path: Path, signum: int, timeout_s: float, *, clk: Clock, notes: list[str]
) -> StackDump:
    """Signal the registered target and wait, bounded, for its dump to appear and settle."""
    before = path.stat().st_size
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return StackDump(pid, "faulthandler", False, "", "; ".join([*notes, f"process {pid} does not exist"]))
    deadline = clk.now() + timeout_s
    last = before
    while clk.now() < deadline:
        clk.sleep(_POLL_S)
        size = path.stat().st_size
        if size > before and size == last:
            # It grew and stopped growing: the handler wrote the whole dump.
            return StackDump(pid, "faulthandler", True, _read_from(path, before), f"dumped through signal {signum}")
        last = size
    if last > before:
        notes.append(f"the dump in {path} was still growing after {timeout_s} s; returning what was written")
        return StackDump(pid, "faulthandler", True, _read_from(path, before), "; ".join(notes))
    notes.append(
        f"no dump appeared in {path} within {timeout_s} s after signal {signum}: the process may be stopped "
        "(SIGSTOP) or blocked in native code with signals masked; py-spy can dump it from outside"
    )
    return StackDump(pid, "faulthandler", False, "", "; ".join(notes))


# py-spy names the main thread. faulthandler's handler runs on whichever thread the kernel gave
# the signal to ("Current thread"), and lists the threads newest first: the main thread is the last
# block. Python 3.14 adds the thread's name in brackets after its id.
_PY_SPY_MAIN = re.compile(r'^Thread \S+ \([^)]*\): "MainThread"\s*$')
_FAULTHANDLER_THREAD = re.compile(
    r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+(?: \[[^\]]*\])? \(most recent call first\):\s*$"
)


def main_thread_frames(text: str) -> tuple[str, ...] | None:
    """The frames of the main thread in a py-spy or faulthandler dump, innermost first; None when
    the dump shows no main thread (an empty or cut dump).

    Two dumps of one process taken a moment apart with different main-thread frames show it
    running Python code between them: busy (an evaluation nobody marked), not blocked.
    """
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if _PY_SPY_MAIN.match(line)]
    if not heads:
        heads = [i for i, line in enumerate(lines) if _FAULTHANDLER_THREAD.match(line)][-1:]
    if not heads:
        return None
    frames = []
    for frame in lines[heads[0] + 1 :]:
        if not frame.startswith((" ", "\t")) or not frame.strip():
            break
        frames.append(frame.strip())
    return tuple(frames) if frames else None
