"""The hosted rendezvous and shard libraries inside a Master: journaled, restored, released with failed nodes.

No gRPC here: the libraries are driven through `locked()`, the way the master's own calls reach them.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import attrs
import pytest

from dlrover.common import ManualClock
from dlrover.diagnosis import FailureKind
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.hosting import HostedRendezvous, HostedShards, node_of_worker
from dlrover.master.journal import Blob, ChangeLine, JournalError, MemoryJournal, SqliteJournal, StateJournal
from dlrover.master.master import Master, StatefulCollaborator
from dlrover.master.policy import FailurePolicy
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import NodeState
from dlrover.rendezvous import PollState, RendezvousManager
from dlrover.rendezvous.v1 import rendezvous_pb2 as rpb
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardRegistry, ShardStateError

SPEC = DatasetSpec(
    name="train", source=IndexSource(100), batch_size=5, batches_per_shard=2, delivery=DeliveryMode.EXACTLY_ONCE
)


def config(**kw: object) -> MasterConfig:
    return MasterConfig(
        job_name="hosting",
        lifecycle=LifecycleConfig(nodes=NodeRange(2, 3), heartbeat_timeout_s=10.0, insufficient_nodes_window_s=600.0),
        heartbeat_interval_s=1.0,
        state_export_interval_s=3600.0,
        rendezvous_last_call_s=1.0,
        **kw,  # type: ignore[arg-type]
    )


class Job:
    """A master with the hosted libraries, as `create_master` wires them, minus the server."""

    def __init__(
        self,
        journal: StateJournal,
        clock: ManualClock | None = None,
        *,
        coupled: bool = True,
        min_compaction_bytes: int = 1 << 20,
        policy: FailurePolicy | None = None,
        **kw: object,
    ) -> None:
        self.clock = clock or ManualClock()
        cfg = config(**kw)
        self.rendezvous = HostedRendezvous(RendezvousManager(cfg.rendezvous_config()), self.clock)
        self.shards = HostedShards(
            ShardRegistry(self.clock),
            journal_every_change=cfg.journal_shard_changes,
            min_compaction_bytes=min_compaction_bytes,
        )
        hosted = [self.rendezvous, self.shards]
        membership = hosted if coupled else []
        self.master = Master(
            cfg, FakeScheduler(), journal, self.clock, collaborators=hosted, membership=membership, policy=policy
        )
        for library in hosted:
            library.attach(self.master)
        self.master.start()

    def register_all(self) -> list[int]:
        ids = sorted(self.master.nodes())
        for node_id in ids:
            self.master.register(node_id, f"agent-{node_id}", f"host-{node_id}")
        return ids


def test_worker_ids_map_to_master_node_ids() -> None:
    assert node_of_worker("3") == 3
    assert node_of_worker("3/1") == 3
    assert node_of_worker("rank-3") is None
    assert node_of_worker("") is None
    assert node_of_worker("\uff13") is None  # a full-width 3 is not node 3


def test_a_failed_node_leaves_the_rendezvous_and_its_shards_go_back_at_the_acknowledged_position() -> None:
    job = Job(MemoryJournal())
    a, b, c = job.register_all()
    with job.rendezvous.locked() as m:
        for node in (a, b, c):
            m.join(str(node), job.clock.now())
        assert m.round_number == 1
        ranks = {n: m.poll(str(n), job.clock.now()).rank for n in (a, b, c)}
    assert sorted(ranks.values()) == [0, 1, 2]
    with job.shards.locked() as registry:
        registry.register(SPEC)
        held = registry.fetch("train", str(c)).shards[0]
        side = registry.fetch("train", f"{c}/1").shards[0]  # another process of node c
        other = registry.fetch("train", str(a)).shards[0]
        registry.report_progress("train", str(c), held.shard_id, 4)

    job.clock.advance(11.0)
    job.master.heartbeat(a)
    job.master.heartbeat(b)
    job.master.tick()  # c is silent: failed, relaunched

    assert job.master.node(c).state is NodeState.RELAUNCHING
    with job.rendezvous.locked() as m:
        now = job.clock.now()
        assert m.current_round is None
        assert m.num_nodes_waiting(now, str(a)) >= 1
        poll = m.poll(str(b), now)
        assert poll.state is PollState.NOT_WAITING
        assert f"'{c}' left" in poll.reason
    with job.shards.locked() as registry:
        snap = registry.manager("train").snapshot()
        assert held.shard_id in snap.todo
        assert side.shard_id in snap.todo
        assert snap.doing == {other.shard_id: str(a)}
        again = registry.fetch("train", str(b), count=2).shards
    assert {s.shard_id: s.consumed for s in again} == {held.shard_id: 4, side.shard_id: 0}


def test_a_process_restart_releases_the_nodes_shards_but_keeps_it_in_the_round() -> None:
    job = Job(MemoryJournal())
    a, b, _c = job.register_all()
    with job.rendezvous.locked() as m:
        for node in (a, b):
            m.join(str(node), job.clock.now())
        m.poll(str(a), job.clock.now() + 1.0)  # the last call for a third node passed
        assert m.round_number == 1
    with job.shards.locked() as registry:
        registry.register(SPEC)
        shard = registry.fetch("train", str(a)).shards[0]
    decision = job.master.report_failure(a, FailureKind.UNKNOWN, "NCCL watchdog timeout", exit_code=-6)
    assert decision.action.value == "restart_processes"
    with job.shards.locked() as registry:
        assert shard.shard_id in registry.manager("train").snapshot().todo
    with job.rendezvous.locked() as m:
        assert m.current_round is not None  # the restarted processes join again themselves


def test_only_failures_the_data_may_have_caused_count_an_attempt_against_the_shards_a_node_held() -> None:
    # max_attempts=1: a charged release sends the shard to the failed set, an uncharged one re-queues it.
    job = Job(MemoryJournal())
    a, b, c = job.register_all()
    with job.shards.locked() as registry:
        registry.register(attrs.evolve(SPEC, name="strict", max_attempts=1))
        on_a = registry.fetch("strict", str(a)).shards[0]
        on_b = registry.fetch("strict", str(b)).shards[0]
        on_c = registry.fetch("strict", str(c)).shards[0]
    # c goes silent (its node vanished: a preemption), b's workers break in their collective
    # (a network's or a peer's doing), a's crash in native code (the samples may be the cause).
    job.clock.advance(11.0)
    job.master.heartbeat(a)
    job.master.heartbeat(b)
    job.master.tick()
    assert job.master.node(c).state is NodeState.RELAUNCHING
    job.master.report_failure(b, FailureKind.COMMUNICATION, "NCCL watchdog caught collective operation timeout")
    decision = job.master.report_failure(a, FailureKind.NATIVE_CRASH, "Segmentation fault (core dumped)", exit_code=-11)
    assert decision.action.value == "restart_processes"
    with job.shards.locked() as registry:
        status = registry.manager("strict").status()
        snap = registry.manager("strict").snapshot()
    assert [f.shard.shard_id for f in status.failed_shards] == [on_a.shard_id]
    assert {on_b.shard_id, on_c.shard_id} <= set(snap.todo)


def test_a_hang_counts_an_attempt_against_the_shards_of_the_node_that_hung() -> None:
    # One pathological sample can stall a rank's input pipeline: handed out first again after every
    # restart, uncharged it would hang the job until its restart budget ran out.
    job = Job(MemoryJournal())
    a, _b, _c = job.register_all()
    with job.shards.locked() as registry:
        registry.register(attrs.evolve(SPEC, name="strict", max_attempts=1))
        on_a = registry.fetch("strict", str(a)).shards[0]
    decision = job.master.report_failure(a, FailureKind.HANG, "no step for 300 s; stacks dumped")
    assert decision.action.value == "restart_processes"
    with job.shards.locked() as registry:
        status = registry.manager("strict").status()
    assert [f.shard.shard_id for f in status.failed_shards] == [on_a.shard_id]


class _MemberBeforeDataSuspect:
    """A `NodeMembership` written before `data_suspect` existed (the protocol is an extension point)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, int]] = []

    def node_departed(self, node_id: int, reason: str) -> None:
        self.told.append(("departed", node_id))

    def processes_restarted(self, node_id: int, reason: str) -> None:
        self.told.append(("restarted", node_id))

    def job_finished(self, reason: str) -> None:
        pass


