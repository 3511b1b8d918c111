"""The host's OOM records (`OomWatch`) read from faked cgroup and kernel-log files, and the rule
that turns them into a host OOM verdict where the log alone says only SIGKILL."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover.diagnosis import (
    MEMORY_RECORD,
    NO_OOM_KILL,
    Evidence,
    FailureKind,
    OomCount,
    OomWatch,
    RuleRegistry,
    classify,
)
from dlrover.diagnosis.oomrecord import parse_oom_kills

EVENTS_V2 = "low 0\nhigh 0\nmax 12\noom {oom}\noom_kill {kills}\noom_group_kill 0\n"


def _cgroup_v2(root: Path, kills: int) -> None:
    (root / "memory.events").write_text(EVENTS_V2.format(oom=kills, kills=kills))


def test_parse_reads_the_oom_kill_line_only() -> None:
    assert parse_oom_kills(EVENTS_V2.format(oom=9, kills=4)) == 4
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n") == 2
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\n") is None


def test_count_reads_cgroup_v2_then_v1(tmp_path: Path) -> None:
    watch = OomWatch(cgroup_root=tmp_path, kmsg=tmp_path / "absent", own_cgroups=tmp_path / "no-self")
    assert watch.count() is None
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert watch.count() == OomCount(3, str(tmp_path / "memory" / "memory.oom_control"))
    _cgroup_v2(tmp_path, 1)
    assert watch.count() == OomCount(1, str(tmp_path / "memory.events"))


def test_a_risen_counter_and_the_kernel_line_become_evidence(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,100,5000,-;eth0: link up\n"
        "3,101,6000,-;Out of memory: Killed process 4242 (python) total-vm:9000kB, anon-rss:8000kB\n"
        "3,102,7000,-;Out of memory: Killed process 77 (other) total-vm:10kB\n"
    )
    watch = OomWatch(cgroup_root=tmp_path, kmsg=kmsg, own_cgroups=tmp_path / "no-self")
    _cgroup_v2(tmp_path, 0)
    before = watch.count()
    _cgroup_v2(tmp_path, 1)
    lines = watch.evidence(before, [4242])
    assert len(lines) == 2
    assert all(line.startswith(MEMORY_RECORD + ": ") for line in lines)
    assert "rose from 0 to 1" in lines[0]
    assert "Killed process 4242" in lines[1]
    assert "77" not in lines[1]


def test_unreadable_records_say_nothing_and_an_unchanged_count_says_no_kill(tmp_path: Path) -> None:
    watch = OomWatch(cgroup_root=tmp_path, kmsg=tmp_path / "absent", own_cgroups=tmp_path / "no-self")
    assert watch.evidence(None, [1]) == []
    assert watch.evidence(OomCount(0, str(tmp_path / "memory.events")), [1]) == []  # unreadable now
    _cgroup_v2(tmp_path, 5)
    assert watch.evidence(None, [1]) == []  # not read when the workers started: nothing to compare
    (line,) = watch.evidence(watch.count(), [1])
    assert line.startswith(NO_OOM_KILL + ": ")
    assert "stayed at 5" in line
    unreadable = tmp_path / "kmsg"
    unreadable.mkdir()  # reading a directory fails: soft
    assert OomWatch(cgroup_root=tmp_path, kmsg=unreadable, own_cgroups=tmp_path / "no-self").kernel_kills([]) == []


def test_a_sigkill_is_someone_elses_only_where_the_records_were_read_and_show_no_kill(tmp_path: Path) -> None:
    registry = RuleRegistry.with_builtin_rules()
    log = "step 1200 loss 2.31\nstep 1201 loss 2.30\n"
    unrecorded = classify(Evidence.from_text(log, returncode=-9), registry)
    assert (unrecorded.kind, unrecorded.rule) == (FailureKind.HOST_OOM, "sigkill-exit-unrecorded")
    watch = OomWatch(cgroup_root=tmp_path, kmsg=tmp_path / "absent", own_cgroups=tmp_path / "no-self")
    _cgroup_v2(tmp_path, 3)
    read = log + "\n".join(watch.evidence(watch.count(), [99]))
    diagnosis = classify(Evidence.from_text(read, returncode=-9), registry)
    assert (diagnosis.kind, diagnosis.rule) == (FailureKind.KILLED, "sigkill-exit")
    # The no-kill line is no memory record of a kill, whatever else the log says.
    assert classify(Evidence.from_text(read, returncode=1), registry).kind is FailureKind.UNKNOWN


def test_the_record_turns_a_plain_sigkill_into_a_host_oom(tmp_path: Path) -> None:
    registry = RuleRegistry.with_builtin_rules()
    log = "step 1200 loss 2.31\nstep 1201 loss 2.30\n"
    watch = OomWatch(cgroup_root=tmp_path, kmsg=tmp_path / "absent", own_cgroups=tmp_path / "no-self")
    _cgroup_v2(tmp_path, 0)
    before = watch.count()
    _cgroup_v2(tmp_path, 2)
    recorded = log + "\n".join(watch.evidence(before, [99]))
    diagnosis = classify(Evidence.from_text(recorded, returncode=-9), registry)
    assert diagnosis.kind is FailureKind.HOST_OOM
    assert diagnosis.rule == "host-memory-record"
    assert "oom_kill count rose from 0 to 2" in diagnosis.lines[-1]


@pytest.mark.parametrize(
    ("own", "counter", "text"),
    [
        ("0::/user.slice/job.scope\n", "user.slice/job.scope/memory.events", "oom 0\noom_kill 4\n"),
        ("12:cpu,cpuacct:/x\n11:memory:/job/node-1\n", "memory/job/node-1/memory.oom_control", "oom_kill 4\n"),
        ("11:cpu,memory:/job/n\n1:name=systemd:/s\n", "cpu,memory/job/n/memory.oom_control", "oom_kill 4\n"),
    ],
)
def test_the_agents_own_cgroup_is_read_before_the_mounts_root(
    tmp_path: Path, own: str, counter: str, text: str
) -> None:
    (tmp_path / "self-cgroup").write_text(own)
    _cgroup_v2(tmp_path, 1)  # the root's (a container's namespace root): read only when the own one is not there
    watch = OomWatch(
        cgroup_root=tmp_path,
        kmsg=tmp_path / "absent",
        own_cgroups=tmp_path / "self-cgroup",
    )
    assert watch.count() == OomCount(1, str(tmp_path / "memory.events"))
    path = tmp_path / counter
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert watch.count() == OomCount(4, str(path))


def test_a_cgroup_path_outside_the_namespace_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "self-cgroup").write_text("0::/../../escape\n")
    watch = OomWatch(cgroup_root=tmp_path / "mnt", kmsg=tmp_path / "absent", own_cgroups=tmp_path / "self-cgroup")
    assert watch._own_paths() == []


def test_a_kill_a_wrapper_reports_is_no_oom_kill_where_the_records_show_none(tmp_path: Path) -> None:
    registry = RuleRegistry.with_builtin_rules()
    log = "step 1200 loss 2.31\n./train.sh: line 12: 40211 Killed                  python train.py\n"
    assert classify(Evidence.from_text(log, returncode=1), registry).kind is FailureKind.HOST_OOM  # no record read
    watch = OomWatch(cgroup_root=tmp_path, kmsg=tmp_path / "absent", own_cgroups=tmp_path / "no-self")
    _cgroup_v2(tmp_path, 0)
    read = log + "\n".join(watch.evidence(watch.count(), [40211]))
    assert classify(Evidence.from_text(read, returncode=1), registry).kind is not FailureKind.HOST_OOM
