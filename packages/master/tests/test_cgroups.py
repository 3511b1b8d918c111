"""Per-node memory cgroups: the adapter against fake v1 and v2 trees, the local backend with the fake, and
(where this host allows) the real kernel killing a node over its limit."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrover.autoscale import Resources
from dlrover.master.journal import JournalError
from dlrover.master.scheduler import (
    CgroupMemoryGroups,
    FakeMemoryGroups,
    LocalScheduler,
    MemoryGroup,
    NodeSpec,
    ObservedState,
    SchedulerError,
    UnavailableMemoryGroups,
    detect_memory_groups,
)

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024


def kernel_rmdir(path: Path) -> None:
    """What the kernel's rmdir does to a cgroup: refuses while processes remain, drops the control files."""
    procs = path / "cgroup.procs"
    if procs.exists() and procs.read_text().split():
        raise OSError(16, "Device or resource busy", str(path))  # EBUSY
    shutil.rmtree(path)


def fake_tree(tmp_path: Path, version: int) -> tuple[Path, Path, Path]:
    """A cgroup mount with this process in /jobs/me: (mount, /proc/self/cgroup, /proc/self/mountinfo)."""
    mount = tmp_path / "sys-fs-cgroup"
    own = mount / "jobs" / "me"
    own.mkdir(parents=True)
    cgroup = tmp_path / "cgroup"
    mountinfo = tmp_path / "mountinfo"
    if version == 1:
        cgroup.write_text("5:cpu,cpuacct:/\n4:memory:/jobs/me\n0::/\n")
        mountinfo.write_text(
            f"30 25 0:26 / {tmp_path}/sys-fs-cgroup-cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
            f"31 25 0:27 / {mount} rw,relatime - cgroup cgroup rw,memory\n"
        )
    else:
        cgroup.write_text("0::/jobs/me\n")
        mountinfo.write_text(f"31 25 0:27 / {mount} rw,relatime - cgroup2 cgroup2 rw\n")
        (own / "cgroup.controllers").write_text("cpu memory pids\n")
    return mount, cgroup, mountinfo