def test_a_membership_library_without_the_data_suspect_keyword_is_still_told() -> None:
    clock = ManualClock()
    member = _MemberBeforeDataSuspect()
    master = Master(config(), FakeScheduler(), MemoryJournal(), clock, membership=[member])
    master.start()
    a, b, c = sorted(master.nodes())
    for node_id in (a, b, c):
        master.register(node_id, f"agent-{node_id}", f"host-{node_id}")
    master.report_failure(a, FailureKind.NATIVE_CRASH, "Segmentation fault (core dumped)", exit_code=-11)
    clock.advance(11.0)
    master.heartbeat(a)
    master.heartbeat(b)
    master.tick()  # c went silent: it departed
    assert member.told == [("restarted", a), ("departed", c)]


def test_a_planned_rounds_restart_releases_the_nodes_shards_at_once() -> None:
    job = Job(MemoryJournal())
    a, b, c = job.register_all()
    with job.shards.locked() as registry:
        registry.register(SPEC)
        manager = registry.manager("train")
        on_a = registry.fetch("train", str(a)).shards[0]
        on_b = registry.fetch("train", f"{b}/1").shards[0]
        registry.report_progress("train", str(a), on_a.shard_id, 4)
    result = job.master.resize(2, "shrink by one")
    assert result.leaving_nodes == (c,)
    with job.shards.locked() as registry:
        # a's workers still run until its heartbeat delivers the restart: its lease stands.
        assert registry.manager("train").snapshot().doing.get(on_a.shard_id) == str(a)
    actions, _state = job.master.heartbeat(a)
    assert [x.kind.value for x in actions] == ["restart_processes"]
    # b's workers fail first (their peer on c is gone): the planned restart, answered in the reply.
    decision = job.master.report_failure(b, FailureKind.UNKNOWN, "gloo: connection closed")
    assert "planned round" in decision.outcome
    with job.shards.locked() as registry:
        manager = registry.manager("train")
        snap = manager.snapshot()
        assert {on_a.shard_id, on_b.shard_id} <= set(snap.todo)
        assert snap.doing == {}
        again = registry.fetch("train", str(b), count=2).shards  # re-leasable now, not when the leases expire
    assert {s.shard_id: s.consumed for s in again} == {on_a.shard_id: 4, on_b.shard_id: 0}
    kinds = [(e.kind, e.node_id) for e in job.master.events(limit=1000) if e.kind == "planned_restart"]
    assert sorted(kinds) == [("planned_restart", a), ("planned_restart", b)]


