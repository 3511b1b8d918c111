"""Warm spares (`LifecycleConfig.spare_nodes`, `dlrover-master --spare-nodes`): the lifecycle core,
the master (capacity, the rendezvous, the journal, status) and the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlrover.common import ConfigError, ManualClock, generate_token
from dlrover.diagnosis import ActionKind, FailureKind
from dlrover.master.client import MasterClient
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.factory import create_master
from dlrover.master.hosting import HostedRendezvous
from dlrover.master.journal import JournalBatch, MemoryJournal, SqliteJournal, StateJournal
from dlrover.master.lifecycle import JobLifecycle, LifecycleError, NodeStateError
from dlrover.master.master import Master
from dlrover.master.policy import DefaultFailurePolicy
from dlrover.master.records import LaunchNode, Outcome, PendingWork, StopNode
from dlrover.master.resize import ResizeRequest, ResizeSource
from dlrover.master.scheduler.base import ObservedState
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import JobState, NodeState
from dlrover.master.status import format_status, summarize
from dlrover.rendezvous import PollState, RendezvousConfig, RendezvousManager

pytestmark = pytest.mark.timeout(120)


def make(nodes: int = 2, spares: int = 1, *, min_nodes: int | None = None, placeable: int | None = None,
         **kw: object) -> JobLifecycle:  # fmt: skip
    cfg = LifecycleConfig(nodes=NodeRange(min_nodes or nodes, nodes), spare_nodes=spares, **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0)
    life.start(0.0, placeable=placeable)
    return life


def register_all(life: JobLifecycle, now: float = 0.0) -> None:
    for node_id, node in sorted(life.nodes().items()):
        if node.state is NodeState.PENDING:
            life.register(node_id, f"agent-{node_id}", f"host-{node_id}", now)


def launched(out: Outcome) -> list[tuple[int, int]]:
    """(node id, rank) of every node `out` launches."""
    return [(e.node_id, e.rank) for e in out.effects if isinstance(e, LaunchNode)]


# ----------------------------------------------------------------------------- the core


def test_start_launches_the_ranked_nodes_first_then_the_spares_with_no_rank() -> None:
    life = JobLifecycle(LifecycleConfig(nodes=NodeRange(1, 3), spare_nodes=2), DefaultFailurePolicy(), 0.0)
    out = life.start(0.0)
    launches = launched(out)
    assert launches == [(0, 0), (1, 1), (2, 2), (3, -1), (4, -1)]
    assert [n.node_id for n in life.spare_nodes()] == [3, 4]
    assert all(n.spare and n.rank == -1 for n in life.spare_nodes())
    assert sorted(life.current_nodes()) == [0, 1, 2]  # spares hold no rank
    assert [e.message for e in out.events if e.kind == "node_created"][-1] == (
        "spare node 4 created: 2 of 2 spare(s) fit beside the ranked nodes"
    )


@pytest.mark.parametrize(("placeable", "ranked", "spares"), [(1, 1, 0), (3, 3, 0), (4, 3, 1), (9, 3, 2), (None, 3, 2)])
def test_short_capacity_goes_to_the_ranked_nodes_first(placeable: int | None, ranked: int, spares: int) -> None:
    life = make(3, 2, min_nodes=1, placeable=placeable)
    assert (len(life.live_nodes()), len(life.spare_nodes())) == (ranked, spares)


def test_a_relaunched_node_gives_its_rank_to_a_running_spare_and_a_new_spare_follows() -> None:
    life = make(2, 1)
    register_all(life)
    decision, out = life.node_lost(1, "the agent exited with status -9 (failed)", 1.0)
    assert decision.action is ActionKind.RELAUNCH_NODE
    promoted = life.node(2)
    assert (promoted.rank, promoted.spare, promoted.replaces, promoted.relaunch_count) == (1, False, 1, 1)
    assert promoted.state is NodeState.RUNNING
    assert life.current_nodes()[1].node_id == 2
    assert life.node(1).replaced_by == 2
    assert not [e for e in out.effects if isinstance(e, LaunchNode)], "no node is launched for the rank"
    assert StopNode(1, decision.outcome) in out.effects
    (event,) = [e for e in out.events if e.kind == "spare_promoted"]
    assert event.message.startswith("spare node 2 takes rank 1 of node 1 at the next round: ")
    assert event.data["reason"] == decision.outcome
    assert event.data["replaces"] == 1
    # It says why no spare is launched in its place yet.
    assert "the next spare is launched once it trained a step, or after 30 s" in event.message
    assert event.data["refill_after_s"] == 30.0
    (relaunch,) = [e for e in out.events if e.kind == "relaunch"]
    assert "replaced by spare node 2" in relaunch.message
    assert relaunch.data["spare"] is True
    assert life.spare_nodes() == []
    # The next spare waits until the promoted one trained, so its start-up takes no CPU from the round.
    assert life.keep_spares(2.0).effects == ()
    life.heartbeat(0, 2.2, step=40)  # a node that stayed reports its steps: no matter
    assert life.keep_spares(2.5).effects == ()
    life.heartbeat(2, 2.8, step=40)  # the step its workers restored
    assert life.keep_spares(2.9).effects == ()
    life.heartbeat(2, 3.0, step=41)  # one trained
    refill = life.keep_spares(3.0)
    assert launched(refill) == [(3, -1)]
    assert life.keep_spares(3.5).effects == ()  # idempotent


@pytest.mark.parametrize("refill_after_s", [0.0, 30.0])
def test_a_promoted_spare_that_does_not_train_is_replaced_after_the_refill_wait(refill_after_s: float) -> None:
    life = make(2, 1, spare_refill_after_s=refill_after_s)
    register_all(life)
    life.node_lost(1, "the agent exited with status -9 (failed)", 1.0)
    life.heartbeat(2, 10.0)  # alive, no step yet (its round waits, or its workers restore)
    held = life.keep_spares(10.0)
    if refill_after_s:
        assert held.effects == ()
        refill = life.keep_spares(1.0 + refill_after_s)
    else:
        refill = held  # 0: replaced at once
    assert launched(refill) == [(3, -1)]


def test_a_promoted_spare_holds_back_only_its_own_replacement() -> None:
    life = make(3, 2)
    register_all(life)
    life.node_lost(1, "the agent exited with status -9 (failed)", 1.0)  # spare 3 takes rank 1
    assert life.keep_spares(1.5).effects == ()
    life.node_lost(4, "the spare's agent exited (failed)", 2.0)  # the other spare, never promoted, is lost
    # The lost spare is replaced; the promoted one's replacement still waits.
    assert launched(life.keep_spares(2.5)) == [(5, -1)]
    life.heartbeat(3, 3.0, samples=10)
    assert launched(life.keep_spares(3.5)) == [(6, -1)]


def test_a_promoted_spare_that_fails_before_it_trains_holds_back_no_spare() -> None:
    life = make(2, 1)
    register_all(life)
    life.node_lost(1, "the agent exited with status -9 (failed)", 1.0)
    assert life.keep_spares(1.5).effects == ()
    _, out = life.node_lost(2, "the agent exited with status -9 (failed)", 2.0)  # the promoted spare, before a step
    assert launched(out) == [(3, 1)]
    assert launched(life.keep_spares(2.5)) == [(4, -1)]


def test_the_nodes_that_stay_restart_for_the_spares_round_and_spend_no_budget() -> None:
    life = make(3, 1)
    register_all(life)
    _, lost = life.node_lost(1, "gone", 1.0)
    (planned,) = [e for e in lost.events if e.kind == "planned_round"]
    assert planned.data == {"nodes": [0, 2, 3]}  # the promoted spare too
    for survivor in (0, 2):
        (action,) = life.pending_actions(survivor)
        assert action.kind is ActionKind.RESTART_PROCESSES
        assert action.reason == "planned round: spare node 3 takes rank 1 of node 1"
    assert life.pending_actions(3) == ()  # the promoted spare simply joins the next round
    # Node 0's collective broke before the restart reached it: the failure is that planned restart.
    decision, _ = life.report_failure(0, FailureKind.COMMUNICATION, "peer closed the connection", 1.5, answered=True)
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert "a spare takes a failed node's rank" in decision.outcome
    assert life.node(0).process_restarts == 0
    assert life.pending_actions(0) == ()
    actions, out = life.heartbeat(2, 1.6)
    assert [a.reason for a in actions] == ["planned round: spare node 3 takes rank 1 of node 1"]
    assert [e.kind for e in out.events] == ["planned_restart"]


def test_a_node_whose_workers_restarted_after_the_death_is_not_told_to_restart_again() -> None:
    life = make(3, 1)
    register_all(life)
    life.heartbeat(1, 1.0)  # node 1's last sign of life
    life.report_failure(2, FailureKind.UNKNOWN, "long before", 0.5)  # before it: node 2 is in the old round
    decision, _ = life.report_failure(0, FailureKind.COMMUNICATION, "peer closed the connection", 2.0)
    assert decision.action is ActionKind.RESTART_PROCESSES  # node 0's workers restart already
    life.pending_actions(0)
    life.heartbeat(0, 2.1)  # the restart is delivered
    life.heartbeat(2, 2.1)
    life.node_lost(1, "the agent exited", 3.0)
    assert life.pending_actions(0) == ()
    assert [a.reason for a in life.pending_actions(2)] == ["planned round: spare node 3 takes rank 1 of node 1"]


def test_no_spare_is_promoted_before_it_registered_nor_on_an_avoided_host() -> None:
    life = make(2, 1)
    life.register(0, "a0", "h0", 0.0)
    life.register(1, "a1", "h1", 0.0)
    _, out = life.node_lost(1, "gone", 1.0)  # the spare has not registered: the rank is relaunched
    assert launched(out) == [(3, 1)]
    assert life.node(2).spare
    life.register(2, "spare", "bad-host", 1.0)
    life.mark_host_unhealthy("bad-host", "probe failed")
    life.register(3, "a3", "h3", 1.0)
    _, out = life.node_lost(0, "gone", 2.0)
    assert launched(out) == [(4, 0)]
    assert not [e for e in out.events if e.kind == "spare_promoted"]


def test_a_process_restart_or_a_removal_takes_no_spare() -> None:
    life = make(2, 1, max_relaunches=0)
    register_all(life)
    decision, _ = life.report_failure(0, FailureKind.UNKNOWN, "boom", 1.0)
    assert decision.action is ActionKind.RESTART_PROCESSES
    decision, _ = life.node_lost(0, "gone", 2.0)  # no relaunch left for rank 0: it is let go
    assert decision.action is ActionKind.REMOVE_NODE
    assert life.node(2).spare
    assert life.node(2).state is NodeState.RUNNING


def test_a_lost_spare_is_replaced_until_its_budget_is_spent_and_counts_no_job_failure() -> None:
    life = make(1, 1, max_relaunches=2)
    register_all(life)
    lost = []
    for i in range(2):
        spare = life.spare_nodes()[0]
        if spare.state is NodeState.PENDING:
            life.register(spare.node_id, "s", f"hs{i}", float(i))
        decision, out = life.node_lost(spare.node_id, "the agent exited", float(i) + 0.5)
        assert decision.action is ActionKind.REMOVE_NODE
        assert life.node(spare.node_id).state is NodeState.FAILED
        assert StopNode(spare.node_id, decision.outcome) in out.effects
        lost += [e.message for e in out.events if e.kind == "spare_lost"]
        life.keep_spares(float(i) + 0.6)
    assert "(1 of 2 spare losses per 24h)" in lost[0]
    assert "2 spares lost, max_relaunches x spare_nodes = 2 per 24h: no more spares are launched" in lost[1]
    assert life.spare_nodes() == []
    assert life.spare_failures == 2
    assert life.job_failures == 0
    assert life.job_state is JobState.RUNNING
    # A day after the first loss, it is older than the budget window: a spare is launched again.
    life.heartbeat(0, 86_400.4)
    assert life.keep_spares(86_400.4).effects == ()
    life.heartbeat(0, 86_400.6)
    refill = life.keep_spares(86_400.6)
    assert [n.spare for n in life.spare_nodes()] == [True]
    assert refill.effects
    # A silent spare is lost too (tick), and a spare never "succeeds".
    life2 = make(1, 1, heartbeat_timeout_s=5.0)
    register_all(life2)
    life2.heartbeat(0, 6.0)
    out = life2.tick(6.0)
    assert [e.node_id for e in out.events if e.kind == "spare_lost"] == [1]
    life3 = make(1, 1)
    register_all(life3)
    with pytest.raises(NodeStateError, match="spare"):
        life3.report_success(1, 1.0)


def test_lost_capacity_releases_spares_first_and_growth_promotes_a_spare() -> None:
    life = make(3, 2, min_nodes=1, placeable=3)  # 3 ranked, no room for spares
    assert life.spare_nodes() == []
    out = life.keep_spares(1.0, placeable=5)
    assert [e.rank for e in out.effects if isinstance(e, LaunchNode)] == [-1, -1]
    register_all(life)
    out = life.keep_spares(2.0, placeable=4)  # one slot lost: a spare goes, the ranked nodes stay
    assert [e.message for e in out.events if e.kind == "spare_released"] == [
        "spare node 4 released: the backend has room for 4 node(s) and the 3 ranked node(s) come first: 1 spare(s) fit"
    ]
    assert len(life.live_nodes()) == 3
    assert [n.node_id for n in life.spare_nodes()] == [3]
    life.resize(ResizeRequest(2, "smaller", ResizeSource.SCALE), 3.0, placeable=4)
    out = life.resize(ResizeRequest(3, "bigger", ResizeSource.SCALE), 4.0, placeable=4)
    assert not [e for e in out.effects if isinstance(e, LaunchNode)], "the spare took the new rank"
    assert [e.data["spare"] for e in out.events if e.kind == "spare_promoted"] == [3]
    assert [e.data["nodes"] for e in out.events if e.kind == "planned_round"] == [[0, 1, 3]]
    assert life.node(3).rank == 2
    assert not life.node(3).spare


def test_the_job_ends_when_its_ranked_nodes_succeed_and_its_spares_are_stopped() -> None:
    life = make(1, 1)
    register_all(life)
    out = life.report_success(0, 1.0)
    assert life.job_state is JobState.SUCCEEDED
    assert StopNode(1, "the job ended") in out.effects
    assert life.node(1).state is NodeState.REMOVED


def test_a_restored_lifecycle_keeps_its_spares_and_promotions() -> None:
    life = make(2, 1)
    register_all(life)
    life.node_lost(1, "gone", 1.0)
    life.heartbeat(2, 1.2, samples=64)  # samples are trained ones
    life.keep_spares(1.5)
    again = JobLifecycle(life.config, DefaultFailurePolicy(), 10.0, life.snapshot())
    assert [n.node_id for n in again.spare_nodes()] == [3]
    assert again.current_nodes()[1].node_id == 2
    assert not again.node(2).spare
    assert again.spare_failures == life.spare_failures


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_spare_count_is_refused_with_the_value(bad: object) -> None:
    with pytest.raises(ConfigError, match=f"spare_nodes must be a non-negative integer, got {bad!r}"):
        LifecycleConfig(spare_nodes=bad)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the master


_Made = tuple[Master, FakeScheduler, HostedRendezvous, ManualClock]


def _master(journal: StateJournal | None = None, *, slots: int | None = 3, nodes: int = 2, spares: int = 1,
            clock: ManualClock | None = None) -> _Made:  # fmt: skip
    clock = clock or ManualClock()
    sched = FakeScheduler()
    sched.slots = slots
    config = MasterConfig(
        job_name="spares",
        lifecycle=LifecycleConfig(nodes=NodeRange(nodes, nodes), spare_nodes=spares, node_start_timeout_s=None),
    )
    rdzv = HostedRendezvous(RendezvousManager(RendezvousConfig(min_nodes=nodes, max_nodes=nodes, last_call_s=0)), clock)
    master = Master(config, sched, journal or MemoryJournal(), clock, collaborators=[rdzv], membership=[rdzv])
    return master, sched, rdzv, clock


def test_the_master_keeps_a_spare_out_of_the_rendezvous_and_promotes_it_when_a_node_dies() -> None:
    master, sched, rdzv, clock = _master()
    master.start()
    assert sorted(sched.specs) == [0, 1, 2]
    assert sched.specs[2].rank == -1
    for node_id in (0, 1, 2):
        sched.set_state(node_id, ObservedState.RUNNING)
        master.register(node_id, f"a{node_id}", f"h{node_id}")
    with rdzv.locked() as m:
        assert m.spares == frozenset({"2"})
        for node in ("0", "1", "2"):
            m.join(node, clock.now())
        assert m.poll("0", clock.now()).state is PollState.ASSIGNED
        assert m.poll("2", clock.now()).spare
    status = summarize(master.status())
    assert [(n.node_id, n.rank) for n in status.spares] == [(2, -1)]
    assert status.spare_nodes == 1
    assert "spares: 1 ready of 1 kept (0 starting)" in format_status(status)
    # Node 1's agent dies: the spare takes rank 1, the rendezvous admits it, and once it trained a new
    # spare is launched.
    sched.set_state(1, ObservedState.FAILED, exit_code=-9)
    master.tick()
    assert master.node(2).rank == 1
    assert not master.node(2).spare
    with rdzv.locked() as m:
        assert m.planned == frozenset({"0", "2"})  # the round forms as soon as both joined
    assert 3 not in sched.specs, "the next spare waits until the promoted one trained"
    master.heartbeat(2, step=5)  # the step it restored
    master.tick()
    assert 3 not in sched.specs
    master.heartbeat(2, step=6)
    master.tick()
    with rdzv.locked() as m:
        assert m.spares == frozenset({"3"})
        m.join("0", clock.now())
        assigned = m.poll("2", clock.now())
        assert assigned.state is PollState.ASSIGNED
        assert not assigned.spare
        assert set(m.current_round.members) == {"0", "2"}  # type: ignore[union-attr]
    assert 3 in sched.specs
    assert sched.specs[3].rank == -1
    events = [e.kind for e in master.events(0, 1000)]
    assert "spare_promoted" in events


def test_a_restarted_master_keeps_its_spares_out_of_the_rendezvous(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "master.db")
    master, _sched, _rdzv, clock = _master(journal)
    master.start()
    for node_id in (0, 1, 2):
        master.register(node_id, f"a{node_id}", f"h{node_id}")
    master.flush_state()
    journal.close()
    journal2 = SqliteJournal(tmp_path / "master.db")
    master2, _sched2, rdzv2, _ = _master(journal2, clock=clock)
    assert [n.node_id for n in master2.status().spares] == [2]
    with rdzv2.locked() as m:
        assert m.spares == frozenset({"2"})
    journal2.close()


def test_the_spares_follow_the_capacity_after_the_ranked_nodes() -> None:
    master, sched, _, _ = _master(slots=2)
    master.start()
    assert sorted(sched.specs) == [0, 1]  # no room for the spare
    sched.slots = 3
    master.tick()
    assert sorted(sched.specs) == [0, 1, 2]
    assert sched.specs[2].rank == -1
    sched.slots = 2
    master.tick()
    assert master.node(2).state is NodeState.REMOVED
    assert 2 in sched.stopped
    assert all(master.node(n).state is NodeState.PENDING for n in (0, 1))


def test_the_external_backend_keeps_no_spare() -> None:
    config = MasterConfig(lifecycle=LifecycleConfig(spare_nodes=1))
    with pytest.raises(LifecycleError, match="spare_nodes 1: this job's backend starts no node, so it can keep no"):
        Master(config, FakeScheduler(relaunches_nodes=False), MemoryJournal(), ManualClock())


@pytest.mark.parametrize(
    ("value", "backend", "message"),
    [
        ("-1", "local", "--spare-nodes must be 0 or more, got -1"),
        ("1.5", "local", "--spare-nodes must be a whole number of nodes, got '1.5'"),
        ("1", "external", "spare_nodes 1: this job's backend starts no node, so it can keep no spare"),
    ],
)
def test_the_cli_refuses_a_bad_spare_count(value: str, backend: str, message: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrover.master.cli",
            f"--backend={backend}",
            f"--spare-nodes={value}",
            f"--state-dir={tmp_path / 'state'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr


@pytest.mark.integration
def test_the_status_rpc_carries_the_spares() -> None:
    config = MasterConfig(
        job_name="spares-rpc",
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), spare_nodes=1, node_start_timeout_s=None),
        token=generate_token(),
        tick_interval_s=3600.0,
    )
    runtime = create_master(config, scheduler=FakeScheduler(), clock=ManualClock())
    runtime.start()
    try:
        with MasterClient(runtime.address, runtime.token) as agent:
            agent.register("spare-agent", "h1", node_id=1)
            status = agent.job_status()
        assert status.spare_nodes == 1
        assert [(n.node_id, n.rank, n.state, n.host) for n in status.spares] == [(1, -1, NodeState.RUNNING, "h1")]
        assert [n.node_id for n in status.nodes] == [0]
        assert "spares: 1 ready of 1 kept (0 starting)" in format_status(status)
    finally:
        runtime.stop()


def test_a_spare_whose_agent_exits_is_lost_whatever_its_status() -> None:
    master, sched, _, _ = _master()
    master.start()
    for node_id in (0, 1, 2):
        master.register(node_id, f"a{node_id}", f"h{node_id}")
    sched.set_state(2, ObservedState.SUCCEEDED, exit_code=0)
    master.tick()
    assert master.node(2).state is NodeState.FAILED
    assert master.job_state is JobState.RUNNING
    assert [n.node_id for n in master.status().spares] == [3]  # replaced at once


def test_a_waiting_spare_survives_a_master_restart_in_the_rendezvous(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "master.db")
    master, _sched, rdzv, clock = _master(journal)
    master.start()
    for node_id in (0, 1, 2):
        master.register(node_id, f"a{node_id}", f"h{node_id}")
    with rdzv.locked() as m:
        m.join("2", clock.now())
    master.flush_state()
    journal.close()
    journal2 = SqliteJournal(tmp_path / "master.db")
    _master2, _sched2, rdzv2, _ = _master(journal2, clock=clock)
    with rdzv2.locked() as m:
        polled = m.poll("2", clock.now())
        assert (polled.state, polled.spare) == (PollState.WAITING, True)
    journal2.close()


def test_a_spares_round_after_a_pending_shrink_restart_does_not_wait_for_a_save() -> None:
    life = make(3, 1, min_nodes=1)
    register_all(life)
    life.resize(ResizeRequest(2, "smaller", ResizeSource.SCALE), 1.0)  # node 2 leaves
    (queued,) = life.pending_actions(0)
    assert queued.planned_round  # a resize's round: save first
    # Before node 0 heard of it, node 1 dies and the spare takes its rank: node 0's workers'
    # collective is broken, so its restart must no longer wait for a save they cannot make.
    life.node_lost(1, "the agent exited with status -9 (failed)", 2.0)
    (still,) = life.pending_actions(0)
    assert (still.action_id, still.kind, still.planned_round) == (queued.action_id, queued.kind, False)


class _RecordingJournal(MemoryJournal):
    """The in-memory journal, keeping every batch it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[JournalBatch] = []

    def commit(self, batch: JournalBatch) -> tuple[int, ...]:
        self.batches.append(batch)
        return super().commit(batch)


