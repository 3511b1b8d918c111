"""Roles and resources in the master: node groups, the launch request, the journal, host-OOM relaunches with
more memory, the kernel's OOM record as evidence, and resources no node can have."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest

from dlrover.autoscale import Resources, Role
from dlrover.common import ConfigError, ManualClock
from dlrover.diagnosis import NO_OOM_KILL, ActionKind, FailureKind
from dlrover.master.cli import _run_parser, build_config
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeGroup, NodeRange
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.factory import create_master
from dlrover.master.journal import Blob, JournalBatch, JournalError, MemoryJournal, SqliteJournal, job_fields
from dlrover.master.lifecycle import JobLifecycle
from dlrover.master.master import Master
from dlrover.master.oom_evidence import OOM_EVIDENCE_BLOB, OomEvidenceLedger
from dlrover.master.records import LaunchNode, NodeRecord, node_from_dict, node_to_dict
from dlrover.master.resource_flags import resources_from_flags
from dlrover.master.scheduler.base import MemoryRecord, ObservedState, check_node_fits
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import JobState, NodeState

pytestmark = pytest.mark.timeout(120)

SMALL = Resources(cpu=1, memory_mb=300)


def lifecycle(resources: Resources | None = SMALL, *, relaunches: bool = True, **kw: object) -> JobLifecycle:
    cfg = LifecycleConfig(nodes=NodeRange(1, 1), node_resources=resources, **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, DiagnosisFailurePolicy(), 0.0, scheduler_relaunches=relaunches)
    life.start(0.0)
    return life


def current(life: JobLifecycle) -> NodeRecord:
    return life.current_nodes()[0]


def oom(life: JobLifecycle, now: float) -> tuple[ActionKind, list[dict[str, object]], tuple[LaunchNode, ...]]:
    node = current(life)
    if node.state is NodeState.PENDING:
        life.register(node.node_id, "a", "h", now)
    decision, out = life.report_failure(node.node_id, FailureKind.HOST_OOM, "killed", now + 1)
    events = [dict(e.data, message=e.message) for e in out.events if e.kind == "oom_relaunch"]
    launches = tuple(e for e in out.effects if isinstance(e, LaunchNode))
    return decision.action, events, launches


# ---------------------------------------------------------------------------------------------- config


def test_the_job_is_one_worker_group_from_nodes_and_node_resources() -> None:
    cfg = LifecycleConfig(nodes=NodeRange(1, 3), node_resources=SMALL)
    assert cfg.worker_group == NodeGroup(Role.WORKER, NodeRange(1, 3), SMALL)
    assert cfg.groups == (cfg.worker_group,)
    assert LifecycleConfig().worker_group == NodeGroup()  # none asked: one worker, no resources
    with pytest.raises(ConfigError, match=r"oom_memory_growth must be a finite number >= 1, got 0\.5"):
        LifecycleConfig(oom_memory_growth=0.5)
    with pytest.raises(ConfigError, match="node memory 300 MiB exceeds max_node_memory_mb 200"):
        LifecycleConfig(node_resources=SMALL, max_node_memory_mb=200)
    with pytest.raises(ConfigError, match=r"node_resources must be dlrover\.autoscale\.Resources"):
        LifecycleConfig(node_resources={"cpu": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_node_memory_mb must be None or a whole number"):
        LifecycleConfig(max_node_memory_mb=0)


# -------------------------------------------------------------------------------------- launch and journal


def test_nodes_are_launched_with_their_group_role_and_resources() -> None:
    sched = FakeScheduler()
    cfg = MasterConfig(job_name="t", lifecycle=LifecycleConfig(nodes=NodeRange(1, 2), node_resources=SMALL))
    master = Master(cfg, sched, MemoryJournal(), ManualClock())
    master.start()
    assert [(s.role, s.resources) for s in sched.specs.values()] == [(Role.WORKER, SMALL)] * 2
    assert master.node(0).resources == SMALL


def test_a_node_record_round_trips_with_its_resources_and_an_old_one_still_loads(tmp_path: Path) -> None:
    h100 = Resources(cpu=8, memory_mb=65536, gpu=8, gpu_type="nvidia-h100")
    life = lifecycle(h100)
    node = current(life)
    assert node_from_dict(node_to_dict(node)) == node
    old = node_to_dict(node)
    del old["role"], old["resources"]  # written before roles and resources were journaled
    assert node_from_dict(old) == attrs.evolve(node, resources=None)
    journal = SqliteJournal(tmp_path / "state")
    try:
        snap = life.snapshot()
        journal.commit(JournalBatch(nodes=snap.nodes, job=job_fields(snap)))
        restored = journal.load().lifecycle
        assert restored is not None
        assert restored.nodes[0].resources == h100
    finally:
        journal.close()
    with pytest.raises(Exception, match="corrupt node record"):
        node_from_dict({**node_to_dict(node), "resources": {"cpu": 1}})


def test_a_restored_lifecycle_relaunches_with_the_grown_memory() -> None:
    life = lifecycle()
    oom(life, 1.0)
    grown = current(life).resources
    restored = JobLifecycle(life.config, DiagnosisFailurePolicy(), 0.0, life.snapshot())
    assert current(restored).resources == grown == Resources(cpu=1, memory_mb=450)


# ------------------------------------------------------------------------------------ host OOM relaunches


def test_host_oom_relaunches_with_more_memory_and_says_why_with_its_inputs() -> None:
    life = lifecycle()
    action, events, launches = oom(life, 1.0)
    assert action is ActionKind.RELAUNCH_WITH_MORE_MEMORY
    assert [launch.resources for launch in launches] == [Resources(cpu=1, memory_mb=450)]
    (event,) = events
    assert event["memory_mb"] == 300
    assert event["new_memory_mb"] == 450
    assert event["growth_factor"] == 1.5
    assert event["max_node_memory_mb"] is None
    assert "ran out of memory at 300 MiB; relaunching with 450 MiB" in str(event["message"])
    assert current(life).resources == Resources(cpu=1, memory_mb=450)


def test_the_growth_factor_is_configurable_and_capped_then_the_job_stops_at_the_cap() -> None:
    life = lifecycle(oom_memory_growth=2.0, max_node_memory_mb=500)
    _, events, launches = oom(life, 1.0)
    assert launches[0].resources == Resources(cpu=1, memory_mb=500)
    assert "relaunching with 500 MiB (capped)" in str(events[0]["message"])
    action, events, launches = oom(life, 5.0)
    assert action is ActionKind.ABORT_JOB
    assert launches == ()
    assert life.job_state is JobState.FAILED
    assert "ran out of memory at 500 MiB, already at max_node_memory_mb 500" in life.exit_reason
    assert "not relaunched; the job stops" in str(events[0]["message"])


def test_a_node_without_a_memory_limit_is_relaunched_as_it_was_and_the_event_says_so() -> None:
    life = lifecycle(None)
    action, events, launches = oom(life, 1.0)
    assert action is ActionKind.RELAUNCH_WITH_MORE_MEMORY
    assert launches[0].resources is None
    assert "no memory limit" in str(events[0]["message"])
    assert "no growth possible" in str(events[0]["message"])
    assert events[0]["new_memory_mb"] is None


def test_other_relaunches_keep_the_size_a_node_grew_to() -> None:
    life = lifecycle()
    oom(life, 1.0)
    node = current(life)
    life.register(node.node_id, "a", "h2", 3.0)
    life.node_lost(node.node_id, "the agent exited with status -9", 4.0)
    assert current(life).resources == Resources(cpu=1, memory_mb=450)


def test_a_backend_that_starts_no_node_cannot_add_memory_and_says_so() -> None:
    life = lifecycle(relaunches=False)
    life.register(0, "a", "h", 1.0)
    # An agent that stays restarts its workers in place; one that exits leaves the rank to a new agent.
    decision, out = life.report_failure(0, FailureKind.HOST_OOM, "killed", 2.0, agent_exits=True)
    assert decision.action is ActionKind.RELAUNCH_WITH_MORE_MEMORY
    (event,) = [e for e in out.events if e.kind == "oom_relaunch"]
    assert "starts no node itself, so no memory can be added" in event.message


# ----------------------------------------------------------------------- the kernel's record as evidence


class RecordingScheduler(FakeScheduler):
    """A fake backend that limits node memory and shows an OOM record."""

    memory_enforcement = "memory limits are enforced by a test"
    enforces_memory = True

    def __init__(self) -> None:
        super().__init__()
        self.kills: dict[int, int] = {}

    def memory_record(self, node_id: int) -> MemoryRecord | None:
        spec = self.specs.get(node_id)
        if spec is None or spec.resources is None:
            return None
        return MemoryRecord(spec.resources.memory_mb, self.kills.get(node_id, 0), f"/cg/node-{node_id}")

    def largest_node(self) -> Resources:
        return Resources(cpu=2, memory_mb=1000)


def recording_master(**lifecycle_kw: object) -> tuple[Master, RecordingScheduler]:
    sched = RecordingScheduler()
    cfg = MasterConfig(
        job_name="t",
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), node_resources=SMALL, **lifecycle_kw),  # type: ignore[arg-type]
    )
    master = Master(cfg, sched, MemoryJournal(), ManualClock(), policy=DiagnosisFailurePolicy())
    master.start()
    return master, sched


def events_of(master: Master, kind: str) -> list[Mapping[str, object]]:
    return [{"message": e.message, **e.data} for e in master.events() if e.kind == kind]


def test_a_worker_sigkill_with_the_groups_oom_count_is_host_oom_from_the_kernels_record() -> None:
    master, sched = recording_master()
    assert events_of(master, "memory_limits")[0]["message"] == "memory limits are enforced by a test"
    master.register(0, "a", "h")
    sched.kills[0] = 1
    decision = master.report_failure(0, FailureKind.UNKNOWN, "worker 0 exited with -9", exit_code=-9)
    assert decision.kind is FailureKind.HOST_OOM
    assert decision.action is ActionKind.RELAUNCH_WITH_MORE_MEMORY
    (failure,) = events_of(master, "failure")
    assert "the node's memory cgroup counted oom_kill 0 -> 1 (limit 300 MiB, /cg/node-0)" in str(failure["evidence"])
    assert sched.specs[1].resources == Resources(cpu=1, memory_mb=450)


def test_an_oom_report_the_journal_refused_still_carries_the_record_when_it_comes_again() -> None:
    class FailingJournal(MemoryJournal):
        failing = False

        def commit(self, batch: JournalBatch) -> tuple[int, ...]:
            if self.failing and not batch.empty:
                raise JournalError("cannot write the journal: disk full (test)")
            return super().commit(batch)

    sched = RecordingScheduler()
    journal = FailingJournal()
    cfg = MasterConfig(job_name="t", lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), node_resources=SMALL))
    master = Master(cfg, sched, journal, ManualClock(), policy=DiagnosisFailurePolicy())
    master.start()
    master.register(0, "a", "h")
    sched.kills[0] = 1
    journal.failing = True
    with pytest.raises(JournalError):
        master.report_failure(0, FailureKind.UNKNOWN, "worker 0 exited with -9", exit_code=-9)
    journal.failing = False
    decision = master.report_failure(0, FailureKind.UNKNOWN, "worker 0 exited with -9", exit_code=-9)
    assert decision.kind is FailureKind.HOST_OOM


def test_a_sigkill_whose_agent_read_no_oom_kill_is_not_called_host_oom() -> None:
    master, _ = recording_master()
    master.register(0, "a", "h")
    no_kill = f"{NO_OOM_KILL}: the memory cgroup's oom_kill count stayed at 0 while the workers ran (memory.events)"
    decision = master.report_failure(0, FailureKind.UNKNOWN, f"worker 0 exited with -9\n{no_kill}", exit_code=-9)
    assert decision.kind is FailureKind.KILLED


def test_an_agent_killed_for_memory_is_decided_as_host_oom_from_the_record() -> None:
    master, sched = recording_master()
    master.register(0, "a", "h")
    sched.kills[0] = 1
    sched.set_state(0, ObservedState.FAILED, exit_code=-9)
    master.tick()
    (failure,) = events_of(master, "failure")
    assert failure["kind"] == FailureKind.HOST_OOM.value
    assert sched.specs[1].resources == Resources(cpu=1, memory_mb=450)


def test_the_oom_cap_defaults_to_the_backends_largest_node() -> None:
    master, sched = recording_master()  # largest node: 1000 MiB
    for node_id, growth in ((0, 450), (1, 675), (2, 1000)):
        master.register(node_id, "a", "h")
        sched.kills[node_id] = 1
        master.report_failure(node_id, FailureKind.UNKNOWN, "exit -9", exit_code=-9)
        if growth == 1000:
            break
        assert sched.specs[node_id + 1].resources == Resources(cpu=1, memory_mb=growth)
    # The ladder allows two host-OOM relaunches per job: the third stops the job, with its reason.
    assert master.job_state is JobState.FAILED


def test_a_backend_that_cannot_enforce_memory_says_so_once_at_start() -> None:
    class Unlimited(RecordingScheduler):
        memory_enforcement = "memory limits are not enforced: no memory controller"
        enforces_memory = False

    sched = Unlimited()
    cfg = MasterConfig(job_name="t", lifecycle=LifecycleConfig(node_resources=SMALL))
    master = Master(cfg, sched, MemoryJournal(), ManualClock())
    master.start()
    master.start()
    (event,) = events_of(master, "memory_limits")
    assert event["message"] == (
        "memory limits are not enforced: no memory controller; the 300 MiB asked per node is recorded but not enforced"
    )
    assert event["enforced"] is False


# ------------------------------------------------------------------------------------------ bad input


def test_resources_no_node_can_have_are_refused_naming_the_value_and_nothing_is_launched() -> None:
    sched = RecordingScheduler()
    with pytest.raises(ConfigError, match=r"memory_mb 2048 > 1000") as info:
        check_node_fits(sched, Resources(cpu=1, memory_mb=2048))
    assert "largest node is 2cpu/1000MiB" in str(info.value)
    with pytest.raises(ConfigError, match=r"gpu 1 > 0"):
        check_node_fits(sched, Resources(cpu=1, memory_mb=10, gpu=1))
    check_node_fits(FakeScheduler(), Resources(cpu=1000, memory_mb=1 << 30))  # a backend that does not know
    cfg = MasterConfig(job_name="t", lifecycle=LifecycleConfig(node_resources=Resources(cpu=64, memory_mb=10)))
    with pytest.raises(ConfigError, match=r"cpu 64 > 2"):
        create_master(cfg, scheduler=sched)
    assert sched.specs == {}


def flags(*argv: str) -> argparse.Namespace:
    return _run_parser().parse_args(["--agent-command", "true", *argv])


def test_the_cli_takes_node_resources_and_none_at_all() -> None:
    lifecycle_cfg = build_config(flags()).lifecycle
    assert lifecycle_cfg.node_resources is None
    assert lifecycle_cfg.max_node_memory_mb is None
    given = build_config(
        flags("--node-cpu", "2.5", "--node-memory", "8Gi", "--node-gpus", "1", "--node-gpu-type", "nvidia-h100",
              "--max-node-memory", "32Gi", "--oom-memory-growth", "2")
    ).lifecycle  # fmt: skip
    assert given.node_resources == Resources(cpu=2.5, memory_mb=8192, gpu=1, gpu_type="nvidia-h100")
    assert (given.max_node_memory_mb, given.oom_memory_growth) == (32768, 2.0)
    assert build_config(flags("--node-memory", "512")).lifecycle.node_resources == Resources(cpu=0, memory_mb=512)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (("--node-memory", "8G"), r"--node-memory: memory size '8G' is not understood"),
        (("--node-memory", "0"), r"--node-memory: memory size '0' is below 1 MiB"),
        (("--node-cpu", "many"), r"--node-cpu must be a number, got 'many'"),
        (("--node-cpu", "-1"), r"--node-cpu must be a finite number >= 0, got '-1'"),
        (("--node-gpus", "1.5"), r"--node-gpus must be a whole number, got '1.5'"),
        (("--node-gpu-type", "nvidia-h100"), r"--node-gpu-type 'nvidia-h100' needs --node-gpus"),
        (("--node-gpus", "1", "--node-gpu-type", "a b"), r"'a b' is not an accelerator type"),
        (("--max-node-memory", "lots"), r"--max-node-memory: memory size 'lots'"),
        (("--oom-memory-growth", "0.9"), r"--oom-memory-growth must be >= 1, got '0.9'"),
        (("--node-memory", "8Gi", "--max-node-memory", "4Gi"), r"node memory 8192 MiB exceeds max_node_memory_mb"),
    ],
)
def test_malformed_resource_flags_are_refused_naming_the_value(argv: tuple[str, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_config(flags(*argv))


def test_resources_from_flags_is_none_when_nothing_is_asked() -> None:
    assert resources_from_flags(None, None, None, None) is None
    assert resources_from_flags(None, "1Gi", None, None) == Resources(cpu=0, memory_mb=1024)


def test_the_oom_kills_a_failure_used_are_journaled_with_it_so_a_restarted_master_does_not_reuse_them() -> None:
    sched = RecordingScheduler()
    journal = MemoryJournal()
    cfg = MasterConfig(job_name="t", lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), node_resources=SMALL))
    master = Master(cfg, sched, journal, ManualClock(), policy=DiagnosisFailurePolicy())
    master.start()
    master.register(0, "a", "h")
    sched.kills[0] = 2
    assert master.report_failure(0, FailureKind.UNKNOWN, "worker 0 exited with -9", exit_code=-9).kind is (
        FailureKind.HOST_OOM
    )
    ledger = OomEvidenceLedger.from_blob(journal.load().blobs.get(OOM_EVIDENCE_BLOB))
    assert (ledger.seen(0), ledger.unused(0, 2), ledger.unused(0, 3)) == (2, False, True)
    # A restarted master resumes from the journaled ledger and writes newer versions over it.
    restarted = Master(cfg, sched, journal, ManualClock(), policy=DiagnosisFailurePolicy())
    restarted.start()
    restarted.register(1, "b", "h")
    sched.kills[1] = 1
    assert restarted.report_failure(1, FailureKind.UNKNOWN, "worker 0 exited with -9", exit_code=-9).kind is (
        FailureKind.HOST_OOM
    )
    after = OomEvidenceLedger.from_blob(journal.load().blobs.get(OOM_EVIDENCE_BLOB))
    assert (after.seen(0), after.seen(1), after.version) == (2, 1, 2)


def test_the_oom_evidence_ledger_refuses_a_blob_it_cannot_read_naming_what_is_wrong() -> None:
    good = OomEvidenceLedger().using(3, 1)
    assert OomEvidenceLedger.from_blob(good.to_blob()) == good
    assert good.using(3, 1) is good  # nothing new: no new version to journal
    assert OomEvidenceLedger.from_blob(None) == OomEvidenceLedger()
    for data, match in [
        ("{", "not valid JSON"),
        ('{"format": "other"}', "not a 'dlrover.oom-evidence' document"),
        ('{"format": "dlrover.oom-evidence", "version": 2, "used": {}}', "version 2"),
        ('{"format": "dlrover.oom-evidence", "version": 1, "used": []}', "`used` must map"),
        ('{"format": "dlrover.oom-evidence", "version": 1, "used": {"x": 1}}', "bad entry 'x'"),
        ('{"format": "dlrover.oom-evidence", "version": 1, "used": {"1": true}}', "bad entry '1'"),
    ]:
        with pytest.raises(JournalError, match=match):
            OomEvidenceLedger.from_blob(Blob(1, data))


def test_a_spare_does_not_stand_in_for_a_node_grown_after_a_host_oom() -> None:
    life = lifecycle(spare_nodes=1)
    for node_id, node in sorted(life.nodes().items()):
        if node.state is NodeState.PENDING:
            life.register(node_id, f"agent-{node_id}", f"host-{node_id}", 0.0)
    spares = [n.node_id for n in life.spare_nodes()]
    assert spares
    assert all(life.node(n).resources == SMALL for n in spares)
    action, _, launches = oom(life, 1.0)
    # The spare has the group's 300 MiB: the rank needs 450, so a node is launched with that.
    assert action is ActionKind.RELAUNCH_WITH_MORE_MEMORY
    assert [launch.resources for launch in launches] == [Resources(cpu=1, memory_mb=450)]
    grown = current(life)
    life.register(grown.node_id, "agent-grown", "host-grown", 3.0)
    # The grown node is lost for another reason: its rank still needs 450 MiB, not the spare's 300.
    decision, out = life.node_lost(grown.node_id, "the agent exited with status -9 (failed)", 4.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert [e.resources for e in out.effects if isinstance(e, LaunchNode)] == [Resources(cpu=1, memory_mb=450)]
    assert [n.node_id for n in life.spare_nodes()] == spares  # the spare is still a spare
    assert not [e for e in out.events if e.kind == "spare_promoted"]