def test_the_end_of_the_job_closes_the_rendezvous() -> None:
    job = Job(MemoryJournal())
    job.register_all()
    job.master.stop("done here")
    with job.rendezvous.locked() as m:
        assert m.closed


def test_changes_are_journaled_as_lines_after_a_base_and_versions_only_grow() -> None:
    journal = MemoryJournal()
    job = Job(journal)
    a, _b, _c = job.register_all()
    with job.shards.locked() as registry:
        registry.register(SPEC)
        shard = registry.fetch("train", str(a)).shards[0]
        registry.report_progress("train", str(a), shard.shard_id, 3)
    assert job.master.journal_collaborator(job.shards)  # the first write is a base holding all three
    assert not job.master.journal_collaborator(job.shards)  # unchanged: nothing written
    state = journal.load()
    blob = state.blobs["shards"]
    assert json.loads(blob.data)["format"] == "dlrover.shard.registry"
    assert "shards" not in state.changes
    with job.shards.locked() as registry:
        registry.report_progress("train", str(a), shard.shard_id, 5)
    assert job.master.journal_collaborator(job.shards)
    state = journal.load()
    assert state.blobs["shards"] == blob  # the base stays; the change is one line after it
    [line] = state.changes["shards"]
    assert line.seq > blob.version
    assert json.loads(line.data)["call"] == "progress"
    job.master.flush_state()
    assert journal.load().changes["shards"] == (line,)


