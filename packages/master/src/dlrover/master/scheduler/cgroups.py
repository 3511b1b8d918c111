"""Memory limits for local nodes: one child memory cgroup per node, under the master's own cgroup.

The local backend starts each node's agent inside a fresh group whose limit is the node's memory, so a
node that uses more is ended by the kernel's OOM killer, and the group's own counter (``oom_kill``) is the
kernel's record of it: failure evidence that needs no guessing from an exit status.

Both hierarchies are supported:

=========  ======================  =========================================
hierarchy  limit file              OOM record
=========  ======================  =========================================
v2         ``memory.max``          ``oom_kill N`` in ``memory.events``
v1         ``memory.limit_in_bytes``  ``oom_kill N`` in ``memory.oom_control``
=========  ======================  =========================================

`detect_memory_groups` finds the master's own memory cgroup from ``/proc/self/cgroup`` and
``/proc/self/mountinfo`` and proves it can create, limit and remove a child there and start a process in
it (a probe group); where
it cannot (no memory controller, no permission, cgroup v2 without the controller delegated to children),
it returns `UnavailableMemoryGroups` saying why, and nothing is enforced. A process joins its node's group
through a shell that writes its own pid to the group's ``cgroup.procs`` and then execs the agent
(`join_command`): the agent and everything it starts are charged to the group from their first byte.

A group is removed (``rmdir``) once no process is left in it; the kernel refuses earlier (EBUSY), so
`remove` reports whether it is gone and the backend tries again later, and kills what is left at close.
`FakeMemoryGroups` keeps groups in memory for tests of the backend.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import attrs

from dlrover.common import CgroupMembership, parse_memberships
from dlrover.diagnosis.oomrecord import parse_oom_kills

__all__ = [
    "CgroupMemoryGroups",
    "FakeMemoryGroups",
    "MemoryGroup",
    "MemoryGroups",
    "UnavailableMemoryGroups",
    "detect_memory_groups",
    "join_command",
]

_MIB = 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


@attrs.frozen
class MemoryGroup:
    """One node's memory cgroup.

    Attributes:
        name: its directory name under the master's cgroup.
        path: its directory (the cgroup file system), or a fake's key.
        limit_mb: its memory limit in MiB.
    """

    name: str
    path: str
    limit_mb: int

    @property
    def procs_file(self) -> str:
        """The file a process writes its pid to, to join the group."""
        return str(Path(self.path) / "cgroup.procs")


@runtime_checkable
class MemoryGroups(Protocol):
    """Creates, reads and removes per-node memory groups. Implementations need not be thread-safe (the
    local backend calls them under its lock)."""

    @property
    def usable(self) -> bool:
        """Whether groups can be created here; when False, `describe` says why and nothing is enforced."""
        ...

    def describe(self) -> str:
        """A sentence: how limits are enforced (hierarchy and where), or why they cannot be."""
        ...

    def create(self, name: str, limit_mb: int) -> MemoryGroup:
        """A new group `name` limited to `limit_mb` MiB.

        Raises:
            OSError: it cannot be created or limited (nothing is left behind).
            ValueError: the name is not a plain directory name, or the limit is below 1 MiB.
        """
        ...

    def adopt(self, name: str, path: str, limit_mb: int) -> MemoryGroup:
        """A group a previous master made (read from its journal), checked to be one this one would make.

        Raises:
            ValueError: `path` is not the group `name` where this master makes groups (a journal is not trusted
                to name any other directory to remove or processes to kill).
            OSError: groups cannot be managed here.
        """
        ...

    def join_argv(self, group: MemoryGroup, argv: Sequence[str]) -> list[str]:
        """The command that runs `argv` inside `group`, from its first instruction."""
        ...

    def oom_kills(self, group: MemoryGroup) -> int | None:
        """How many processes the kernel's OOM killer ended in `group`; None when it cannot be read."""
        ...

    def pids(self, group: MemoryGroup) -> list[int]:
        """The processes in `group` now (empty when it is gone)."""
        ...

    def remove(self, group: MemoryGroup) -> bool:
        """Remove `group`; True when it is gone, False while processes remain in it."""
        ...


