"""Processes read from /proc: who started whom, what environment they carry, whether they still run.

Ray nodes on one host are told apart only by their processes: a node's raylet, what it started
(workers, agents) and what those started (an agent's training processes, which may have left the
raylet's process tree by starting a new session and losing their parent). Ray gives every process a
raylet starts `RAY_RAYLET_PID` in its environment, and children inherit it, so a process that left
the tree is still found by it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = ["ProcessInfo", "alive", "ancestors", "descendants", "process_table", "with_environ"]


@dataclass(frozen=True)
class ProcessInfo:
    """One live process: pid, parent pid, start time (clock ticks since boot: a pid reused by a later
    process has another) and command line."""

    pid: int
    ppid: int
    start_ticks: int
    cmdline: str


def _read(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        if fields[0] in ("Z", "X"):  # a zombie has ended: only its exit status is left
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        return ProcessInfo(pid, int(fields[1]), int(fields[19]), cmdline)
    except (OSError, IndexError, ValueError):  # gone meanwhile
        return None


def process_table() -> dict[int, ProcessInfo]:
    """Every live (not zombie) process of the host, by pid."""
    table: dict[int, ProcessInfo] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _read(int(entry))
            if info is not None:
                table[info.pid] = info
    return table


def ancestors(pid: int | None = None) -> set[int]:
    """`pid` (this process by default) and its parents up to init."""
    found: set[int] = set()
    current = os.getpid() if pid is None else pid
    while current > 1 and current not in found:
        found.add(current)
        info = _read(current)
        if info is None:
            break
        current = info.ppid
    return found


def descendants(root: int, table: dict[int, ProcessInfo] | None = None) -> list[int]:
    """The live descendants of `root` (not `root` itself), parents before their children."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def with_environ(name: str, value: str, table: dict[int, ProcessInfo] | None = None) -> list[int]:
    """The live processes whose environment (as they were started) holds `name=value`; processes of
    other users, whose environment cannot be read, are never among them."""
    table = process_table() if table is None else table
    wanted = f"{name}={value}".encode()
    found = []
    for pid in table:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
            if wanted in f.read().split(b"\0"):
                found.append(pid)
    return found


def alive(info: ProcessInfo) -> bool:
    """Whether the process `info` describes still runs (its pid not reused since, not a zombie)."""
    now = _read(info.pid)
    return now is not None and now.start_ticks == info.start_ticks