def test_a_restarted_master_replays_the_lines_after_the_base(tmp_path: Path) -> None:
    journal = SqliteJournal(str(tmp_path))
    job = Job(journal)
    a, b, _c = job.register_all()
    with job.shards.locked() as registry:
        registry.register(SPEC)
        first = registry.fetch("train", str(a)).shards[0]
    job.master.flush_state()  # the base
    with job.shards.locked() as registry:
        registry.report_progress("train", str(a), first.shard_id, 6)
        second = registry.fetch("train", str(b), request_id="f1").shards[0]
        registry.report_done("train", str(b), second.shard_id, request_id="d1")
    job.master.flush_state()  # three lines
    lines = journal.load().changes["shards"]
    assert len(lines) == 3
    journal.close()

    journal2 = SqliteJournal(str(tmp_path))
    job2 = Job(journal2, ManualClock(start=500.0))
    with job2.shards.locked() as registry:
        assert [s.consumed for s in registry.manager("train").leased_shards(str(a))] == [6]
        assert registry.report_done("train", str(b), second.shard_id, request_id="d1").changed  # a retry
        assert registry.manager("train").status().done == 1
    job2.master.flush_state()  # a restarted master's first write is a base: the old clock's lines go
    state = journal2.load()
    assert "shards" not in state.changes
    assert state.blobs["shards"].version > lines[-1].seq


def test_lines_that_outgrow_the_base_are_compacted_into_a_new_one() -> None:
    journal = MemoryJournal()
    job = Job(journal, min_compaction_bytes=1)
    a, _b, _c = job.register_all()
    with job.shards.locked() as registry:
        registry.register(SPEC)
        shard = registry.fetch("train", str(a)).shards[0]
    job.master.flush_state()
    base = journal.load().blobs["shards"]
    seen_lines = 0
    for consumed in range(1, 60):
        with job.shards.locked() as registry:
            registry.report_progress("train", str(a), shard.shard_id, consumed % 8)
        job.master.flush_state()
        seen_lines = max(seen_lines, len(journal.load().changes.get("shards", ())))
    state = journal.load()
    assert state.blobs["shards"].version > base.version  # compacted at least once
    assert seen_lines >= 1  # lines between bases
    lines = state.changes.get("shards", ())
    assert sum(len(line.data) for line in lines) <= len(state.blobs["shards"].data) + 200


def test_a_base_is_encoded_with_the_lock_let_go_and_a_call_meanwhile_is_a_line_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Encoding a base is most of its cost (seconds at 80,000 workers): calls must not wait for it.
    from dlrover.master import hosting
    from dlrover.shard.changelog import encode_base

    journal = MemoryJournal()
    job = Job(journal)
    a, b, _c = job.register_all()
    with job.shards.locked() as registry:
        registry.register(SPEC)
        registry.fetch("train", str(a))
    meanwhile: list[int] = []

    def encode_while_a_worker_fetches(seq: int, document: dict[str, object]) -> object:
        def fetch() -> None:
            with job.shards.locked() as registry:  # would wait for ever if the export held the lock
                meanwhile.extend(s.shard_id for s in registry.fetch("train", str(b)).shards)

        worker = threading.Thread(target=fetch)
        worker.start()
        worker.join(timeout=60.0)
        assert not worker.is_alive(), "a shard call waited for the base's encoding"
        return encode_base(seq, document)

    monkeypatch.setattr(hosting, "encode_base", encode_while_a_worker_fetches)
    assert job.master.journal_collaborator(job.shards)
    base = journal.load().blobs["shards"]
    leased = {lease["worker"] for d in json.loads(base.data)["datasets"] for lease in d["state"]["leases"]}
    assert leased == {str(a)}  # the base is the registry before the fetch made meanwhile
    assert meanwhile
    assert job.master.journal_collaborator(job.shards)  # that fetch is the line after the base
    [line] = journal.load().changes["shards"]
    assert line.seq > base.version
    assert json.loads(line.data)["args"]["worker"] == str(b)


def test_a_change_made_straight_on_a_hosted_manager_is_refused() -> None:
    job = Job(MemoryJournal())
    with job.shards.locked() as registry:
        registry.register(SPEC)
        with pytest.raises(ShardStateError, match="directly: its registry logs its changes"):
            registry.manager("train").fetch("0")
        assert registry.manager("train").status().doing == 0  # reads stay open


def test_a_shard_blob_an_older_master_wrote_is_read(tmp_path: Path) -> None:
    old = ShardRegistry(ManualClock())
    old.register(SPEC)
    held = old.manager("train").fetch("3").shards[0]
    old.manager("train").report_progress("3", held.shard_id, 2)
    data = json.dumps(
        {"format": "dlrover.master.shards", "version": 1, "datasets": [old.checkpoint("train", include_leases=True)]}
    )
    shards = HostedShards(ShardRegistry(ManualClock(7.0)))
    shards.import_changes(Blob(41, data), ())
    with shards.locked() as registry:
        assert [s.consumed for s in registry.manager("train").leased_shards("3")] == [2]
    assert shards.export_changes().blob is not None  # the first write is a base in the new format
    assert shards.export_changes().blob.version > 41  # numbered after the old blob's version