def join_command(procs_file: str, argv: Sequence[str]) -> list[str]:
    """A POSIX shell that moves itself into the group whose ``cgroup.procs`` is `procs_file`, then execs
    `argv` (same pid): a public, race-free alternative to a ``preexec_fn`` in a threaded master."""
    script = 'echo "$$" > "$1" || { echo "dlrover: cannot join memory cgroup $1" >&2; exit 125; }; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "dlrover-cgroup-join", procs_file, *argv]


def _check_request(name: str, limit_mb: int) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"memory group name {name!r} must be 1-200 of [A-Za-z0-9_.-]")
    if isinstance(limit_mb, bool) or not isinstance(limit_mb, int) or limit_mb < 1:
        raise ValueError(f"memory limit must be a whole number of MiB >= 1, got {limit_mb!r}")


@attrs.frozen
class _Layout:
    version: int
    limit_file: str
    oom_file: str


_V1 = _Layout(1, "memory.limit_in_bytes", "memory.oom_control")
_V2 = _Layout(2, "memory.max", "memory.events")


class CgroupMemoryGroups:
    """Memory groups in a real (or, in tests, a fake on-disk) cgroup tree.

    Args:
        version: 1 or 2, the hierarchy's version.
        parent: the directory the node groups are created in (the master's own memory cgroup).
        rmdir: removes a group directory; the kernel's ``rmdir`` by default (tests of a plain directory tree
            pass one that removes the control files first, as the kernel does).
    """

    def __init__(self, version: int, parent: str | os.PathLike[str], *, rmdir: Callable[[Path], None] = os.rmdir):
        if version not in (1, 2):
            raise ValueError(f"cgroup version must be 1 or 2, got {version!r}")
        self._layout = _V1 if version == 1 else _V2
        self._parent = Path(parent)
        self._rmdir = rmdir

    @property
    def usable(self) -> bool:
        """Always True: `detect_memory_groups` returns this only where a probe group worked."""
        return True

    @property
    def version(self) -> int:
        """The hierarchy's version."""
        return self._layout.version

    @property
    def parent(self) -> Path:
        """Where node groups are created."""
        return self._parent

    def describe(self) -> str:
        """Where and how limits are enforced."""
        return (
            f"memory limits are enforced with a cgroup v{self.version} group per node under {self._parent} "
            f"({self._layout.limit_file}; OOM kills read from {self._layout.oom_file})"
        )

    def create(self, name: str, limit_mb: int) -> MemoryGroup:
        """Make the group and write its limit (see `MemoryGroups.create`)."""
        _check_request(name, limit_mb)
        path = self._parent / name
        path.mkdir(mode=0o755)
        group = MemoryGroup(name, str(path), limit_mb)
        try:
            (path / self._layout.limit_file).write_text(f"{limit_mb * _MIB}\n", encoding="ascii")
            if self.version == 2:
                # Swap would let a node exceed its limit without the OOM killer noticing; where no swap
                # controller is enabled the file does not exist, which is fine.
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0\n", encoding="ascii")
        except BaseException:
            self.remove(group)
            raise
        return group

    def adopt(self, name: str, path: str, limit_mb: int) -> MemoryGroup:
        """See `MemoryGroups.adopt`."""
        _check_request(name, limit_mb)
        if Path(path) != self._parent / name:
            raise ValueError(f"memory group {path!r} is not {name!r} under {self._parent}")
        return MemoryGroup(name, path, limit_mb)

    def join_argv(self, group: MemoryGroup, argv: Sequence[str]) -> list[str]:
        """See `join_command`."""
        return join_command(group.procs_file, argv)

    def oom_kills(self, group: MemoryGroup) -> int | None:
        """The group's ``oom_kill`` count; None when unreadable (or a v1 kernel too old to count)."""
        try:
            text = (Path(group.path) / self._layout.oom_file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        return parse_oom_kills(text)

    def pids(self, group: MemoryGroup) -> list[int]:
        """The pids in the group's ``cgroup.procs``."""
        try:
            text = Path(group.procs_file).read_text(encoding="ascii", errors="replace")
        except OSError:
            return []
        return [int(line) for line in text.split() if line.isdigit()]

    def remove(self, group: MemoryGroup) -> bool:
        """``rmdir`` the group; False while the kernel refuses because processes remain."""
        try:
            self._rmdir(Path(group.path))
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        return True


@attrs.frozen
class UnavailableMemoryGroups:
    """No memory group can be created here: nothing is enforced, and `reason` says why.

    Attributes:
        reason: why, in words (shown once at the master's start).
    """

    reason: str

    @property
    def usable(self) -> bool:
        """Always False."""
        return False

    def describe(self) -> str:
        """Why no memory limit is enforced."""
        return f"memory limits are not enforced: {self.reason}"

    def create(self, name: str, limit_mb: int) -> MemoryGroup:
        """Never works here.

        Raises:
            OSError: always, with the reason.
        """
        raise OSError(errno.ENOTSUP, self.describe())

    def adopt(self, name: str, path: str, limit_mb: int) -> MemoryGroup:
        """Never works here.

        Raises:
            OSError: always, with the reason.
        """
        raise OSError(errno.ENOTSUP, self.describe())

    def join_argv(self, group: MemoryGroup, argv: Sequence[str]) -> list[str]:
        """`argv` unchanged."""
        return list(argv)

    def oom_kills(self, group: MemoryGroup) -> int | None:
        """Nothing to read."""
        return None

    def pids(self, group: MemoryGroup) -> list[int]:
        """No group, no process."""
        return []

    def remove(self, group: MemoryGroup) -> bool:
        """Nothing to remove."""
        return True


class FakeMemoryGroups:
    """Groups in memory: `oom` plays the kernel's OOM killer, `members` the processes in a group."""

    usable = True

    def __init__(self) -> None:
        self.groups: dict[str, MemoryGroup] = {}
        self.kills: dict[str, int] = {}
        self.members: dict[str, list[int]] = {}
        self.created: list[MemoryGroup] = []
        self.removed: list[str] = []

    def describe(self) -> str:
        """Says it is a fake."""
        return "memory limits are enforced by an in-memory fake"

    def create(self, name: str, limit_mb: int) -> MemoryGroup:
        """Record the group (see `MemoryGroups.create`)."""
        _check_request(name, limit_mb)
        if name in self.groups:
            raise FileExistsError(errno.EEXIST, f"memory group {name} exists")
        group = MemoryGroup(name, f"fake:{name}", limit_mb)
        self.groups[name] = group
        self.kills[name] = 0
        self.created.append(group)
        return group

    def adopt(self, name: str, path: str, limit_mb: int) -> MemoryGroup:
        """The group `create` made under `name` (see `MemoryGroups.adopt`)."""
        _check_request(name, limit_mb)
        group = self.groups.get(name)
        if group is None or group.path != path:
            raise ValueError(f"memory group {path!r} is not {name!r} of this fake")
        return group

    def join_argv(self, group: MemoryGroup, argv: Sequence[str]) -> list[str]:
        """`argv` unchanged: nothing joins a fake group."""
        return list(argv)

    def oom(self, name: str) -> None:
        """The kernel killed a process of group `name` for memory."""
        self.kills[name] += 1

    def oom_kills(self, group: MemoryGroup) -> int | None:
        """The count `oom` raised; None once the group is removed."""
        return self.kills.get(group.name) if group.name in self.groups else None

    def pids(self, group: MemoryGroup) -> list[int]:
        """What `members` says."""
        return list(self.members.get(group.name, ()))

    def remove(self, group: MemoryGroup) -> bool:
        """False while `members` lists processes in it."""
        if self.members.get(group.name):
            return False
        if self.groups.pop(group.name, None) is not None:
            self.removed.append(group.name)
        return True


def _own_memory_cgroup(proc_cgroup: str) -> tuple[int, CgroupMembership] | None:
    """(version, membership) of this process's memory cgroup from ``/proc/self/cgroup``; v1's memory
    controller wins over v2 (a controller is bound to one hierarchy at a time)."""
    unified = None
    for member in parse_memberships(proc_cgroup):
        if member.has("memory"):
            return 1, member
        if member.unified:
            unified = member
    return None if unified is None else (2, unified)


def _mount_point(mountinfo: str, version: int) -> tuple[Path, str] | None:
    """(mount point, root inside the hierarchy) of the memory hierarchy's mount in ``/proc/self/mountinfo``."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, super_options = tail[0], tail[2].split(",")
        if (version == 1 and fstype == "cgroup" and "memory" in super_options) or (
            version == 2 and fstype == "cgroup2"
        ):
            return Path(fields[4].replace("\\040", " ")), fields[3]
    return None


def _locate(proc_cgroup: str, mounts: str) -> tuple[int, Path] | str:
    """(version, directory) of this process's memory cgroup, or why it cannot be used."""
    own = _own_memory_cgroup(proc_cgroup)
    if own is None:
        return "this process is in no memory cgroup (no memory controller)"
    version, member = own
    path = member.path
    if member.relative() is None:
        return f"this process's memory cgroup {path} lies outside this cgroup namespace's view"
    mount = _mount_point(mounts, version)
    if mount is None:
        return f"the cgroup v{version} memory hierarchy is not mounted here"
    mount_point, root = mount
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return f"this process's memory cgroup {path} is outside the mounted part {root}"
    relative = path[len(root) :] if root != "/" else path
    parent = mount_point / relative.lstrip("/")
    if version == 2 and not _has_memory(parent):
        return f"the memory controller is not enabled for cgroup v2 group {parent}"
    return version, parent


def _probe(groups: CgroupMemoryGroups, name: str, join_timeout_s: float = 30.0) -> str:
    """Make, read and remove a group, or say what failed (empty when all worked)."""
    try:
        group = groups.create(name, 64)
    except OSError as exc:
        return f"no child group can be created under {groups.parent} ({exc.strerror or exc})"
    try:
        if groups.version == 2 and not _has_memory(Path(group.path)):
            # A v2 group holding processes cannot enable a controller for its children: a child
            # group here would limit nothing.
            return (
                f"the memory controller is not delegated to children of cgroup v2 group {groups.parent} "
                "(its cgroup.subtree_control lacks memory)"
            )
        if groups.oom_kills(group) is None:
            return (
                f"child groups under {groups.parent} record no oom_kill count: an OOM kill could not be told "
                "from another SIGKILL"
            )
        joined = _try_join(groups, group, join_timeout_s)
        if joined:
            return joined
    finally:
        groups.remove(group)
    return ""


def _try_join(groups: CgroupMemoryGroups, group: MemoryGroup, timeout_s: float) -> str:
    """Start a process that joins `group` as a node's agent would (`join_command`); what failed, or empty.

    Creating a group is not enough: cgroup v2 refuses a process into a group whose parent holds
    processes (EBUSY), and a delegated subtree may refuse a write to ``cgroup.procs`` (EACCES)."""
    argv = groups.join_argv(group, ["/bin/true"])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no process could be started in a child group of {groups.parent} ({exc})"
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return f"a process cannot join a child group of {groups.parent}: {why[0]}"
    return ""


def detect_memory_groups(
    *,
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
    mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo",
    probe_name: str | None = None,
    rmdir: Callable[[Path], None] = os.rmdir,
    probe_join_timeout_s: float = 30.0,
) -> CgroupMemoryGroups | UnavailableMemoryGroups:
    """The memory groups this process can create for its nodes, or why there are none.

    Args:
        proc_cgroup: this process's ``/proc/<pid>/cgroup``.
        mountinfo: this process's ``/proc/<pid>/mountinfo``.
        probe_name: the name of the probe group made and removed to prove it works (default
            ``dlrover-probe-<pid>``).
        rmdir: see `CgroupMemoryGroups`.
        probe_join_timeout_s: the longest the probe's process may take to join its group.
    """
    try:
        located = _locate(Path(proc_cgroup).read_text(encoding="utf-8"), Path(mountinfo).read_text(encoding="utf-8"))
    except OSError as exc:
        return UnavailableMemoryGroups(f"this process's cgroups cannot be read ({exc})")
    if isinstance(located, str):
        return UnavailableMemoryGroups(located)
    groups = CgroupMemoryGroups(located[0], located[1], rmdir=rmdir)
    problem = _probe(groups, probe_name or f"dlrover-probe-{os.getpid()}", probe_join_timeout_s)
    return UnavailableMemoryGroups(problem) if problem else groups


def _has_memory(path: Path) -> bool:
    try:
        return "memory" in (path / "cgroup.controllers").read_text(encoding="ascii").split()
    except OSError:
        return False
