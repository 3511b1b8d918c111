"""Exec a worker that dies with its agent.

    python -m dlrover.launcher._orphan_guard PARENT_PID -- PROGRAM [ARGS...]

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) makes the kernel send SIGKILL to this
process when the agent that spawned it dies, even by SIGKILL; it survives the `exec` below, so
the worker program inherits it. Workers lead their own process group (the agent stops them
by process group), so without this a killed agent would leave them training, holding ports and
GPUs. Setting it here, in a fresh interpreter, avoids `preexec_fn`, which is unsafe in a process
with threads (the agent has gRPC threads).

The signal fires when the spawning *thread* exits, so the agent spawns workers from its
long-lived main loop. If the agent died before the signal was armed, the parent pid no longer
matches and the guard exits instead of running an orphan.

The guard also raises the worker's OOM score (``/proc/self/oom_score_adj``, inherited across the
`exec`; raising needs no privilege): when a node runs out of memory (its memory cgroup's limit, or
the host's), the kernel's OOM killer takes a worker, which the agent restarts or reports, rather
than the agent, which holds the node's flash checkpoints in shared memory.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
ORPHANED_EXIT_CODE = 125
WORKER_OOM_SCORE_ADJ = 500
"""Added to a worker's OOM badness (-1000..1000; 500 counts as half the memory limit in use)."""


def _arm_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")


def _prefer_for_oom_kill() -> None:
    """Make this process (and the worker it becomes) the OOM killer's choice before its agent."""
    try:
        with open("/proc/self/oom_score_adj", "r+", encoding="ascii") as f:
            current = int(f.read().strip() or 0)
            if current < WORKER_OOM_SCORE_ADJ:
                f.seek(0)
                f.write(str(WORKER_OOM_SCORE_ADJ))
    except (OSError, ValueError):
        pass  # not Linux, or /proc is not mounted: the kernel chooses by size alone


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m dlrover.launcher._orphan_guard PARENT_PID -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    expected_parent = int(argv[0])
    _arm_parent_death_signal()
    _prefer_for_oom_kill()
    if os.getppid() != expected_parent:
        return ORPHANED_EXIT_CODE
    program = argv[2:]
    try:
        os.execvp(program[0], program)  # noqa: S606 (argv from dlrover-run, no shell)
    except OSError as exc:
        print(f"dlrover-run: cannot start {program[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
