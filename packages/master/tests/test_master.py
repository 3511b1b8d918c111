"""The composed Master with a fake scheduler, a manual clock and a journal: no threads, no gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import pytest

from dlrover.common import ConfigError, ManualClock
from dlrover.diagnosis import FailureKind
from dlrover.master.checkpoints import CheckpointError
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.eventlog import EventLog, read_event_log
from dlrover.master.goodput import AttemptReport, StepMark
from dlrover.master.journal import (
    Blob,
    ChangeLine,
    JournalBatch,
    JournalError,
    MemoryJournal,
    SqliteJournal,
    StateJournal,
)
from dlrover.master.launch_retry import LaunchRetrySettings
from dlrover.master.lifecycle import NodeConflictError
from dlrover.master.master import Master, ResourceSample, StateChanges
from dlrover.master.records import NodeRecord
from dlrover.master.scheduler.base import REASON_DELETED, NodeRejectedError, NodeSpec, ObservedState, SchedulerError
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import JobState, NodeState


def config(nodes: int = 2, **kw: object) -> MasterConfig:
    lifecycle = LifecycleConfig(nodes=NodeRange(1, nodes), heartbeat_timeout_s=10.0, insufficient_nodes_window_s=60.0)
    return MasterConfig(
        job_name="t", lifecycle=lifecycle, heartbeat_interval_s=1.0, progress_event_interval_s=0.0, **kw
    )  # type: ignore[arg-type]


class Blobby:
    """A collaborator whose state is a counter."""

    state_name = "blobby"

    def __init__(self) -> None:
        self.version = 0
        self.value = 0
        self.imported: tuple[int, str] | None = None

    def export_state(self) -> tuple[int, str]:
        return self.version, json.dumps({"value": self.value})

    def import_state(self, version: int, data: str) -> None:
        self.imported = (version, data)
        self.version = version
        self.value = json.loads(data)["value"]


class Logged:
    """A log-structured collaborator whose next export the test sets, recording what the master acknowledges."""

    state_name = "logged"

    def __init__(self) -> None:
        self.next = StateChanges()
        self.acknowledged: list[tuple[int, Blob | None]] = []
        self.imported: tuple[Blob, tuple[ChangeLine, ...]] | None = None

    def export_changes(self) -> StateChanges:
        return self.next

    def changes_journaled(self, through: int, blob: Blob | None) -> None:
        self.acknowledged.append((through, blob))

    def import_changes(self, blob: Blob, lines: Sequence[ChangeLine]) -> None:
        self.imported = (blob, tuple(lines))


def _lines(*seqs: int) -> tuple[ChangeLine, ...]:
    return tuple(ChangeLine(seq, json.dumps({"n": seq})) for seq in seqs)


def test_a_logged_collaborator_gets_its_lines_after_its_blob_and_races_never_lose_a_line(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    logged = Logged()
    master = Master(config(), FakeScheduler(), journal, ManualClock(), collaborators=[logged])
    master.start()
    logged.next = StateChanges(blob=Blob(3, "[3]"))
    assert master.journal_collaborator(logged)
    logged.next = StateChanges(lines=_lines(4, 5))
    assert master.journal_collaborator(logged)
    assert not master.journal_collaborator(logged)  # the same lines again: nothing new
    # Two writers raced: one exported lines 4..7, the other a base at 6 before them; the base comes
    # second. It is newer than the stored one and holds 4..6: line 7 must stay after it.
    logged.next = StateChanges(lines=_lines(4, 5, 6, 7))
    assert master.journal_collaborator(logged)
    logged.next = StateChanges(blob=Blob(6, "[6]"))
    assert master.journal_collaborator(logged)
    logged.next = StateChanges(blob=Blob(5, "[5]"), lines=_lines(8))  # an even older base: skipped
    assert master.journal_collaborator(logged)
    assert logged.acknowledged == [(3, Blob(3, "[3]")), (5, None), (5, None), (7, None), (7, Blob(6, "[6]")), (8, None)]
    journal.close()

    again = Logged()
    Master(config(), FakeScheduler(), SqliteJournal(tmp_path), ManualClock(), collaborators=[again])
    assert again.imported == (Blob(6, "[6]"), _lines(7, 8))


def test_change_lines_without_their_blob_stop_the_master() -> None:
    journal = MemoryJournal()
    journal.commit(JournalBatch(changes={"logged": _lines(1)}))
    with pytest.raises(JournalError, match="1 change line\\(s\\) of 'logged' but no blob"):
        Master(config(), FakeScheduler(), journal, ManualClock(), collaborators=[Logged()])


def make(journal: StateJournal | None = None, **kw: object) -> tuple[Master, FakeScheduler, ManualClock]:
    sched = FakeScheduler()
    clock = ManualClock()
    master = Master(config(**kw), sched, journal or MemoryJournal(), clock, agent_env={"X": "1"})  # type: ignore[arg-type]
    return master, sched, clock


def test_start_launches_every_rank_with_its_environment() -> None:
    master, sched, _ = make()
    master.start()
    assert sorted(sched.specs) == [0, 1]
    spec = sched.specs[1]
    assert spec.rank == 1
    assert spec.env["DLROVER_NODE_ID"] == "1"
    assert spec.env["X"] == "1"
    sched.set_state(0, ObservedState.RUNNING)
    master.tick()
    assert master.node(0).state is NodeState.STARTING


def test_silent_node_is_failed_and_relaunched_through_the_scheduler() -> None:
    master, sched, clock = make()
    master.start()
    master.register(0, "a", "h0")
    master.register(1, "b", "h1")
    clock.advance(6)
    master.heartbeat(0, step=1)
    clock.advance(6)  # node 1 silent 12 s > 10 s; node 0 silent 6 s
    master.tick()
    assert 1 in sched.stopped
    assert sched.specs[2].rank == 1
    assert master.node(1).state is NodeState.RELAUNCHING
    kinds = [e.kind for e in master.events(limit=1000)]
    assert "failure" in kinds
    assert "relaunch" in kinds
    text = master.metrics.render().decode()
    assert 'dlrover_failures_total{job="t",kind="preemption"} 1.0' in text
    assert 'dlrover_restarts_total{job="t",kind="node"} 1.0' in text
    assert 'dlrover_nodes{job="t",state="relaunching"} 1.0' in text


def test_scheduler_observed_exit_is_a_failure_and_a_clean_exit_a_success() -> None:
    master, sched, _ = make()
    master.start()
    master.register(0, "a", "h0")
    master.register(1, "b", "h1")
    sched.set_state(1, ObservedState.SUCCEEDED, exit_code=0)
    master.tick()
    sched.set_state(0, ObservedState.FAILED, exit_code=137)
    master.tick()
    assert master.node(0).state is NodeState.REMOVED  # not relaunched: node 1 succeeded
    assert "status 137" in master.node(0).last_failure
    assert master.node(1).state is NodeState.SUCCEEDED
    assert master.job_state is JobState.SUCCEEDED


def test_launch_failures_are_node_failures_within_budget_once_their_retries_are_spent() -> None:
    master, sched, clock = make(nodes=1, launch_retry=LaunchRetrySettings(retries=2, initial_s=1.0, max_s=1.5))
    sched.fail_launches = True
    master.start()
    for _ in range(40):
        if master.job_state is JobState.FAILED:
            break
        clock.advance(1.0)
        master.tick()
    # Every launch fails: each node is launched three times (two retries), then fails and is relaunched
    # as a new node, until the rank's budget (3 relaunches) runs out.
    assert master.job_state is JobState.FAILED
    assert len(master.nodes()) == 4
    assert sched.launch_attempts == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert all("launch failed 3 times, last: cannot launch" in n.last_failure for n in master.nodes().values())
    retries = [e for e in master.events(limit=1000) if e.kind == "launch_retry"]
    # Node 0 failed twice and waited; each replacement, asked for right after a failure, was first held
    # back unsent (0: no retry spent) until the backend had had its wait, then failed twice and waited.
    assert [(e.node_id, e.data["launches"], e.data["delay_s"]) for e in retries] == [
        (0, 1, 1.0),
        (0, 2, 1.5),
        *[(node, launches, delay) for node in (1, 2, 3) for launches, delay in ((0, 1.0), (1, 1.0), (2, 1.5))],
    ]


def test_a_launch_that_fails_for_a_while_is_tried_again_with_backoff_and_charges_nothing() -> None:
    master, sched, clock = make(nodes=1)  # the defaults: 5 retries, 2 s doubling up to 30 s
    sched.fail_launches = 3
    master.start()
    assert master.node(0).state is NodeState.PENDING
    assert master.events(limit=10)[-1].kind == "launch_retry"
    waits = []
    for _ in range(60):
        before = len(sched.launch_attempts)
        clock.advance(1.0)
        master.tick()
        if len(sched.launch_attempts) > before:
            waits.append(clock.now())
        if 0 in sched.specs:
            break
    assert sched.launch_attempts == [0, 0, 0, 0]  # the fourth launch got through
    assert waits == [2.0, 6.0, 14.0]  # 2 s, then 4 s, then 8 s after each failure
    node = master.node(0)
    assert node.state is NodeState.PENDING
    assert node.relaunch_count == 0
    assert not node.last_failure
    kinds = [e.kind for e in master.events(limit=1000)]
    assert kinds.count("launch_retry") == 3
    assert "failure" not in kinds
    assert "relaunch" not in kinds
    master.register(0, "a", "h0")
    assert master.node(0).state is NodeState.RUNNING
    clock.advance(8.0)  # the longest wait it would have had next, inside the heartbeat timeout (10 s)
    master.tick()
    assert sched.launch_attempts == [0, 0, 0, 0]  # nothing left waiting


def test_a_node_waiting_for_its_launch_retry_is_announced_pending_with_the_backends_words() -> None:
    master, sched, clock = make(nodes=1, launch_retry=LaunchRetrySettings(retries=5, initial_s=30.0, max_s=30.0))
    sched.fail_launches = True
    master.start()
    clock.advance(61.0)  # past the node pending timeout (60 s), inside the third wait
    master.tick()
    pending = [e for e in master.events(limit=1000) if e.kind == "nodes_pending"]
    assert pending
    assert "launches are failing (test switch)" in pending[-1].message


def test_a_launch_retry_is_dropped_when_its_node_is_decided_meanwhile() -> None:
    master, sched, clock = make(nodes=2, launch_retry=LaunchRetrySettings(retries=3, initial_s=5.0, max_s=5.0))
    master.start()
    master.register(0, "a", "h0")
    sched.fail_launches = True
    sched.set_state(1, ObservedState.FAILED, exit_code=1)
    master.tick()  # node 1 lost: relaunched as node 2, whose launch fails
    assert sorted(master.nodes()) == [0, 1, 2]
    assert master.node(2).state is NodeState.PENDING
    sched.fail_launches = False
    master.stop("a person stopped the job")
    clock.advance(10.0)
    master.tick()
    assert sched.launch_attempts.count(2) == 1  # not launched again into a job that is over


def test_a_resumed_master_sends_the_launches_its_predecessor_was_to_retry_or_held_back(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    first = FakeScheduler()
    first.fail_launches = True
    master = Master(config(nodes=3), first, journal, ManualClock())
    master.start()
    assert first.launch_attempts == [0]  # node 0 failed and waits for its retry; nodes 1 and 2 are held back
    assert [(e.node_id, e.data["launches"]) for e in master.events(limit=1000) if e.kind == "launch_retry"] == [
        (0, 1),
        (1, 0),
        (2, 0),
    ]
    journal.close()  # the master dies meanwhile

    sched = FakeScheduler()
    clock = ManualClock(start=500.0)
    resumed = Master(config(nodes=3), sched, SqliteJournal(tmp_path), clock)
    resumed.start()
    assert sched.launch_attempts == []  # they wait their turn, like any retry
    clock.advance(2.0)
    resumed.tick()
    assert sorted(sched.launch_attempts) == [0, 1, 2]
    assert all(n.state is NodeState.PENDING and n.relaunch_count == 0 for n in resumed.nodes().values())


def test_a_retried_launch_avoids_the_hosts_avoided_meanwhile() -> None:
    master, sched, clock = make(nodes=2, launch_retry=LaunchRetrySettings(retries=3, initial_s=1.0, max_s=1.0))
    sched.fail_launches = 1
    master.start()  # node 0's launch fails; node 1's is held back while the backend is away
    assert sched.launch_attempts == [0]
    master.mark_host_unhealthy("bad-host", "ECC errors")
    clock.advance(1.0)
    master.tick()
    assert sched.launch_attempts == [0, 0, 1]
    assert sched.specs[0].avoid_hosts == frozenset({"bad-host"})
    assert sched.specs[1].avoid_hosts == frozenset({"bad-host"})


def test_while_the_backend_is_away_one_launch_a_tick_is_sent_and_every_node_goes_once_it_is_back() -> None:
    master, sched, clock = make(nodes=4, launch_retry=LaunchRetrySettings(retries=5, initial_s=1.0, max_s=1.0))
    sched.fail_launches = True
    master.start()  # node 0's launch fails: nodes 1..3 are not sent (each would spend the backend's own retries)
    assert sched.launch_attempts == [0]
    clock.advance(1.0)
    master.tick()  # all four due: node 0 is sent and fails again, the others wait for the next tick
    assert sched.launch_attempts == [0, 0]
    clock.advance(1.0)
    master.tick()
    assert sched.launch_attempts == [0, 0, 1]
    sched.fail_launches = False
    clock.advance(1.0)
    master.tick()  # the backend is back: every waiting node goes at once, earliest due first
    assert sched.launch_attempts == [0, 0, 1, 2, 3, 0, 1]
    assert sorted(sched.specs) == [0, 1, 2, 3]
    assert all(n.state is NodeState.PENDING and n.relaunch_count == 0 for n in master.nodes().values())
    assert "failure" not in [e.kind for e in master.events(limit=1000)]


def test_a_start_timeout_during_the_retries_names_the_backends_words_and_ends_them() -> None:
    lifecycle = LifecycleConfig(nodes=NodeRange(1, 1), node_start_timeout_s=5.0, insufficient_nodes_window_s=600.0)
    retry = LaunchRetrySettings(retries=5, initial_s=10.0, max_s=10.0)
    sched, clock = FakeScheduler(), ManualClock()
    master = Master(MasterConfig(job_name="t", lifecycle=lifecycle, launch_retry=retry), sched, MemoryJournal(), clock)
    sched.fail_launches = 1
    master.start()
    clock.advance(6.0)
    master.tick()  # node 0 timed out while it waited: relaunched as node 1, whose launch goes through
    assert "not registered 6.0s after launch (timeout 5s): its launch failed 1 time(s)" in master.node(0).last_failure
    assert "launches are failing (test switch)" in master.node(0).last_failure
    clock.advance(4.5)  # past node 0's retry (due at 10 s), inside node 1's start timeout
    master.tick()
    assert sched.launch_attempts == [0, 1]  # node 0's retry ended with it


class AnswerLostScheduler(FakeScheduler):
    """Creates the node, then answers with an error (a create whose answer timed out)."""

    def launch(self, spec: NodeSpec) -> None:
        super().launch(spec)
        raise SchedulerError(f"create pod of node {spec.node_id}: read timed out")


def test_a_launch_whose_answer_was_lost_is_not_sent_again_once_the_backend_shows_the_node() -> None:
    sched = AnswerLostScheduler()
    clock = ManualClock()
    master = Master(config(nodes=1), sched, MemoryJournal(), clock)
    master.start()
    assert master.events(limit=1000)[-1].kind == "launch_retry"
    for _ in range(5):
        clock.advance(2.0)
        master.tick()
    assert sched.launch_attempts == [0]  # observed pending at the next tick: the retry is dropped
    assert master.node(0).state is NodeState.PENDING
    assert not master.node(0).last_failure


def test_launch_retry_settings_refuse_what_is_not_a_backoff() -> None:
    bad_settings = (
        {"retries": -1},
        {"retries": 1.5},
        {"initial_s": 0.0},
        {"max_s": float("inf")},
        {"initial_s": 5.0, "max_s": 1.0},
    )
    for bad in bad_settings:
        with pytest.raises(ConfigError, match="launch retr"):
            LaunchRetrySettings(**bad)  # type: ignore[arg-type]


def test_a_reported_restart_is_not_ordered_twice_and_resources_are_kept() -> None:
    master, _, _ = make(nodes=1)
    master.start()
    master.register(0, "a", "h0")
    decision = master.report_failure(0, FailureKind.UNKNOWN, "exit 1")
    assert decision.action.value == "restart_processes"
    actions, state = master.heartbeat(0, step=3, samples=30, resources=ResourceSample(cpu_percent=50.0))
    assert actions == ()  # the reply to the report delivered the restart
    assert state is JobState.RUNNING
    assert master.resources(0) == ResourceSample(cpu_percent=50.0)
    assert master.status().step == 3


def test_checkpoint_commit_is_journaled_and_refusals_change_nothing() -> None:
    master, _, _ = make()
    assert master.report_checkpoint_steps(2, {0: [5], 1: [5, 6]}) == (5, None)
    before = master.state_digest()
    with pytest.raises(CheckpointError):
        master.commit_checkpoint(6, "")
    assert master.state_digest() == before
    assert master.commit_checkpoint(5, "/ck/5").step == 5
    assert master.report_checkpoint_steps(2, {0: [5, 6]}) == (6, 5)
    assert master.status().committed_step == 5


def test_restart_from_sqlite_keeps_nodes_ranks_commits_and_blobs(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    sched = FakeScheduler()
    clock = ManualClock()
    blob = Blobby()
    journal = SqliteJournal(tmp_path)
    master = Master(config(), sched, journal, clock, collaborators=[blob], event_log=log)
    master.start()
    master.register(0, "a", "h0")
    master.register(1, "b", "h1")
    master.report_failure(1, FailureKind.PREEMPTION, "gone")  # relaunched as node 2, rank 1
    master.report_checkpoint_steps(1, {0: [7]})
    master.commit_checkpoint(7, "/ck/7")
    blob.value, blob.version = 42, 3
    master.tick()
    before = {i: (n.rank, n.state) for i, n in master.nodes().items()}
    journal.close()  # the process "dies" here; no shutdown work is needed for correctness

    blob2 = Blobby()
    journal2 = SqliteJournal(tmp_path)
    sched2 = FakeScheduler()
    clock2 = ManualClock(start=500.0)
    master2 = Master(config(), sched2, journal2, clock2, collaborators=[blob2], event_log=log)
    assert master2.restored
    assert {i: (n.rank, n.state) for i, n in master2.nodes().items()} == before
    master2.start()
    assert sched2.specs == {}  # a resumed job launches nothing new
    assert master2.status().committed_step == 7
    assert blob2.imported == (3, '{"value": 42}')
    # The agent of node 0 reconnects by proving its identity, and keeps rank 0.
    with pytest.raises(NodeConflictError):
        master2.register(0, "a", "h0")
    assert master2.register(0, "a", "h0", proven_node_id=0).rank == 0
    # Fresh timeouts after the restart: nobody is failed for the downtime.
    clock2.advance(5)
    master2.tick()
    assert master2.node(0).state is NodeState.RUNNING
    journal2.close()
    log.close()
    kinds = [e["kind"] for e in read_event_log(tmp_path / "events.jsonl")]
    assert kinds.count("master_restart") == 1
    assert "checkpoint" in kinds


def test_stop_stops_every_node() -> None:
    master, sched, _ = make()
    master.start()
    assert master.stop("enough") is JobState.STOPPED
    assert sorted(sched.stopped) == [0, 1]
    assert master.status().exit_reason == "enough"


def test_progress_and_step_marks_feed_goodput_and_metrics() -> None:
    master, _, clock = make(nodes=1)
    master.start()
    master.register(0, "a", "h0")
    ready = clock.wall_time()
    for step in range(1, 6):
        clock.advance(1)
        marks = (StepMark(step * 10, clock.wall_time()),)
        report = AttemptReport(node_id=0, attempt=1, rank=0, ready_time=ready, marks=marks)
        master.heartbeat(0, step=step * 10, samples=step * 100, attempts=[report])
    progress = [e for e in master.events(limit=1000) if e.kind == "progress"]
    assert [e.data["step"] for e in progress] == [10, 20, 30, 40, 50]
    master.tick()
    status = master.status()
    # Every second since the workers were ready was a new step: all of it useful.
    assert status.breakdown.useful_s == pytest.approx(5.0)
    assert status.goodput == pytest.approx(status.breakdown.useful_s / status.elapsed_s)
    assert status.samples_per_second == pytest.approx(100.0)
    text = master.metrics.render().decode()
    assert 'dlrover_steps_per_second{job="t"} 10.0' in text
    assert 'dlrover_samples_per_second{job="t"} 100.0' in text
    assert 'dlrover_goodput_seconds{bucket="useful",job="t"} 5.0' in text
    # The marks are journaled as a `steps` event: a master restarted from the journal agrees.
    master.flush_state()
    assert any(e.kind == "steps" for e in master.events(limit=1000))


def test_heartbeats_without_a_new_step_do_not_scan_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    master, _, clock = make(nodes=2)
    master.start()
    master.register(0, "a", "h0")
    master.register(1, "b", "h1")
    scans = 0
    current_nodes = master._lifecycle.current_nodes

    def counted() -> dict[int, NodeRecord]:
        nonlocal scans
        scans += 1
        return current_nodes()

    monkeypatch.setattr(master._lifecycle, "current_nodes", counted)
    for _ in range(50):  # before the first step, and through a recovery: nothing new to announce
        clock.advance(30)
        master.heartbeat(0)
        master.heartbeat(1, step=-1)
    assert scans == 0
    master.heartbeat(0, step=3)
    master.heartbeat(1, step=3)  # not newer than the step the first one announced
    assert scans == 1
    assert [e.data["step"] for e in master.events(limit=1000) if e.kind == "progress"] == [3]


def test_a_new_step_seen_within_the_interval_is_announced_at_the_first_heartbeat_after_it() -> None:
    clock = ManualClock()
    slow = attrs.evolve(config(nodes=1), progress_event_interval_s=10.0)
    master = Master(slow, FakeScheduler(), MemoryJournal(), clock)
    master.start()
    master.register(0, "a", "h0")
    master.heartbeat(0, step=1)
    clock.advance(2)
    master.heartbeat(0, step=2)  # newer, but within the interval of the step-1 event
    clock.advance(9)
    master.heartbeat(0)  # no step of its own: the step 2 seen before is announced now
    assert [e.data["step"] for e in master.events(limit=1000) if e.kind == "progress"] == [1, 2]


def test_prepare_creates_nodes_that_can_register_before_anything_is_launched() -> None:
    master, sched, _ = make()
    master.prepare()
    master.prepare()
    assert sched.specs == {}
    assert master.register(None, "early", "h").rank == 0
    master.start()
    master.start()
    assert sorted(sched.specs) == [0, 1]


class AdoptingScheduler(FakeScheduler):
    """A backend a resuming master tells its journaled nodes (`AdoptsNodes`); those in `gone` had no trace."""

    def __init__(self, gone: set[int]) -> None:
        super().__init__()
        self.gone = gone
        self.adopted: list[int] = []

    def adopt(self, node_ids: Iterable[int]) -> None:
        for node_id in node_ids:
            self.adopted.append(node_id)
            if node_id in self.gone:
                self.set_state(node_id, ObservedState.FAILED, reason=REASON_DELETED, evidence="no pod", disruption=True)
            else:
                self.set_state(node_id, ObservedState.RUNNING)


def test_a_resumed_master_relaunches_a_journaled_node_its_backend_found_gone_at_once_without_charge(
    tmp_path: Path,
) -> None:
    journal = SqliteJournal(tmp_path)
    master = Master(config(), FakeScheduler(), journal, ManualClock())
    master.start()
    master.register(0, "a", "h0")
    master.register(1, "b", "h1")
    master.tick()
    journal.close()  # the master dies; meanwhile node 1's pod is deleted

    sched = AdoptingScheduler(gone={1})
    resumed = Master(config(), sched, SqliteJournal(tmp_path), ManualClock(start=500.0))
    assert sorted(sched.adopted) == [0, 1]  # the journal's alive nodes, told before the first tick
    resumed.start()
    resumed.tick()  # the first look: no heartbeat or start timeout has passed
    nodes = resumed.nodes()
    assert nodes[1].state is not NodeState.RUNNING
    assert nodes[1].last_failure.startswith("Deleted: no pod")
    (relaunch,) = [n for i, n in nodes.items() if i > 1]
    assert relaunch.rank == 1
    assert relaunch.disruptions == 1  # not charged to the rank
    assert sorted(sched.specs) == [relaunch.node_id]
    assert resumed.status().job_failures == 0
    assert nodes[0].state is NodeState.RUNNING


class RejectingScheduler(FakeScheduler):
    """The platform refuses every node's specification (Kubernetes: 422 Invalid)."""

    def launch(self, spec: NodeSpec) -> None:
        raise NodeRejectedError(f"node {spec.node_id}: 422 Invalid: spec.containers[0].image: Required value")