def restart(tmp_path: Path, journal: SqliteJournal, job: Job) -> Job:
    journal.close()
    return Job(SqliteJournal(str(tmp_path)), ManualClock(start=500.0))


def test_a_restarted_master_resumes_rounds_ranks_and_acknowledged_progress(tmp_path: Path) -> None:
    journal = SqliteJournal(str(tmp_path))
    job = Job(journal)
    a, b, c = job.register_all()
    with job.rendezvous.locked() as m:
        for node in (a, b, c):
            m.join(str(node), job.clock.now())
        ranks = {n: m.poll(str(n), job.clock.now()).rank for n in (a, b, c)}
    with job.shards.locked() as registry:
        registry.register(SPEC)
        shard = registry.fetch("train", str(a)).shards[0]
        registry.report_progress("train", str(a), shard.shard_id, 7)
    job.master.flush_state()  # what every changing RPC does before it answers

    job2 = restart(tmp_path, journal, job)
    assert job2.master.restored
    with job2.rendezvous.locked() as m:
        now = job2.clock.now()
        assert m.round_number == 1
        assert {n: m.poll(str(n), now).rank for n in (a, b, c)} == ranks
    with job2.shards.locked() as registry:
        manager = registry.manager("train")
        # The lease outlived the master: its holder, which kept training, reports on.
        assert [s.consumed for s in manager.leased_shards(str(a))] == [7]
        assert registry.report_progress("train", str(a), shard.shard_id, 8).changed
        with pytest.raises(ShardStateError, match="leased to another worker"):
            registry.report_progress("train", str(b), shard.shard_id, 9)
        registry.report_failure("train", str(a), shard.shard_id, "the holder gives it up")
        again = registry.fetch("train", str(b)).shards[0]
    assert (again.shard_id, again.consumed) == (shard.shard_id, 8)


def test_a_restart_catches_up_with_departures_the_libraries_missed(tmp_path: Path) -> None:
    journal = SqliteJournal(str(tmp_path))
    job = Job(journal, coupled=False)  # as if the master died between the two journal writes
    a, b, c = job.register_all()
    with job.rendezvous.locked() as m:
        for node in (a, b, c):
            m.join(str(node), job.clock.now())
    job.clock.advance(11.0)
    job.master.heartbeat(a)
    job.master.heartbeat(b)
    job.master.tick()
    assert job.master.node(c).state is NodeState.RELAUNCHING
    job.master.flush_state()
    with job.rendezvous.locked() as m:
        assert m.current_round is not None  # c is still in it

    job2 = restart(tmp_path, journal, job)
    with job2.rendezvous.locked() as m:
        assert m.current_round is None
        assert "left" in m.poll(str(a), job2.clock.now()).reason


def _crash(job: Job, node_id: int) -> None:
    job.master.report_failure(node_id, FailureKind.NATIVE_CRASH, "Segmentation fault (core dumped)", exit_code=-11)


def _crash_until_no_restart_is_left(job: Job, node_id: int) -> None:
    while job.master.node(node_id).process_restarts < job.master.config.lifecycle.max_process_restarts:
        _crash(job, node_id)


def test_a_restart_tells_a_missed_departure_as_it_was_decided_and_charges_only_the_datas_suspects(
    tmp_path: Path,
) -> None:
    """The previous master journaled two nodes' departures and died before the shard library heard of
    them: one relaunched after crashing in native code (the samples may be the cause), one lost with
    its host (not the data's doing). max_attempts=1: a charged release sends a shard to the failed set."""
    journal = SqliteJournal(str(tmp_path))
    job = Job(journal, coupled=False)
    a, b, c = job.register_all()
    _crash_until_no_restart_is_left(job, a)
    with job.shards.locked() as registry:
        registry.register(attrs.evolve(SPEC, name="strict", max_attempts=1))
        on_a = registry.fetch("strict", str(a)).shards[0]
        on_c = registry.fetch("strict", str(c)).shards[0]
    _crash(job, a)  # past its restarts
    job.clock.advance(11.0)
    job.master.heartbeat(a)
    job.master.heartbeat(b)
    job.master.tick()  # c is silent
    gone = (NodeState.FAILED, NodeState.RELAUNCHING)
    assert job.master.node(a).state in gone
    assert job.master.node(c).state in gone
    assert job.master.node(a).failure_data_suspect
    assert not job.master.node(c).failure_data_suspect
    job.master.flush_state()

    job2 = restart(tmp_path, journal, job)
    with job2.shards.locked() as registry:
        status = registry.manager("strict").status()
        snap = registry.manager("strict").snapshot()
    assert [f.shard.shard_id for f in status.failed_shards] == [on_a.shard_id]
    assert on_c.shard_id in snap.todo


