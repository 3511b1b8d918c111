"""Which cgroups a process belongs to, read from ``/proc/<pid>/cgroup``.

Each line of that file is ``hierarchy-ID:controller-list:path``: cgroup v2's unified hierarchy is
``0::/path``; a v1 hierarchy lists its controllers (``4:memory:/path``, or several mounted together,
``3:cpu,cpuacct:/path``). The path is relative to the hierarchy's root as this process's cgroup
namespace sees it, so inside a container it is usually ``/`` and the mount's root is the process's
own group. A path that starts with ``/..`` lies outside this namespace's view: nothing under the
mount is that group, and reading a directory there would read another group's files.

The flash checkpoint's pacing (CPU quota), the agent's OOM record (memory events) and the local
backend's memory groups read this file; this module is their one reader.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import attrs

__all__ = ["PROC_SELF_CGROUP", "CgroupMembership", "own_memberships", "parse_memberships"]

PROC_SELF_CGROUP = Path("/proc/self/cgroup")
"""This process's cgroup memberships."""


@attrs.frozen
class CgroupMembership:
    """One line of ``/proc/<pid>/cgroup``.

    Attributes:
        hierarchy: the hierarchy's ID (``"0"`` for cgroup v2's unified hierarchy).
        controllers: the controllers bound to it (v1), empty for the unified hierarchy.
        path: the group's path as listed, relative to the hierarchy's root in this namespace.
    """

    hierarchy: str
    controllers: tuple[str, ...]
    path: str

    @property
    def unified(self) -> bool:
        """Whether this is cgroup v2's unified hierarchy (``0::/path``)."""
        return self.hierarchy == "0" and not self.controllers

    def has(self, controller: str) -> bool:
        """Whether `controller` is bound to this (v1) hierarchy."""
        return controller in self.controllers

    def relative(self) -> PurePosixPath | None:
        """The group's path below the hierarchy's root (``.`` for the root itself), or None where it
        lies outside this namespace's view (a ``..`` part, or a path that is not absolute)."""
        if not self.path.startswith("/"):
            return None
        parts = [part for part in self.path.split("/") if part]
        if ".." in parts:
            return None
        return PurePosixPath(*parts)

    def directories(self, mount: Path) -> list[Path]:
        """The group's directory under `mount` and every directory above it up to `mount`,
        innermost first (limits are set along the path); empty outside this namespace's view."""
        relative = self.relative()
        if relative is None:
            return []
        parts = relative.parts
        return [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def parse_memberships(text: str) -> list[CgroupMembership]:
    """The memberships listed in a ``/proc/<pid>/cgroup`` text; lines of another shape are skipped."""
    found = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        names = tuple(name for name in controllers.split(",") if name)
        found.append(CgroupMembership(hierarchy, names, path.strip()))
    return found


def own_memberships(proc_cgroup: Path = PROC_SELF_CGROUP) -> list[CgroupMembership]:
    """This process's memberships (`proc_cgroup` names another file, as tests do); empty where the
    file cannot be read (no /proc, no cgroups). A group name in bytes that are not UTF-8 (the kernel
    prints names as they were made) reads with replacement characters: no directory has that name,
    so nothing is read for that group, and nothing raises."""
    try:
        text = proc_cgroup.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return parse_memberships(text)