def test_a_node_the_platform_finds_invalid_fails_the_job_with_its_message_and_launches_nothing_more() -> None:
    master = Master(config(), RejectingScheduler(), MemoryJournal(), ManualClock())
    master.start()
    assert master.job_state is JobState.FAILED
    status = master.status()
    assert "spec.containers[0].image: Required value" in status.exit_reason
    assert status.job_failures == 0  # the configuration's fault, not a node's
    assert all(n.state is NodeState.REMOVED for n in master.nodes().values())


def test_a_fresh_master_is_not_restored_and_a_second_one_is(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    master = Master(config(), FakeScheduler(), journal, ManualClock())
    master.start()
    assert not master.restored
    journal.close()
    journal = SqliteJournal(tmp_path)
    try:
        assert Master(config(), FakeScheduler(), journal, ManualClock()).restored
    finally:
        journal.close()


def test_a_state_dir_of_another_job_is_refused(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    Master(config(nodes=2), FakeScheduler(), journal, ManualClock()).start()
    journal.close()
    journal = SqliteJournal(tmp_path)
    try:
        with pytest.raises(ConfigError, match="max_nodes 2 -> 3"):
            Master(config(nodes=3), FakeScheduler(), journal, ManualClock())
    finally:
        journal.close()


def test_goodput_after_a_master_restart_is_recomputed_from_the_journal(tmp_path: Path) -> None:
    clock = ManualClock()
    journal = SqliteJournal(tmp_path)
    master = Master(config(nodes=1), FakeScheduler(), journal, clock)
    master.start()
    master.register(0, "a", "h0")
    ready = clock.wall_time()
    for step in range(1, 4):
        clock.advance(1)
        marks = (StepMark(step, clock.wall_time()),)
        report = AttemptReport(node_id=0, attempt=1, rank=0, ready_time=ready, marks=marks)
        master.heartbeat(0, step=step, attempts=[report])
    clock.advance(1)
    master.report_failure(0, FailureKind.UNKNOWN, "exit 1")
    master.record_checkpoint(2, "/ck/2", 1)
    clock.advance(1)
    master.flush_state()  # what a stopping master journals; a killed one replays the last `steps` event
    live = master.status().breakdown
    journal.close()

    journal2 = SqliteJournal(tmp_path)
    master2 = Master(config(nodes=1), FakeScheduler(), journal2, clock)
    restored = master2.status()
    assert restored.breakdown.useful_s == pytest.approx(live.useful_s)
    assert restored.breakdown.buckets == pytest.approx(live.buckets)
    assert (restored.committed_step, restored.committed_path) == (2, "/ck/2")
    journal2.close()