def test_a_departure_told_before_the_master_restarted_is_not_charged_again(tmp_path: Path) -> None:
    journal = SqliteJournal(str(tmp_path))
    job = Job(journal)
    a, _b, _c = job.register_all()
    _crash_until_no_restart_is_left(job, a)
    with job.shards.locked() as registry:
        registry.register(attrs.evolve(SPEC, name="twice", max_attempts=2))
        on_a = registry.fetch("twice", str(a)).shards[0]
    _crash(job, a)  # past its restarts: it leaves
    job.master.flush_state()

    def failures(j: Job) -> int:
        with j.shards.locked() as registry:
            queue = json.loads(registry.checkpoint("twice", include_leases=True))["state"]["queue"]
        return int({q["shard_id"]: q["failures"] for q in queue}[on_a.shard_id])

    assert failures(job) == 1  # charged once, live
    job2 = restart(tmp_path, journal, job)
    assert failures(job2) == 1  # told again, and nothing was left to charge


def test_a_corrupt_shard_blob_or_line_is_refused() -> None:
    for data in ("nope", json.dumps({"format": "x"}), json.dumps({"format": "dlrover.master.shards", "version": 1})):
        with pytest.raises(JournalError, match="shard state"):
            HostedShards(ShardRegistry(ManualClock())).import_changes(Blob(1, data), ())
    live = HostedShards(ShardRegistry(ManualClock()))
    base = live.export_changes().blob
    assert base is not None
    seq = base.version + 1
    bad_line = ChangeLine(seq, json.dumps({"seq": seq, "t": 0, "call": "done", "args": {}}))
    with pytest.raises(JournalError, match="does not apply"):
        HostedShards(ShardRegistry(ManualClock())).import_changes(base, (bad_line,))


class RecordingSink:
    """A `StateSink` that keeps what it was asked to journal."""

    def __init__(self) -> None:
        self.written: list[tuple[int, str]] = []
        self.calls = 0

    def journal_collaborator(self, collaborator: StatefulCollaborator) -> bool:
        self.calls += 1
        version, data = collaborator.export_state()
        if self.written and version <= self.written[-1][0]:
            return False
        self.written.append((version, data))
        return True


def test_a_call_that_sees_a_round_another_call_formed_answers_only_after_it_is_journaled() -> None:
    clock = ManualClock()
    hosted = HostedRendezvous(RendezvousManager(config().rendezvous_config()), clock)
    sink = RecordingSink()
    hosted.attach(sink)
    with hosted.locked() as m:  # another RPC formed the round and has not journaled it yet
        for node in ("0", "1", "2"):
            m.join(node, clock.now())
    reply = hosted.servicer.Poll(rpb.PollRequest(node_id="1"), None)  # type: ignore[arg-type]
    assert reply.round == 1
    assert len(sink.written) == 1
    assert json.loads(sink.written[0][1])["round_number"] == 1
    hosted.servicer.Poll(rpb.PollRequest(node_id="2"), None)  # type: ignore[arg-type]
    assert sink.calls == 1  # the journal already holds this round: no export at all


def _join_round(job: Job, *nodes: int) -> int:
    """Every one of `nodes` joins the rendezvous (again); returns the round number in force then."""
    with job.rendezvous.locked() as m:
        for node in nodes:
            m.join(str(node), job.clock.now())
        return m.round_number


def _outwait_the_cause(job: Job, *alive: int) -> None:
    """Let a collective error's wait for a cause run out (the job's heartbeat timeout and 10 s), with
    the `alive` nodes heartbeating all along."""
    for _ in range(6):
        job.clock.advance(5.0)
        for node in alive:
            job.master.heartbeat(node)
        job.master.tick()


