"""Reading /proc/<pid>/cgroup: v2 and v1 lines, paths outside the namespace, malformed lines."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from dlrover.common import CgroupMembership, own_memberships, parse_memberships

V1_AND_V2 = """12:name=systemd:/user.slice
4:memory:/slurm/uid_0/job_7/step_0
3:cpu,cpuacct:/slurm/uid_0/job_7
0::/
"""


def test_v1_and_v2_lines_are_read_with_their_controllers() -> None:
    members = parse_memberships(V1_AND_V2)
    assert [(m.hierarchy, m.controllers, m.path) for m in members] == [
        ("12", ("name=systemd",), "/user.slice"),
        ("4", ("memory",), "/slurm/uid_0/job_7/step_0"),
        ("3", ("cpu", "cpuacct"), "/slurm/uid_0/job_7"),
        ("0", (), "/"),
    ]
    memory, cpu, unified = members[1], members[2], members[3]
    assert memory.has("memory")
    assert not memory.unified
    assert cpu.has("cpu")
    assert cpu.has("cpuacct")
    assert not cpu.has("memory")
    assert unified.unified
    assert unified.relative() == PurePosixPath(".")


def test_a_group_s_directories_run_from_it_up_to_the_mount() -> None:
    member = CgroupMembership("0", (), "/kubepods/pod1/ctr")
    mount = Path("/sys/fs/cgroup")
    assert member.relative() == PurePosixPath("kubepods/pod1/ctr")
    assert member.directories(mount) == [
        mount / "kubepods/pod1/ctr",
        mount / "kubepods/pod1",
        mount / "kubepods",
        mount,
    ]
    assert CgroupMembership("0", (), "/").directories(mount) == [mount]


def test_a_path_outside_the_namespace_s_view_names_no_directory() -> None:
    for path in ("/../../system.slice/other", "/a/../b", "relative/path"):
        member = CgroupMembership("0", (), path)
        assert member.relative() is None, path
        assert member.directories(Path("/sys/fs/cgroup")) == [], path


def test_malformed_lines_are_skipped_and_an_unreadable_file_is_no_membership(tmp_path: Path) -> None:
    assert parse_memberships("garbage\n\n1:cpu\n0::/x\n") == [CgroupMembership("0", (), "/x")]
    assert own_memberships(tmp_path / "missing") == []
    listed = tmp_path / "cgroup"
    listed.write_text(V1_AND_V2)
    assert own_memberships(listed) == parse_memberships(V1_AND_V2)


def test_a_group_name_that_is_not_utf8_reads_without_raising(tmp_path: Path) -> None:
    listed = tmp_path / "cgroup"
    listed.write_bytes(b"0::/a\xff/b\n4:memory:/ok\n")
    members = own_memberships(listed)
    assert [m.hierarchy for m in members] == ["0", "4"]
    assert members[1].path == "/ok"
