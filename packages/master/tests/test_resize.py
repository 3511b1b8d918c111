"""Resizing a running job: the lifecycle core's resize, the master following the backend's
capacity, the local backend's slots, and the front doors (RPC, CLI, Python API)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dlrover.common import ConfigError, ManualClock, RetryPolicy, RpcError, generate_token, write_token_file
from dlrover.diagnosis import ActionKind, FailureKind
from dlrover.master.cli import main
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.journal import MemoryJournal, SqliteJournal, StateJournal
from dlrover.master.lifecycle import JobFinishedError, JobLifecycle, NodeStateError
from dlrover.master.master import Master
from dlrover.master.policy import DefaultFailurePolicy
from dlrover.master.records import LaunchNode, StopNode
from dlrover.master.resize import ResizeError, ResizeRequest, ResizeSource, choose_leaving
from dlrover.master.runtime import MasterRuntime
from dlrover.master.scheduler import (
    AdjustableCapacity,
    FakeScheduler,
    LocalScheduler,
    NodeSpec,
    ObservedState,
    SchedulerError,
    parse_slots,
)
from dlrover.master.states import JobState, NodeState

MakeRuntime = Callable[..., MasterRuntime]
NO_RETRY = RetryPolicy(max_attempts=1, call_timeout_s=20.0, total_timeout_s=20.0)


def lifecycle(min_nodes: int = 1, max_nodes: int = 4, placeable: int | None = None, **kw: object) -> JobLifecycle:
    cfg = LifecycleConfig(nodes=NodeRange(min_nodes, max_nodes), **kw)  # type: ignore[arg-type]
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0)
    life.start(0.0, placeable=placeable)
    return life


def register_pending(life: JobLifecycle, now: float = 0.0) -> None:
    for node_id, node in sorted(life.nodes().items()):
        if node.state is NodeState.PENDING:
            life.register(node_id, f"agent-{node.rank}", f"host-{node.rank}", now)


def scale(target: int, reason: str = "test") -> ResizeRequest:
    return ResizeRequest(target, reason, ResizeSource.SCALE)


# ----------------------------------------------------------------------------- the core


def test_start_launches_what_fits_and_remembers_the_range_as_wanted() -> None:
    life = lifecycle(max_nodes=4, placeable=1)
    assert [n.rank for n in life.live_nodes()] == [0]
    assert (life.target_nodes, life.wanted_nodes) == (1, 4)
    unbounded = lifecycle(max_nodes=3)
    assert (unbounded.target_nodes, len(unbounded.live_nodes())) == (3, 3)


@pytest.mark.parametrize("target", [0, 5, 17])
def test_a_target_outside_the_range_is_refused_naming_value_and_range_and_changes_nothing(target: int) -> None:
    life = lifecycle(min_nodes=1, max_nodes=4)
    before = life.snapshot()
    with pytest.raises(ResizeError, match=rf"resize to {target} node\(s\).*range is 1\.\.4"):
        life.resize(scale(target), 1.0)
    assert life.snapshot() == before


def test_a_target_off_the_node_unit_is_refused() -> None:
    cfg = LifecycleConfig(nodes=NodeRange(2, 6, node_unit=2))
    life = JobLifecycle(cfg, DefaultFailurePolicy(), 0.0)
    life.start(0.0)
    with pytest.raises(ResizeError, match="multiple of node_unit 2"):
        life.resize(scale(3), 1.0)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_malformed_request_is_refused(bad: object) -> None:
    with pytest.raises(ResizeError, match="non-negative integer"):
        ResizeRequest(bad, "x")  # type: ignore[arg-type]
    with pytest.raises(ResizeError, match="reason"):
        ResizeRequest(1, "  ")
    with pytest.raises(ResizeError, match="source must be one of"):
        ResizeRequest(1, "x", "nobody")


def test_growing_launches_the_lowest_free_ranks_and_journals_an_event_with_its_inputs() -> None:
    life = lifecycle(max_nodes=4, placeable=1)
    register_pending(life)
    out = life.resize(scale(3, "more data"), 5.0, placeable=4)
    launches = [e for e in out.effects if isinstance(e, LaunchNode)]
    assert [e.rank for e in launches] == [1, 2]
    (event,) = [e for e in out.events if e.kind == "resize"]
    assert event.data["launched_ranks"] == [1, 2]
    assert (event.data["source"], event.data["reason"], event.data["placeable"]) == ("scale", "more data", 4)
    assert (event.data["previous_target"], event.data["target"], event.data["wanted"]) == (1, 3, 3)
    assert out.job_changed
    assert (life.target_nodes, life.wanted_nodes) == (3, 3)


def test_a_wanted_count_the_backend_cannot_hold_yet_is_kept_and_what_fits_is_launched() -> None:
    life = lifecycle(max_nodes=4, placeable=1)
    out = life.resize(scale(4), 1.0, placeable=2)
    assert [e.rank for e in out.effects if isinstance(e, LaunchNode)] == [1]
    assert (life.target_nodes, life.wanted_nodes) == (2, 4)
    # Room appears: the capacity source grows toward what was wanted, never past it.
    out = life.resize(ResizeRequest(life.wanted_nodes, "room", ResizeSource.CAPACITY), 2.0, placeable=9)
    assert [e.rank for e in out.effects if isinstance(e, LaunchNode)] == [2, 3]
    assert life.target_nodes == 4
    # Nothing changed: a capacity request is silent.
    again = life.resize(ResizeRequest(4, "room", ResizeSource.CAPACITY), 3.0, placeable=9)
    assert again.events == ()
    assert again.effects == ()


def test_shrinking_stops_pending_then_avoided_then_slowest_then_highest_ranks() -> None:
    life = lifecycle(max_nodes=6)
    for node_id in range(5):  # node 5 stays pending
        life.register(node_id, f"a{node_id}", f"host-{node_id}", 0.0)
    life.mark_host_unhealthy("host-1", "a failed health check")
    step_times = {0: 0.2, 2: 0.9, 3: 0.2, 4: 0.2}
    out = life.resize(scale(2), 1.0, pace_s=step_times)
    stopped = [e.node_id for e in out.effects if isinstance(e, StopNode)]
    assert stopped == [5, 1, 2, 4]
    assert all(life.node(n).state is NodeState.REMOVED for n in stopped)
    assert [n.node_id for n in life.live_nodes()] == [0, 3]
    (event,) = [e for e in out.events if e.kind == "resize"]
    assert event.data["leaving_nodes"] == [5, 1, 2, 4]
    assert event.data["pace_s"] == {"0": 0.2, "2": 0.9, "3": 0.2, "4": 0.2}


def test_a_planned_round_of_many_nodes_names_them_all_in_its_data_and_16_in_its_message() -> None:
    life = lifecycle(max_nodes=20)
    register_pending(life)
    out = life.resize(scale(18), 1.0)
    (planned,) = [e for e in out.events if e.kind == "planned_round"]
    assert planned.data == {"nodes": list(range(18))}
    assert planned.message.startswith(f"next round planned for node(s) {', '.join(map(str, range(16)))} and 2 more: ")


def test_choose_leaving_alone_orders_by_the_documented_keys() -> None:
    life = lifecycle(max_nodes=4)
    for node_id in range(4):
        life.register(node_id, f"a{node_id}", f"h{node_id}", 0.0)
    nodes = life.live_nodes()
    assert [n.node_id for n in choose_leaving(nodes, 4, set(), {})] == [3, 2, 1, 0]
    assert [n.node_id for n in choose_leaving(nodes, 2, {"h0"}, {1: 5.0})] == [0, 1]
    assert choose_leaving(nodes, 0, set(), {}) == []


def test_the_nodes_that_stay_restart_for_a_planned_round_without_spending_budgets() -> None:
    life = lifecycle(max_nodes=3)
    register_pending(life)
    resized = life.resize(scale(2), 1.0)
    # The rendezvous is told who the next round is for: it forms once both joined, however slow one is.
    (planned,) = [e for e in resized.events if e.kind == "planned_round"]
    assert planned.data == {"nodes": [0, 1]}
    assert planned.message.startswith("next round planned for node(s) 0, 1: planned round: node(s) 2 left the job")
    (action,) = life.pending_actions(0)
    assert action.kind is ActionKind.RESTART_PROCESSES
    assert "planned round" in action.reason
    assert action.planned_round  # its agent has the workers seal a flash checkpoint first
    # Node 1's workers fail first: their peer on node 2 is gone. That is the planned restart.
    decision, out = life.report_failure(1, FailureKind.UNKNOWN, "gloo: connection closed", 2.0, answered=True)
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert "planned round" in decision.outcome
    assert life.job_failures == 0
    assert life.node(1).process_restarts == 0
    assert life.pending_actions(1) == ()
    assert [e.kind for e in out.events] == ["planned_restart"]
    # Node 0 gets its restart with its heartbeat; a later failure counts as usual.
    actions, _ = life.heartbeat(0, 3.0)
    assert [(a.kind, a.planned_round) for a in actions] == [(ActionKind.RESTART_PROCESSES, True)]
    # The leaving node, if it heartbeats before its stop reaches it, is told it leaves for the
    # resize: its workers save first.
    actions, _ = life.heartbeat(2, 3.0)
    assert [(a.kind, a.planned_round) for a in actions] == [(ActionKind.REMOVE_NODE, True)]
    life.report_failure(0, FailureKind.UNKNOWN, "real", 4.0, answered=True)
    assert life.job_failures == 1


@pytest.mark.parametrize("source", list(ResizeSource))
def test_a_resize_to_the_current_size_changes_nothing_whoever_asks(source: ResizeSource) -> None:
    life = lifecycle(max_nodes=3)
    register_pending(life)
    life.resize(scale(2), 1.0)
    for node_id in (0, 1):
        life.heartbeat(node_id, 2.0)  # the shrink's planned round is delivered
    before = life.snapshot()
    out = life.resize(ResizeRequest(2, "again", source), 3.0)
    assert (out.events, out.effects, out.changed_nodes, out.job_changed) == ((), (), frozenset(), False)
    assert life.snapshot() == before
    assert all(life.pending_actions(n) == () for n in (0, 1))


def test_a_new_wanted_count_with_no_node_to_move_restarts_nothing_and_is_no_resize_event() -> None:
    life = lifecycle(max_nodes=4, placeable=2)
    register_pending(life)
    out = life.resize(scale(3), 1.0, placeable=2)  # wanted 4 -> 3; room for 2, 2 live
    assert out.effects == ()
    assert [e.kind for e in out.events] == ["resize_target"]
    assert (life.target_nodes, life.wanted_nodes) == (2, 3)
    assert life.pending_actions(0) == life.pending_actions(1) == ()


def test_only_never_registered_nodes_leaving_restart_no_running_node() -> None:
    life = lifecycle(max_nodes=3)
    life.register(0, "a0", "h0", 0.0)
    life.register(1, "a1", "h1", 0.0)  # node 2 stays pending
    out = life.resize(scale(2), 1.0)
    assert [e.node_id for e in out.effects if isinstance(e, StopNode)] == [2]
    assert [e.kind for e in out.events] == ["resize", "node_state"]
    assert life.pending_actions(0) == life.pending_actions(1) == ()


def test_a_master_asked_for_its_current_size_answers_without_recording_or_restarting() -> None:
    master, sched = make_master(slots=None)
    master.start()
    for node_id in range(3):
        master.register(node_id, f"n{node_id}", f"h{node_id}")
    before = master.state_digest()
    count = len(master.events(limit=1000))
    for source in (ResizeSource.SCALE, ResizeSource.SCALE, ResizeSource.AUTOSCALER):  # a retried RPC included
        result = master.resize(3, "same size", source)
        assert (result.wanted_nodes, result.target_nodes, result.launched_ranks, result.leaving_nodes) == (3, 3, (), ())
        assert "nothing changed" in result.message
    assert len(master.events(limit=1000)) == count
    assert master.state_digest() == before
    assert sched.stopped == []
    for node_id in range(3):
        actions, _state = master.heartbeat(node_id)
        assert actions == ()


def test_capacity_lost_below_the_minimum_shrinks_and_the_window_stops_the_job() -> None:
    life = lifecycle(min_nodes=2, max_nodes=3, insufficient_nodes_window_s=10.0)
    register_pending(life)
    with pytest.raises(ResizeError):
        life.resize(scale(1), 1.0)  # a person cannot ask for fewer than the minimum
    out = life.resize(ResizeRequest(3, "capacity lost", ResizeSource.CAPACITY), 1.0, placeable=1)
    (event,) = [e for e in out.events if e.kind == "resize"]
    assert "below min_nodes 2" in event.message
    assert life.target_nodes == 1
    assert life.wanted_nodes == 3
    life.tick(5.0)
    assert life.job_state is JobState.RUNNING
    life.tick(12.0)
    assert life.job_state is JobState.FAILED
    assert "insufficient nodes: 1 running < min_nodes 2" in life.exit_reason


def test_pending_nodes_past_the_timeout_are_announced_once() -> None:
    life = lifecycle(max_nodes=3, node_pending_timeout_s=30.0, node_start_timeout_s=None)
    life.register(0, "a", "h", 0.0)
    life.heartbeat(0, 20.0)
    assert not [e for e in life.tick(20.0).events if e.kind == "nodes_pending"]
    life.heartbeat(0, 31.0)
    (event,) = [e for e in life.tick(31.0).events if e.kind == "nodes_pending"]
    assert event.data["nodes"] == [1, 2]
    assert "goes on with the 1 running node(s)" in event.message
    life.heartbeat(0, 32.0)
    assert not [e for e in life.tick(32.0).events if e.kind == "nodes_pending"]


def test_a_finished_or_finishing_job_is_not_resized() -> None:
    life = lifecycle(max_nodes=2)
    register_pending(life)
    life.report_success(0, 1.0)
    with pytest.raises(NodeStateError, match="finishing"):
        life.resize(scale(1), 2.0)
    life.stop("over", 3.0)
    with pytest.raises(JobFinishedError, match="ended"):
        life.resize(scale(1), 4.0)


def test_a_regrown_rank_keeps_its_relaunch_count() -> None:
    life = lifecycle(max_nodes=2, max_relaunches=3)
    register_pending(life)
    life.node_lost(1, "gone", 1.0)  # relaunched: node 2, relaunch count 1
    life.register(2, "b", "h1", 1.0)
    life.resize(scale(1), 2.0)
    out = life.resize(scale(2), 3.0)
    (launch,) = [e for e in out.effects if isinstance(e, LaunchNode)]
    assert (launch.rank, launch.relaunch_count) == (1, 1)


def test_the_target_survives_a_snapshot_round_trip() -> None:
    life = lifecycle(max_nodes=4, placeable=2)
    register_pending(life)
    life.resize(scale(3), 1.0, placeable=2)
    life.resize(scale(1), 2.0)
    snap = life.snapshot()
    resumed = JobLifecycle(life.config, DefaultFailurePolicy(), 100.0, snap)
    assert (resumed.target_nodes, resumed.wanted_nodes) == (1, 1)
    assert resumed.snapshot().planned_round == snap.planned_round


# ------------------------------------------------------------------------- the master


def master_config(nodes: str = "1:3", **kw: object) -> MasterConfig:
    low, high = (int(x) for x in nodes.split(":"))
    lifecycle_config = LifecycleConfig(
        nodes=NodeRange(low, high), heartbeat_timeout_s=10.0, insufficient_nodes_window_s=60.0
    )
    return MasterConfig(job_name="t", lifecycle=lifecycle_config, heartbeat_interval_s=1.0, **kw)  # type: ignore[arg-type]


def make_master(journal: StateJournal | None = None, slots: int | None = 1) -> tuple[Master, FakeScheduler]:
    sched = FakeScheduler()
    sched.slots = slots
    master = Master(master_config(), sched, journal or MemoryJournal(), ManualClock())
    return master, sched


def test_the_master_starts_with_what_fits_and_follows_capacity_up_and_down() -> None:
    master, sched = make_master(slots=1)
    master.start()
    assert sorted(sched.specs) == [0]
    master.register(0, "a", "h0")
    sched.slots = 3
    master.tick()
    assert sorted(sched.specs) == [0, 1, 2]
    assert master.status().target_nodes == 3
    for node_id in (1, 2):
        master.register(node_id, f"n{node_id}", f"h{node_id}")
    sched.slots = 2
    master.tick()
    assert sched.stopped == [2]
    status = master.status()
    assert (status.target_nodes, status.wanted_nodes, status.capacity) == (2, 3, 0)
    kinds = [(e.kind, e.data.get("source")) for e in master.events(limit=1000)]
    assert kinds.count(("resize", "capacity")) == 2
    master.tick()  # nothing changed: no new event
    assert [(e.kind, e.data.get("source")) for e in master.events(limit=1000)].count(("resize", "capacity")) == 2


def test_a_person_resizes_through_the_master_and_a_restarted_master_keeps_the_target(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    master, _sched = make_master(SqliteJournal(path), slots=None)
    master.start()
    for node_id in range(3):
        master.register(node_id, f"n{node_id}", f"h{node_id}")
    result = master.resize(1, "save money")
    assert (result.wanted_nodes, result.target_nodes, result.leaving_nodes) == (1, 1, (2, 1))
    before = master.state_digest()
    with pytest.raises(ResizeError, match="resize to 9 node"):
        master.resize(9, "too many")
    assert master.state_digest() == before
    with pytest.raises(SchedulerError, match="no capacity to set"):
        master.set_capacity(2)
    resumed = Master(master_config(), FakeScheduler(), SqliteJournal(path), ManualClock())
    assert (resumed.status().target_nodes, resumed.status().wanted_nodes) == (1, 1)
    (event,) = [e for e in resumed.events(limit=1000) if e.kind == "resize"]
    assert event.data["reason"] == "save money"


# ------------------------------------------------------------------- the local backend


def node_spec(node_id: int) -> NodeSpec:
    return NodeSpec(job_name="j", node_id=node_id, rank=node_id)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_local_slots_make_launches_wait_and_a_stopping_node_frees_its_slot() -> None:
    backend = LocalScheduler([sys.executable, "-c", "import time; time.sleep(600)"], stop_grace_s=5.0, slots=1)
    try:
        assert isinstance(backend, AdjustableCapacity)
        assert backend.capacity() == 1
        backend.launch(node_spec(0))
        backend.launch(node_spec(1))
        assert backend.capacity() == -1
        seen = backend.observe()
        assert seen[1].state is ObservedState.PENDING
        assert backend.pid(1) is None
        backend.stop(0)
        wait_for(lambda: backend.observe()[1].state is ObservedState.RUNNING)
        assert backend.pid(1) is not None
        assert backend.capacity() == 0
        backend.set_slots(None)
        assert backend.capacity() is None
        with pytest.raises(ConfigError, match="slots must be None"):
            backend.set_slots(-1)
        backend.launch(node_spec(2))
        backend.set_slots(0)
        backend.launch(node_spec(3))
        backend.stop(3)  # never started: observed as stopped
        assert backend.observe()[3].state is ObservedState.STOPPED
    finally:
        backend.close()


def test_the_capacity_file_is_followed_and_bad_content_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "capacity"
    backend = LocalScheduler([sys.executable, "-c", "pass"], slots=2, capacity_file=path)
    try:
        assert backend.slots == 2  # no file yet
        path.write_text("5\n")
        assert backend.slots == 5
        path.write_text("lots")
        assert backend.slots == 5
        assert "'lots' is not a number of slots" in caplog.text
        path.write_text("-3")
        assert backend.slots == 5
        path.write_text("unbounded")
        assert backend.slots is None
    finally:
        backend.close()


def test_a_capacity_in_slots_is_refused_for_a_backend_that_is_not_local() -> None:
    with pytest.raises(ConfigError, match="for the local backend; the external backend reports its own"):
        MasterConfig(backend="external", local_slots=2)
    with pytest.raises(ConfigError, match="local_slots must be a non-negative integer"):
        MasterConfig(local_slots=-1)
    assert MasterConfig(local_slots=0).local_slots == 0


@pytest.mark.parametrize("text", ["x", "-1", "1.5", ""])
def test_parse_slots_refuses_what_is_not_a_count(text: str) -> None:
    with pytest.raises(ConfigError, match="not a number of slots"):
        parse_slots(text)


# ---------------------------------------------------------------- RPC, CLI, Python API


def test_resize_and_capacity_over_grpc_and_the_cli(
    make_runtime: MakeRuntime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlrover.master.client import MasterClient

    rt = make_runtime(nodes=3)
    token_file = write_token_file(tmp_path / "token", rt.token)
    with (
        MasterClient(rt.address, rt.token, policy=NO_RETRY) as c,
        MasterClient(rt.address, rt.token, policy=NO_RETRY) as staying,
    ):
        staying.register("a", "host-a")
        for name in ("b", "c"):
            with MasterClient(rt.address, rt.token, policy=NO_RETRY) as agent:
                agent.register(name, f"host-{name}")
        before = rt.master.state_digest()
        with pytest.raises(RpcError) as info:
            c.resize(4, "too many")
        assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "resize to 4 node(s)" in str(info.value)
        assert "1..3" in str(info.value)
        with pytest.raises(RpcError) as info:
            c.set_capacity(2)  # the external backend has none to set
        assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert rt.master.state_digest() == before
        result = c.resize(2, "smaller")
        assert (result.wanted_nodes, result.target_nodes, result.leaving_nodes, result.placeable) == (2, 2, (2,), None)
        # The node that stays learns over the wire that its restart is a planned round's (its
        # agent has the workers save first).
        answer = staying.heartbeat()
        assert [(a.kind, a.planned_round) for a in answer.actions] == [(ActionKind.RESTART_PROCESSES, True)]
        status = c.job_status()
        assert (status.target_nodes, status.wanted_nodes, status.capacity) == (2, 2, None)
    with MasterClient(rt.address, generate_token(), policy=NO_RETRY) as bad:
        with pytest.raises(RpcError) as info:
            bad.resize(1, "intruder")
        assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
    args = ["--master", rt.address, "--token-file", str(token_file), "--timeout-s", "10"]
    assert main(["scale", "1", *args, "--reason", "from the cli"]) == 0
    assert "from the cli" in capsys.readouterr().out
    assert rt.master.status().target_nodes == 1
    assert main(["scale", "7", *args]) == 1
    assert "range is 1..3" in capsys.readouterr().err
    assert main(["capacity", "2", *args]) == 1
    assert "no capacity to set" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["scale", "many", *args])
    assert exit_info.value.code == 2
    assert "'many' is not a number of nodes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["capacity", "-2", *args])
    assert "not a number of slots" in capsys.readouterr().err