def test_collective_failures_of_nodes_a_lost_peer_left_behind_restart_them_without_a_charge() -> None:
    job = Job(MemoryJournal(), policy=DiagnosisFailurePolicy())
    a, b, c = job.register_all()
    assert _join_round(job, a, b, c) == 1
    job.clock.advance(11.0)
    job.master.heartbeat(a)
    job.master.heartbeat(b)
    job.master.tick()  # c is silent: failed, relaunched; round 1 dissolves under a and b
    charged = job.master.status().job_failures
    peer_gone = "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:55700"
    decision = job.master.report_failure(a, FailureKind.UNKNOWN, peer_gone, exit_code=1)
    assert decision.action.value == "restart_processes"
    assert f"round 1 dissolved: node '{c}' left" in decision.outcome
    assert "counts against no budget" in decision.outcome
    # b's workers hung in the collective instead: the same.
    decision = job.master.report_failure(b, FailureKind.HANG, "no step for 300 s", exit_code=None)
    assert "counts against no budget" in decision.outcome
    assert job.master.status().job_failures == charged
    kinds = [e.kind for e in job.master.events(limit=1000)]
    assert kinds.count("consequence_restart") == 2
    # Once a joined the next round again, a collective error of its workers waits for a cause; none
    # comes, and it is charged as any other failure.
    _join_round(job, a)
    decision = job.master.report_failure(a, FailureKind.UNKNOWN, peer_gone, exit_code=1)
    assert decision.action.value == "restart_processes"
    assert "no cause is known yet" in decision.outcome
    assert job.master.status().job_failures == charged
    _outwait_the_cause(job, a, b)
    assert job.master.status().job_failures == charged + 1
    assert [e.node_id for e in job.master.events(limit=1000) if e.kind == "failure_charged"] == [a]


def test_a_peers_crash_excuses_the_collective_errors_it_causes_and_a_peers_collective_error_does_not() -> None:
    job = Job(MemoryJournal(), policy=DiagnosisFailurePolicy())
    a, b, c = job.register_all()
    _join_round(job, a, b, c)
    with job.shards.locked() as registry:
        registry.register(SPEC)
        held = registry.fetch("train", str(a)).shards[0]
    # c's worker segfaults: c restarts in place and is charged; a's reset is c's doing.
    crash = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):"
    assert job.master.report_failure(c, FailureKind.UNKNOWN, crash, exit_code=-11).action.value == "restart_processes"
    charged = job.master.status().job_failures
    reset = "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"
    decision = job.master.report_failure(a, FailureKind.UNKNOWN, reset, exit_code=1)
    assert f"the processes of node '{c}' restart" in decision.outcome
    assert job.master.status().job_failures == charged
    with job.shards.locked() as registry:  # the consequence restart let a's lease go, as any restart does
        assert held.shard_id in registry.manager("train").snapshot().todo
    # A new round; then b's collective error comes first: c's, after it, may be the cause rather than
    # the consequence (a bad link of c's), so neither excuses the other: both are charged once their
    # wait for a cause of another kind runs out.
    assert _join_round(job, a, b, c) == 2
    job.master.report_failure(b, FailureKind.UNKNOWN, reset, exit_code=1)
    decision = job.master.report_failure(c, FailureKind.UNKNOWN, reset, exit_code=1)
    assert "counts against no budget" not in decision.outcome
    assert job.master.status().job_failures == charged
    _outwait_the_cause(job, a, b, c)
    assert job.master.status().job_failures == charged + 2


def test_a_bug_in_a_node_a_lost_peer_left_behind_is_still_its_own() -> None:
    job = Job(MemoryJournal(), policy=DiagnosisFailurePolicy())
    a, b, c = job.register_all()
    _join_round(job, a, b, c)
    job.master.report_failure(c, FailureKind.UNKNOWN, "[rank2]: RuntimeError: Connection reset by peer", exit_code=1)
    bug = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            "NameError: name 'x' is not defined",
        ]
    )
    decision = job.master.report_failure(a, FailureKind.UNKNOWN, bug, exit_code=1)
    assert decision.kind.value == "user_code"
    assert "counts against no budget" not in decision.outcome