class KernelLikeGroups(CgroupMemoryGroups):
    """A fake tree whose new groups get the files the kernel would create."""

    def create(self, name: str, limit_mb: int):  # type: ignore[no-untyped-def]
        group = super().create(name, limit_mb)
        path = Path(group.path)
        (path / "cgroup.procs").write_text("")
        if self.version == 1:
            (path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
        else:
            (path / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
            (path / "cgroup.controllers").write_text("memory\n")
        return group


@pytest.mark.parametrize(("version", "limit_file", "oom_file"), [(1, "memory.limit_in_bytes", "memory.oom_control"),
                                                                 (2, "memory.max", "memory.events")])  # fmt: skip
def test_a_group_is_limited_counts_oom_kills_and_is_removed_once_empty(
    tmp_path: Path, version: int, limit_file: str, oom_file: str
) -> None:
    groups = KernelLikeGroups(version, tmp_path, rmdir=kernel_rmdir)
    group = groups.create("dlrover-1-node-0", 300)
    path = Path(group.path)
    assert (path / limit_file).read_text() == f"{300 * MIB}\n"
    assert groups.oom_kills(group) == 0
    (path / oom_file).write_text((path / oom_file).read_text().replace("oom_kill 0", "oom_kill 2"))
    assert groups.oom_kills(group) == 2
    (path / "cgroup.procs").write_text("4242\n4243\n")
    assert groups.pids(group) == [4242, 4243]
    assert groups.remove(group) is False  # processes remain: the kernel refuses
    assert path.exists()
    (path / "cgroup.procs").write_text("")
    assert groups.remove(group) is True
    assert not path.exists()
    assert groups.remove(group) is True  # already gone
    assert groups.oom_kills(group) is None
    assert groups.join_argv(group, ["agent", "--x"])[-2:] == ["agent", "--x"]
    assert groups.adopt(group.name, group.path, 300) == group  # a restarted master's view of it
    with pytest.raises(ValueError, match="is not 'dlrover-1-node-0' under"):
        groups.adopt(group.name, "/sys/fs/cgroup/memory/elsewhere", 300)


def test_bad_names_and_limits_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    groups = CgroupMemoryGroups(1, tmp_path, rmdir=kernel_rmdir)
    with pytest.raises(ValueError, match=r"'\.\./escape'"):
        groups.create("../escape", 100)
    with pytest.raises(ValueError, match="got 0"):
        groups.create("n", 0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("version", [1, 2])
def test_detection_finds_the_own_group_and_proves_it_with_a_probe(tmp_path: Path, version: int) -> None:
    mount, cgroup, mountinfo = fake_tree(tmp_path, version)
    made: list[str] = []

    def rmdir(path: Path) -> None:
        made.append(path.name)
        kernel_rmdir(path)

    # A plain directory gets no control files, so the probe finds no oom_kill count: it says so.
    found = detect_memory_groups(proc_cgroup=cgroup, mountinfo=mountinfo, probe_name="probe", rmdir=rmdir)
    assert isinstance(found, UnavailableMemoryGroups)
    if version == 1:
        assert "record no oom_kill count" in found.reason
    else:
        assert "not delegated to children" in found.reason
    assert made == ["probe"]  # the probe was removed again
    assert not (mount / "jobs" / "me" / "probe").exists()


def test_detection_says_why_when_there_is_no_memory_controller(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("5:cpu:/\n")
    (tmp_path / "mountinfo").write_text("")
    found = detect_memory_groups(proc_cgroup=tmp_path / "cgroup", mountinfo=tmp_path / "mountinfo")
    assert isinstance(found, UnavailableMemoryGroups)
    assert (
        found.describe() == "memory limits are not enforced: this process is in no memory cgroup (no memory controller)"
    )
    (tmp_path / "cgroup").write_text("4:memory:/a\n")
    found = detect_memory_groups(proc_cgroup=tmp_path / "cgroup", mountinfo=tmp_path / "mountinfo")
    assert isinstance(found, UnavailableMemoryGroups)
    assert "cgroup v1 memory hierarchy is not mounted" in found.reason
    found = detect_memory_groups(proc_cgroup=tmp_path / "missing", mountinfo=tmp_path / "mountinfo")
    assert isinstance(found, UnavailableMemoryGroups)
    assert "cannot be read" in found.reason
    # A group outside this cgroup namespace's view: the directory its path leads to is another's.
    (tmp_path / "cgroup").write_text("4:memory:/../../other\n")
    found = detect_memory_groups(proc_cgroup=tmp_path / "cgroup", mountinfo=tmp_path / "mountinfo")
    assert isinstance(found, UnavailableMemoryGroups)
    assert "outside this cgroup namespace's view" in found.reason


def test_v2_without_the_memory_controller_is_unusable(tmp_path: Path) -> None:
    mount, cgroup, mountinfo = fake_tree(tmp_path, 2)
    (mount / "jobs" / "me" / "cgroup.controllers").write_text("cpu pids\n")
    found = detect_memory_groups(proc_cgroup=cgroup, mountinfo=mountinfo)
    assert isinstance(found, UnavailableMemoryGroups)
    assert "memory controller is not enabled" in found.reason


# ------------------------------------------------------------------ the local backend with the fake


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def spec(node_id: int, memory_mb: int | None) -> NodeSpec:
    resources = None if memory_mb is None else Resources(cpu=1, memory_mb=memory_mb)
    return NodeSpec("job", node_id, node_id, resources=resources)


def test_local_backend_gives_each_node_with_memory_its_own_group_and_removes_it() -> None:
    groups = FakeMemoryGroups()
    backend = LocalScheduler(SLEEPER, stop_grace_s=1.0, memory_groups=groups)
    try:
        assert backend.enforces_memory
        backend.launch(spec(0, 300))
        backend.launch(spec(1, None))  # asks for nothing: no group, no limit
        assert [(g.name.endswith("-node-0"), g.limit_mb) for g in groups.created] == [(True, 300)]
        assert backend.memory_record(1) is None
        record = backend.memory_record(0)
        assert record is not None
        assert (record.limit_mb, record.oom_kills) == (300, 0)
        name = groups.created[0].name
        groups.oom(name)
        assert backend.memory_record(0).oom_kills == 1  # type: ignore[union-attr]
        groups.members[name] = [123]
        backend.stop(0)
        wait_for(lambda: backend.observe()[0].state is ObservedState.STOPPED)
        assert name in groups.groups  # a process is left in it: kept, tried again later
        groups.members[name] = []
        backend.observe()
        assert groups.removed == [name]
        assert backend.memory_record(0).oom_kills == 1  # type: ignore[union-attr]  # the record outlives the group
    finally:
        backend.close()
    assert groups.groups == {}


def test_a_node_whose_group_cannot_be_made_is_not_started() -> None:
    class Refusing(FakeMemoryGroups):
        def create(self, name: str, limit_mb: int):  # type: ignore[no-untyped-def]
            raise PermissionError(13, "Permission denied")

    backend = LocalScheduler(SLEEPER, memory_groups=Refusing())
    try:
        with pytest.raises(SchedulerError, match=r"memory group of node 0 \(300 MiB\).*Permission denied"):
            backend.launch(spec(0, 300))
        assert backend.observe() == {}
    finally:
        backend.close()


def test_a_group_that_cannot_be_removed_after_a_failed_start_does_not_hide_why_it_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Stuck(FakeMemoryGroups):
        def remove(self, group: MemoryGroup) -> bool:
            raise PermissionError(13, "Permission denied")

    groups = Stuck()
    backend = LocalScheduler(["/nonexistent/agent"], memory_groups=groups)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="dlrover.master.scheduler.local"),
            pytest.raises(SchedulerError, match=r"cannot start node 0 .*No such file"),
        ):
            backend.launch(spec(0, 300))
        assert any("cannot be removed: [Errno 13] Permission denied" in r.getMessage() for r in caplog.records)
        assert backend.observe() == {}
    finally:
        backend.close()


def test_memory_groups_survive_a_master_restart_through_the_backend_state() -> None:
    groups = FakeMemoryGroups()
    first = LocalScheduler(SLEEPER, stop_grace_s=1.0, memory_groups=groups)
    first.launch(spec(0, 512))
    version, data = first.export_state()
    # A journal is not trusted to name a directory to remove: a group elsewhere is refused, nothing changes.
    forged = LocalScheduler(SLEEPER, memory_groups=groups)
    with pytest.raises(JournalError, match="'fake:elsewhere' is not"):
        forged.import_state(version, data.replace(groups.created[0].path, "fake:elsewhere"))
    assert forged.observe() == {}
    forged.close()
    second = LocalScheduler(SLEEPER, stop_grace_s=1.0, memory_groups=groups)
    second.import_state(version, data)
    record = second.memory_record(0)
    assert record is not None
    assert record.limit_mb == 512
    second.close()  # stops the adopted agent and removes its group
    first.close()
    assert groups.groups == {}
    # A state written before memory groups existed still loads.
    old = LocalScheduler(SLEEPER, memory_groups=groups)
    old.import_state(1, '{"format":"dlrover.master.local","version":1,"nodes":{}}')
    old.close()


def test_without_groups_the_backend_says_nothing_is_enforced() -> None:
    backend = LocalScheduler(SLEEPER, memory_groups=UnavailableMemoryGroups("no memory controller here"))
    try:
        assert not backend.enforces_memory
        assert backend.memory_enforcement == "memory limits are not enforced: no memory controller here"
        backend.launch(spec(0, 300))  # runs, unlimited
        assert backend.memory_record(0) is None
    finally:
        backend.close()


# ------------------------------------------------------------------ the real kernel


def usable_groups() -> CgroupMemoryGroups:
    found = detect_memory_groups()
    if isinstance(found, UnavailableMemoryGroups):
        pytest.skip(f"memory cgroups are not usable on this host: {found.reason}")
    return found


@pytest.mark.integration
def test_the_kernel_kills_a_node_over_its_limit_and_the_group_records_it(tmp_path: Path) -> None:
    groups = usable_groups()
    hog = "b = bytearray(200 * 1024 * 1024); print(len(b))"
    backend = LocalScheduler([sys.executable, "-c", hog], stop_grace_s=1.0, memory_groups=groups)
    try:
        backend.launch(spec(0, 100))
        wait_for(lambda: backend.observe()[0].state is not ObservedState.RUNNING)
        seen = backend.observe()[0]
        assert (seen.state, seen.exit_code) == (ObservedState.FAILED, -9)
        record = backend.memory_record(0)
        assert record is not None
        assert record.oom_kills == 1
        assert record.limit_mb == 100
        wait_for(lambda: not Path(record.source).exists())  # removed once its process is gone
    finally:
        backend.close()
    assert not [p for p in groups.parent.iterdir() if p.name.startswith(f"dlrover-{os.getpid()}-")]


@pytest.mark.integration
def test_close_kills_what_is_left_in_a_group_and_removes_it() -> None:
    groups = usable_groups()
    # The agent starts a worker in a session of its own (out of reach of the agent's process group) and exits.
    escape = (
        "import subprocess, sys; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)"
    )
    backend = LocalScheduler([sys.executable, "-c", escape], stop_grace_s=1.0, memory_groups=groups)
    backend.launch(spec(0, 200))
    wait_for(lambda: backend.observe()[0].state is ObservedState.SUCCEEDED)
    record = backend.memory_record(0)
    assert record is not None
    left = [int(p) for p in (Path(record.source) / "cgroup.procs").read_text().split()]
    assert len(left) == 1
    backend.close()
    assert not Path(record.source).exists()
    wait_for(lambda: not Path(f"/proc/{left[0]}").exists() or _zombie(left[0]))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("joinable", [True, False])
def test_the_probe_starts_a_process_in_its_group_and_names_a_group_nobody_can_join(
    tmp_path: Path, joinable: bool
) -> None:
    from dlrover.master.scheduler.cgroups import _probe

    class CountingGroups(CgroupMemoryGroups):
        """A fake tree whose groups count OOM kills, so the probe goes on to join one."""

        def create(self, name: str, limit_mb: int) -> MemoryGroup:
            group = super().create(name, limit_mb)
            if not joinable:  # a cgroup.procs nobody can write (the kernel's EBUSY or EACCES)
                (Path(group.path) / "cgroup.procs").mkdir()
            return group

        def oom_kills(self, group: MemoryGroup) -> int | None:
            return 0

    def rmdir(path: Path) -> None:
        shutil.rmtree(path)

    problem = _probe(CountingGroups(1, tmp_path, rmdir=rmdir), "probe")
    if joinable:
        assert problem == ""
        assert (tmp_path / "probe").exists() is False
    else:
        assert problem.startswith(f"a process cannot join a child group of {tmp_path}: dlrover: cannot join"), problem
    assert list(tmp_path.iterdir()) == []
