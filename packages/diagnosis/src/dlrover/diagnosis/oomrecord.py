"""The host's own record of out-of-memory kills: evidence beyond a worker's log.

A worker that the kernel's OOM killer ends dies by SIGKILL and prints nothing; its log alone
cannot tell an OOM kill from a ``kill -9``. The kernel keeps two records the agent can read:

* the memory cgroup's ``oom_kill`` counter (cgroup v2 ``memory.events``; cgroup v1
  ``memory.oom_control`` on kernels that count it), which counts kills inside the agent's own
  container and needs no privilege;
* the kernel log (``/dev/kmsg``), which names the killed process but is often not readable in
  a container.

`OomWatch` reads both, failing soft (an unreadable record is simply absent), and writes what it
found as lines starting with `MEMORY_RECORD`, appended to a failed worker's evidence; the
``host-memory-record`` rule reads them. When the cgroup's counter was read before and after and
did not move (and the kernel log names no kill), it says so (a line starting with `NO_OOM_KILL`):
only then is a SIGKILL known to come from someone else. With no record read, an unexplained
SIGKILL is taken for the OOM killer's, which it is far more often than not (the real-world
corpus holds no SIGKILL whose thread found another cause). The paths are injected so tests fake
them.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

import attrs

from dlrover.common import PROC_SELF_CGROUP, own_memberships

__all__ = [
    "DEFAULT_CGROUP_ROOT",
    "DEFAULT_KMSG",
    "MEMORY_RECORD",
    "NO_OOM_KILL",
    "OomCount",
    "OomWatch",
    "parse_oom_kills",
]

MEMORY_RECORD = "dlrover memory record"
"""Starts every evidence line `OomWatch` writes; the ``host-memory-record`` rule matches it."""

NO_OOM_KILL = f"{MEMORY_RECORD}: no OOM kill"
"""Starts the evidence line saying the records were read and show no OOM kill (the ``sigkill-exit``
rule needs it to call a SIGKILL someone else's); ``host-memory-record`` passes it over."""

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the agent's own cgroup is mounted inside its container (a cgroup namespace root)."""

DEFAULT_OWN_CGROUPS = PROC_SELF_CGROUP
"""Names the agent's own cgroups, relative to the hierarchies' roots."""

DEFAULT_KMSG = Path("/dev/kmsg")
"""The kernel log as a device; reading it needs CAP_SYSLOG or ``kernel.dmesg_restrict=0``."""

MAX_KMSG_BYTES = 4 << 20
"""At most this much of the kernel log is read per failure (its ring is usually 1 MiB or less)."""

_OOM_KILL = re.compile(r"^oom_kill\s+(\d+)\s*$", re.MULTILINE)
_KERNEL_OOM = re.compile(r"Out of memory: Kill(?:ed)? process (\d+)|oom-kill:.*\bpid=(\d+)", re.IGNORECASE)


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill`` count in a ``memory.events`` or ``memory.oom_control`` file, or None."""
    match = _OOM_KILL.search(text)
    return None if match is None else int(match.group(1))


@attrs.frozen
class OomCount:
    """The memory cgroup's OOM kill count at one moment.

    Attributes:
        kills: the counter's value.
        source: the file it was read from.
    """

    kills: int
    source: str


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _kmsg_records(path: Path, limit: int) -> Iterable[str]:
    """The kernel log's records; nothing when it cannot be read. ``/dev/kmsg`` answers one record
    per read and EAGAIN at the end (opened non-blocking); a plain file (tests) ends at EOF."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        read = 0
        while read < limit:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring overwrote the record: skip to the next
                    continue
                return
            if not chunk:
                return
            read += len(chunk)
            for record in chunk.decode("utf-8", errors="replace").splitlines():
                # ``/dev/kmsg`` records are "prio,seq,time,flags;message".
                yield record.split(";", 1)[1] if ";" in record.split(" ", 1)[0] else record
    finally:
        os.close(fd)


@attrs.frozen
class OomWatch:
    """Reads the host's records of OOM kills for the agent.

    Attributes:
        cgroup_root: the cgroup mount holding the agent's memory cgroup.
        kmsg: the kernel log device.
        max_kmsg_bytes: the most of the kernel log read per failure.
        own_cgroups: the file naming the agent's own cgroups (``/proc/self/cgroup``).
    """

    cgroup_root: Path = DEFAULT_CGROUP_ROOT
    kmsg: Path = DEFAULT_KMSG
    max_kmsg_bytes: int = MAX_KMSG_BYTES
    own_cgroups: Path = DEFAULT_OWN_CGROUPS

    def count(self) -> OomCount | None:
        """The OOM kill count now of the agent's own memory cgroup (v2, then v1; as
        ``/proc/self/cgroup`` names it, which on a bare-metal host is not the mount's root, whose
        v2 root keeps no ``memory.events``), else of the mount's root (a container's namespace
        root), or None when none is readable."""
        for path in (
            *self._own_paths(),
            self.cgroup_root / "memory.events",
            self.cgroup_root / "memory" / "memory.oom_control",
        ):
            text = _read_text(path)
            kills = None if text is None else parse_oom_kills(text)
            if kills is not None:
                return OomCount(kills, str(path))
        return None

    def _own_paths(self) -> list[Path]:
        """The counter files of the agent's own memory cgroup, as ``/proc/self/cgroup`` names it
        (v2 ``0::/path``; v1 ``N:memory:/path``, its hierarchy mounted alone or with others)."""
        paths = []
        for member in own_memberships(self.own_cgroups):
            relative = member.relative()
            if relative is None or relative == PurePosixPath():
                # Outside this namespace's view (nothing under the mount is ours), or the mount's
                # root, which is tried anyway.
                continue
            if member.unified:
                paths.append(self.cgroup_root / relative / "memory.events")
            elif member.has("memory"):
                # Mounted alone ("memory") or with other controllers ("cpu,memory").
                mounts = dict.fromkeys((",".join(member.controllers), "memory"))
                paths.extend(self.cgroup_root / mount / relative / "memory.oom_control" for mount in mounts)
        return paths

    def kernel_kills(self, pids: Sequence[int]) -> list[str]:
        """The kernel log's OOM kill lines about `pids` (any process when `pids` is empty)."""
        wanted = {int(p) for p in pids}
        lines = []
        for record in _kmsg_records(self.kmsg, self.max_kmsg_bytes):
            match = _KERNEL_OOM.search(record)
            if match is None:
                continue
            pid = int(match.group(1) or match.group(2))
            if not wanted or pid in wanted:
                lines.append(record.strip())
        return lines

    def evidence(self, before: OomCount | None, pids: Sequence[int]) -> list[str]:
        """What the records say about a failure since `before` (the count when the workers
        started), as `MEMORY_RECORD` lines: the kills found, else one `NO_OOM_KILL` line when the
        cgroup's counter was read both times and did not move; empty when nothing could be read.

        Args:
            before: `count()` taken when the failed workers started, or None.
            pids: the failed workers' process ids, to pick their lines from the kernel log.
        """
        lines = []
        now = self.count()
        if before is not None and now is not None and now.source == before.source and now.kills > before.kills:
            lines.append(
                f"{MEMORY_RECORD}: the memory cgroup's oom_kill count rose from {before.kills} to {now.kills} "
                f"while the workers ran ({now.source}): the kernel's OOM killer ended a process"
            )
        for line in self.kernel_kills(pids)[-3:]:
            lines.append(f"{MEMORY_RECORD}: kernel log: {line}")
        if not lines and before is not None and now is not None and now.source == before.source:
            lines.append(
                f"{NO_OOM_KILL}: the memory cgroup's oom_kill count stayed at {now.kills} while the workers ran "
                f"({now.source})"
            )
        return lines