def test_handing_a_spares_round_to_each_node_journals_that_nodes_row_only() -> None:
    # Every node's queue in the job record made each hand-over rewrite every queue: O(nodes²).
    journal = _RecordingJournal()
    master, sched, _rdzv, clock = _master(journal, slots=None, nodes=6)
    master.start()
    for node_id in range(7):
        sched.set_state(node_id, ObservedState.RUNNING)
        master.register(node_id, f"a{node_id}", f"h{node_id}")
    clock.advance(1.0)
    sched.set_state(1, ObservedState.FAILED, exit_code=-9)
    master.tick()
    assert master.node(6).rank == 1  # the spare took rank 1
    staying = [0, 2, 3, 4, 5]
    assert all(master.pending_actions(i) for i in staying)
    for node_id in staying[:-1]:
        journal.batches.clear()
        actions, _ = master.heartbeat(node_id)
        assert [a.kind for a in actions] == [ActionKind.RESTART_PROCESSES]
        assert [(b.job, dict(b.work)) for b in journal.batches if b.work] == [(None, {node_id: PendingWork()})]
    # A new master reads back what was handed over and what was not.
    master2, *_ = _master(journal, slots=None, nodes=6, clock=clock)
    assert [i for i in staying if master2.pending_actions(i)] == [5]
    assert [a.kind for a in master2.pending_actions(5)] == [ActionKind.RESTART_PROCESSES]


def test_with_no_relaunches_allowed_a_lost_spare_is_not_replaced() -> None:
    life = make(1, 1, max_relaunches=0, budget_window_s=None)
    register_all(life)
    spare = life.spare_nodes()[0]
    if spare.state is NodeState.PENDING:
        life.register(spare.node_id, "s", "hs", 0.1)
    _, out = life.node_lost(spare.node_id, "the agent exited", 0.5)
    [lost] = [e.message for e in out.events if e.kind == "spare_lost"]
    assert lost.endswith("1 spares lost, max_relaunches x spare_nodes = 0: no more spares are launched")
    life.keep_spares(0.6)
    life.keep_spares(1e9)  # no window: the loss counts for ever
    assert life.spare_nodes() == []
