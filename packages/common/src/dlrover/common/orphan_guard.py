"""Exec a program that dies with the process that started it.

    python -m dlrover.common.orphan_guard [--keep-oom-score] PARENT_PID -- PROGRAM [ARGS...]

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) makes the kernel send SIGKILL to this
process when the process that spawned it dies, even by SIGKILL; it survives the `exec` below, so
the program inherits it. `dlrover-run` starts its workers through it (they lead their own process
group, so without it a killed agent would leave them training, holding ports and GPUs), and the
Ray backend's agent actor starts its agent through it (Ray ends an actor's process, not what that
process started). Setting it here, in a fresh interpreter, avoids `preexec_fn`, which is unsafe in
a process with threads (agents and Ray actors have many).

The signal fires when the spawning *thread* exits, so spawn from a long-lived thread. If the
parent died before the signal was armed, the parent pid no longer matches and the guard exits
with `ORPHANED_EXIT_CODE` instead of running an orphan.

Unless told `--keep-oom-score`, the guard also raises the program's OOM score
(``/proc/self/oom_score_adj``, inherited across the `exec`; raising needs no privilege): when a
node runs out of memory (its memory cgroup's limit, or the host's), the kernel's OOM killer takes a
worker, which the agent restarts or reports, rather than the agent, which holds the node's flash
checkpoints in shared memory. An agent started through the guard keeps its score.

This module imports nothing beyond the standard library: every worker start goes through it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = [
    "KEEP_OOM_SCORE_FLAG",
    "ORPHANED_EXIT_CODE",
    "WORKER_OOM_SCORE_ADJ",
    "arm_parent_death_signal",
    "guarded_argv",
    "prefer_for_oom_kill",
]

_PR_SET_PDEATHSIG = 1
ORPHANED_EXIT_CODE = 125
"""The guard's exit status when its parent was gone before the parent-death signal was armed."""
WORKER_OOM_SCORE_ADJ = 500
"""Added to a worker's OOM badness (-1000..1000; 500 counts as half the memory limit in use)."""
KEEP_OOM_SCORE_FLAG = "--keep-oom-score"


def guarded_argv(parent_pid: int, program: list[str], *, keep_oom_score: bool = False) -> list[str]:
    """The argv that runs `program` through the guard, dying with `parent_pid`."""
    flags = [KEEP_OOM_SCORE_FLAG] if keep_oom_score else []
    return [sys.executable, "-m", "dlrover.common.orphan_guard", *flags, str(parent_pid), "--", *program]


def arm_parent_death_signal() -> None:
    """Have the kernel SIGKILL this process when the thread that started it exits (Linux; elsewhere nothing).

    Raises:
        OSError: the kernel refused.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")


def prefer_for_oom_kill() -> None:
    """Make this process (and the program it becomes) the OOM killer's choice before its agent."""
    try:
        with open("/proc/self/oom_score_adj", "r+", encoding="ascii") as f:
            current = int(f.read().strip() or 0)
            if current < WORKER_OOM_SCORE_ADJ:
                f.seek(0)
                f.write(str(WORKER_OOM_SCORE_ADJ))
    except (OSError, ValueError):
        pass  # not Linux, or /proc is not mounted: the kernel chooses by size alone


def main(argv: list[str]) -> int:
    keep_oom_score = bool(argv) and argv[0] == KEEP_OOM_SCORE_FLAG
    if keep_oom_score:
        argv = argv[1:]
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(
            f"usage: python -m dlrover.common.orphan_guard [{KEEP_OOM_SCORE_FLAG}] PARENT_PID -- PROGRAM [ARGS...]",
            file=sys.stderr,
        )
        return 2
    expected_parent = int(argv[0])
    arm_parent_death_signal()
    if not keep_oom_score:
        prefer_for_oom_kill()
    if os.getppid() != expected_parent:
        return ORPHANED_EXIT_CODE
    program = argv[2:]
    try:
        os.execvp(program[0], program)  # noqa: S606 (argv from dlrover-run or the Ray backend, no shell)
    except OSError as exc:
        print(f"dlrover: cannot start {program[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
