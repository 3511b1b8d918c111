"""Lowering CPU priority: of one thread (`lower_thread_priority`), or of a whole process including
against other sessions (`lower_process_priority`, Linux autogroups).

Why `os.nice` alone is not enough: with ``CONFIG_SCHED_AUTOGROUP`` (on by default in most
distribution kernels; ``/proc/sys/kernel/sched_autogroup_enabled``), every session is one
scheduling group, and groups share the CPU by *their* weight: a thread's niceness only ranks it
against threads of its own session. A detached saver runs in a session of its own (it must outlive
the training process and its signals), so at ``nice 19`` it still took a full core's share from
the training process beside it. Writing the niceness to ``/proc/self/autogroup`` sets the weight of
the whole session, which is what makes it yield to training.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["AUTOGROUP_PATH", "lower_process_priority", "lower_thread_priority"]

AUTOGROUP_PATH = Path("/proc/self/autogroup")


def lower_process_priority(nice: int, autogroup_path: Path = AUTOGROUP_PATH) -> tuple[bool, str]:
    """Add `nice` to this process's niceness and give its session's autogroup the result.

    Args:
        nice: niceness to add, 0 to 19 (0: change nothing).
        autogroup_path: the autogroup control file (a test passes another file).

    Returns:
        (whether the autogroup weight was set, why or why not). Raising the process's own
        niceness always happens; the autogroup file is absent on kernels without autogroups.

    Raises:
        ValueError: `nice` is outside 0-19.
    """
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
        raise ValueError(f"nice must be an int from 0 to 19, got {nice!r}")
    if nice == 0:
        return False, "nice is 0: priority unchanged"
    value = os.nice(nice)
    if not autogroup_path.exists():
        return False, f"niceness {value}; {autogroup_path} does not exist (no autogroup scheduling)"
    try:
        autogroup_path.write_text(f"{value}\n")
    except OSError as e:
        return False, f"niceness {value}; cannot set the session's autogroup niceness: {e}"
    return True, f"niceness {value} for this process and its session's autogroup"


def lower_thread_priority(nice: int) -> None:
    """Add `nice` to the calling thread's niceness (capped at 19), leaving the process's other threads.

    On Linux a thread id names one thread for setpriority, so only the calling thread yields.

    Raises:
        OSError: the kernel refused.
    """
    tid = threading.get_native_id()
    current = os.getpriority(os.PRIO_PROCESS, tid)
    os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
