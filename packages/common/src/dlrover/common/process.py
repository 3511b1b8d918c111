"""Which process is which, from ``/proc``: a pid plus its start time names one process for good.

A pid alone is reused once its process is gone, so a record that names its owner by pid (a
shared-memory segment's owner file, a temp dir's name) also holds the owner's start time in clock
ticks since boot; the owner is alive while a process with that pid *and* that start time runs.
Linux only: elsewhere nothing is known (`process_start_ticks` returns None).
"""

from __future__ import annotations

import os

import attrs

from dlrover.common.validators import non_negative_int, positive_int

__all__ = [
    "ProcessIdentity",
    "exiting_status",
    "pid_namespace",
    "pid_scope",
    "proc_stat_fields",
    "process_start_ticks",
    "processes_mentioning",
]

# Indices into `proc_stat_fields` (proc(5) field numbers minus 3: the pid and command come first).
_STATE = 0
_FLAGS = 6
_START_TIME = 19
_EXIT_CODE = 49  # proc(5) field 52, since Linux 3.5
# PF_EXITING from the kernel's include/linux/sched.h (unchanged since Linux 2.6): set when a task
# starts to exit, before its memory is released.
_PF_EXITING = 0x4
_GONE_STATES = frozenset("ZXx")  # zombie or dead: the pid is still taken but the process runs no more


def proc_stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None if there is no such process.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so the
    fields start after the *last* ``)``. The first returned field is the state (proc(5) field 3).

    Args:
        pid: a process id.

    Returns:
        The whitespace-separated fields from the state on, or None if the process does not exist,
        its stat file cannot be read, or the file is not in the expected shape.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    end = text.rfind(")")
    if end < 0:
        return None
    fields = text[end + 1 :].split()
    return fields or None


def process_start_ticks(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot, or None if it does not exist.

    Together with the pid it identifies a process even after the pid is reused. A zombie (exited,
    not yet reaped) still has its start time.
    """
    fields = proc_stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[_START_TIME])
    except (IndexError, ValueError):
        return None


def exiting_status(pid: int) -> int | None:
    """The status process `pid` exits with, once it has begun to exit and before it can be reaped.

    A dying process can be reaped (`waitpid`) only once the kernel has released its memory, which
    takes about 0.15 s per GB of memory it had touched: a worker holding its model, its optimizer
    and its checkpoint buffers needs seconds. Its main thread is marked exiting (``PF_EXITING`` in
    proc(5)'s flags field) and shows the status it exits with (the ``exit_code`` field) from the
    start of that teardown, so a parent can act on a crash before the teardown ends.

    Args:
        pid: a process id; the caller must be allowed to read its status (its parent is).

    Returns:
        The status in `os.waitpid`'s form (`os.waitstatus_to_exitcode` decodes it) while the
        process exits, or once it has exited and is not reaped yet; None while it runs, when it
        is gone, or where /proc cannot tell (not Linux, a kernel older than 3.5). A reader not
        allowed to see the status reads 0, as for a clean exit: act only on a non-zero status.
    """
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) <= _EXIT_CODE:
        return None
    try:
        flags = int(fields[_FLAGS])
        status = int(fields[_EXIT_CODE])
    except ValueError:
        return None
    return status if flags & _PF_EXITING else None


def processes_mentioning(text: str) -> list[int]:
    """Live processes other than this one whose command line contains `text`.

    What a leak check asks after a job ends: is anything still running that was started for it
    (its command line names the job's temp dir, a unique token)? Zombies are left out: they run no
    more and hold nothing but their pid until their parent reaps them.

    Args:
        text: the substring to look for in each NUL-separated command line.

    Returns:
        Their pids, in no particular order (empty where /proc does not exist).
    """
    needle = text.encode()
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        fields = proc_stat_fields(int(entry))
        if needle in cmdline and fields is not None and fields[_STATE] not in _GONE_STATES:
            found.append(int(entry))
    return found


def pid_namespace() -> int | None:
    """An id of this process's pid namespace (the inode of ``/proc/self/ns/pid``), None if unknown.

    Pids, and so `ProcessIdentity`, mean something only inside one pid namespace: containers that
    share a directory (a host's /tmp mounted into each) must not judge each other's processes.
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def pid_scope() -> int | None:
    """An id of the set of processes whose pids this process can judge, None if unknown.

    That is this boot of this host (the kernel's random ``boot_id``) and this pid namespace. The
    namespace alone is not enough where a directory is shared between hosts (a cluster's /tmp on
    a network filesystem): the initial pid namespace has the same inode on every Linux host.
    """
    namespace = pid_namespace()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = int(f.read().strip().replace("-", "")[:8], 16)
    except (OSError, ValueError):
        return None
    if namespace is None:
        return None
    return (boot << 32) | (namespace & 0xFFFFFFFF)


@attrs.frozen
class ProcessIdentity:
    """One process: its pid and its start time, which together are never reused.

    Args:
        pid: the process id.
        start_ticks: its start time in clock ticks since boot (see `process_start_ticks`).

    Raises:
        ConfigError: the pid is not a positive integer or the start time is negative.
    """

    pid: int = attrs.field(validator=positive_int)
    start_ticks: int = attrs.field(validator=non_negative_int)

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of the process running now as `pid`, or None if there is none."""
        ticks = process_start_ticks(pid)
        return None if ticks is None else cls(pid, ticks)

    @classmethod
    def current(cls) -> ProcessIdentity | None:
        """The identity of this process, or None where ``/proc`` cannot tell (not Linux)."""
        return cls.of(os.getpid())

    def alive(self) -> bool:
        """Whether this process still runs: its pid has its start time and it is no zombie.

        A zombie has exited (only its parent has not collected the exit status yet), so whatever it
        owned is no longer in use.
        """
        fields = proc_stat_fields(self.pid)
        if fields is None:
            return False
        try:
            ticks = int(fields[_START_TIME])
        except (IndexError, ValueError):
            return False
        return ticks == self.start_ticks and fields[_STATE] not in _GONE_STATES
