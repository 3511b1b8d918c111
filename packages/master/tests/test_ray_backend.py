"""The Ray backend's decisions on an in-memory cluster: placement, waiting, deaths confirmed before acting."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dlrover.autoscale import Resources
from dlrover.common import ConfigError, ManualClock
from dlrover.common.auth import TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, write_token_file
from dlrover.master.scheduler import (
    NodePlacement,
    NodeShapeLimit,
    NodeSpec,
    ObservedState,
    ReportsChanges,
    SchedulerBackend,
    SchedulerError,
)
from dlrover.master.scheduler.base import REASON_DELETED, REASON_NODE_LOST, REASON_UNSCHEDULABLE
from dlrover.master.scheduler.ray import (
    REASON_ACTOR_DIED,
    REASON_AGENT_START_FAILED,
    AgentFate,
    AgentReport,
    FakeRayCluster,
    RayCluster,
    RayScheduler,
    RaySettings,
)
from dlrover.master.scheduler.ray.backend import dialable_address
from dlrover.master.scheduler.ray.cluster import check_ray_version, check_reachable

pytestmark = pytest.mark.timeout(60)

GIB = 1024**3
COMMAND = ["dlrover-run", "--nnodes=2", "train.py"]


def cluster_with(*names: str, cpus: float = 1.0) -> FakeRayCluster:
    cluster = FakeRayCluster()
    cluster.add_node("head", CPU=0.0, memory=4.0 * GIB)  # a head started with --num-cpus=0
    for name in names:
        cluster.add_node(name, CPU=cpus, memory=8.0 * GIB)
    return cluster


def backend_on(cluster: FakeRayCluster, clock: ManualClock | None = None, **kwargs: object) -> RayScheduler:
    settings = RaySettings(death_confirm_s=5.0, stop_grace_s=2.0)
    return RayScheduler(COMMAND, cluster, settings=settings, clock=clock or ManualClock(), watch=False, **kwargs)  # type: ignore[arg-type]


def spec(node_id: int, **kwargs: object) -> NodeSpec:
    return NodeSpec(job_name="j", node_id=node_id, rank=node_id, **kwargs)  # type: ignore[arg-type]


def running(cluster: FakeRayCluster, node_id: int) -> None:
    cluster.set_fate(node_id, AgentReport(AgentFate.RUNNING))


def test_it_is_every_kind_of_backend_the_master_uses() -> None:
    cluster = cluster_with("a")
    backend = backend_on(cluster)
    assert isinstance(cluster, RayCluster)
    for protocol in (SchedulerBackend, NodePlacement, NodeShapeLimit, ReportsChanges):
        assert isinstance(backend, protocol)
    assert backend.name == "ray"
    assert backend.relaunches_nodes


def test_one_agent_per_ray_node_never_on_a_head_without_cpus() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    assert backend.capacity() == 2
    backend.launch(spec(0))
    backend.launch(spec(1))
    placed = {backend.placed_host(0), backend.placed_host(1)}
    assert placed == {"a", "b"}
    assert cluster.agents[0].request == {"CPU": 1.0}
    assert cluster.agents[0].command == COMMAND
    assert backend.capacity() == 0
    seen = backend.observe()
    assert {n.state for n in seen.values()} == {ObservedState.PENDING}  # actors asked for, not yet running
    running(cluster, 0)
    assert backend.observe()[0].state is ObservedState.RUNNING
    assert backend.observe()[0].host == backend.placed_host(0)


def test_the_node_resources_are_the_actor_request_and_capacity_counts_in_them() -> None:
    cluster = cluster_with("small", cpus=1.0)
    cluster.add_node("big", CPU=8.0, memory=64.0 * GIB, GPU=2.0)
    backend = backend_on(cluster, node_resources=Resources(cpu=4, memory_mb=16384, gpu=1))
    assert backend.capacity() == 1  # only "big" holds 4 CPUs, 16 GiB and a GPU
    backend.launch(spec(0))
    assert backend.placed_host(0) == "big"
    assert cluster.agents[0].request == {"CPU": 4.0, "memory": 16384.0 * 1024 * 1024, "GPU": 1.0}
    assert backend.largest_node() == Resources(cpu=8, memory_mb=65536, gpu=2)


def test_resources_no_node_has_are_refused_naming_what_there_is() -> None:
    backend = backend_on(cluster_with("a", "b"), node_resources=Resources(cpu=2, memory_mb=1024))
    with pytest.raises(ConfigError, match=r"no Ray node can hold an agent asking for CPU 2.*1cpu/8192MiB"):
        backend.check_any_node_fits()


def test_a_node_without_room_waits_and_is_placed_when_a_ray_node_joins() -> None:
    cluster = cluster_with("a")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    backend.launch(spec(1))
    waiting = backend.observe()[1]
    assert waiting.state is ObservedState.PENDING
    assert waiting.reason == REASON_UNSCHEDULABLE
    assert "no Ray node can take node 1" in waiting.evidence
    assert "1 hold this job's agents" in waiting.evidence
    assert backend.placed_host(1) == ""
    assert backend.capacity() == -1  # one node held over the room there is
    cluster.add_node("b", CPU=1.0, memory=8.0 * GIB)
    assert backend.observe()[1].state is ObservedState.PENDING
    assert backend.placed_host(1) == "b"
    assert backend.capacity() == 0


def test_avoided_hosts_are_ray_node_ids() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    backend.launch(spec(0, avoid_hosts=frozenset({"a"})))
    assert backend.placed_host(0) == "b"
    backend.launch(spec(1, avoid_hosts=frozenset({"a"})))
    assert "1 avoided" in backend.observe()[1].evidence


def test_exits_become_succeeded_or_failed_and_free_the_ray_node() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    backend.launch(spec(1))
    cluster.set_fate(0, AgentReport(AgentFate.EXITED, exit_code=0))
    cluster.set_fate(1, AgentReport(AgentFate.EXITED, exit_code=3))
    seen = backend.observe()
    assert (seen[0].state, seen[0].exit_code) == (ObservedState.SUCCEEDED, 0)
    assert (seen[1].state, seen[1].exit_code) == (ObservedState.FAILED, 3)
    assert cluster.agents[0].released
    assert cluster.agents[1].released
    assert backend.capacity() == 2
    cluster.set_fate(1, AgentReport(AgentFate.RUNNING))  # the record stays as it ended
    assert backend.observe()[1].state is ObservedState.FAILED


def test_an_agent_command_that_cannot_start_fails_the_node_with_the_reason() -> None:
    cluster = cluster_with("a")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    cluster.set_fate(0, AgentReport(AgentFate.START_FAILED, error="No such file or directory: 'dlrover-run'"))
    failed = backend.observe()[0]
    assert (failed.state, failed.reason) == (ObservedState.FAILED, REASON_AGENT_START_FAILED)
    assert "dlrover-run" in failed.evidence


def test_a_dead_ray_node_is_a_lost_node_a_disruption_on_that_host() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    running(cluster, 0)
    host = backend.placed_host(0)
    cluster.kill_node(host)
    lost = backend.observe()[0]
    assert (lost.state, lost.reason, lost.host, lost.disruption) == (ObservedState.FAILED, REASON_NODE_LOST, host, True)
    assert f"Ray node {host} died" in lost.evidence
    # The relaunch avoids the lost host and lands on the other node.
    backend.launch(spec(1, avoid_hosts=frozenset({host})))
    assert backend.placed_host(1) not in ("", host)


def test_an_actor_death_is_confirmed_against_the_node_table_before_it_is_decided() -> None:
    clock = ManualClock()
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster, clock=clock)
    backend.launch(spec(0))
    backend.launch(spec(1))
    running(cluster, 0)
    running(cluster, 1)
    # Ray tells of node a's actor's death before its health check marks node a dead: not decided yet.
    host0 = backend.placed_host(0)
    cluster.kill_node(host0, table_knows=False)
    assert backend.observe()[0].state is ObservedState.RUNNING
    clock.advance(2.0)
    cluster.mark_dead(host0)
    lost = backend.observe()[0]
    assert (lost.reason, lost.disruption) == (REASON_NODE_LOST, True)
    # Node 1's actor dies alone (its process killed) while its node lives: after the confirmation window
    # it is the node's own failure, charged.
    cluster.set_fate(1, AgentReport(AgentFate.DIED, error="the actor's worker process was killed"))
    assert backend.observe()[1].state is ObservedState.RUNNING
    clock.advance(4.9)
    assert backend.observe()[1].state is ObservedState.RUNNING
    clock.advance(0.2)
    died = backend.observe()[1]
    assert (died.state, died.reason, died.disruption) == (ObservedState.FAILED, REASON_ACTOR_DIED, False)
    assert "worker process was killed" in died.evidence


def test_an_unreachable_actor_is_asked_again_and_never_charged_for_silence_alone() -> None:
    clock = ManualClock()
    cluster = cluster_with("a")
    backend = backend_on(cluster, clock=clock)
    backend.launch(spec(0))
    cluster.set_fate(0, AgentReport(AgentFate.UNREACHABLE, error="connection reset"))
    assert backend.observe()[0].state is ObservedState.RUNNING  # the recheck answered
    assert cluster.report(0).fate is AgentFate.RUNNING
    # One that stays unreachable keeps running (its agent's heartbeats decide at the master) ...
    cluster.set_fate(0, AgentReport(AgentFate.UNREACHABLE, error="connection reset"))
    cluster.agents[0].recheck_answer = AgentReport(AgentFate.UNREACHABLE, error="still no answer")
    clock.advance(600.0)
    assert backend.observe()[0].state is ObservedState.RUNNING
    # ... until Ray says it died: then the confirmation window runs as for any death on a live node.
    cluster.agents[0].recheck_answer = AgentReport(AgentFate.DIED, error="the actor died")
    assert backend.observe()[0].state is ObservedState.RUNNING
    clock.advance(5.0)
    gone = backend.observe()[0]
    assert (gone.state, gone.reason) == (ObservedState.FAILED, REASON_ACTOR_DIED)


def test_a_waiting_launch_that_cannot_start_when_placed_fails_with_the_reason() -> None:
    cluster = cluster_with("a")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    backend.launch(spec(1))  # waits for room
    cluster.agents[0].report = AgentReport(AgentFate.EXITED, exit_code=0)
    original = cluster.start_agent

    def refuse(launch: object) -> None:
        raise SchedulerError("an actor named like it exists already")

    cluster.start_agent = refuse  # type: ignore[method-assign]
    seen = backend.observe()
    assert (seen[1].state, seen[1].reason) == (ObservedState.FAILED, REASON_AGENT_START_FAILED)
    assert "exists already" in seen[1].evidence
    cluster.start_agent = original  # type: ignore[method-assign]


def test_a_ray_node_whose_agent_is_being_stopped_takes_no_other_until_it_is_gone() -> None:
    cluster = cluster_with("a")
    release = threading.Event()
    stop_agent = cluster.stop_agent

    def slow_stop(node_id: int, grace_s: float) -> None:
        release.wait(30)
        stop_agent(node_id, grace_s)

    cluster.stop_agent = slow_stop  # type: ignore[method-assign]
    backend = backend_on(cluster)
    backend.launch(spec(0))
    running(cluster, 0)
    backend.stop(0)
    assert backend.capacity() == 1  # told to stop: it holds no room (the Protocol's capacity)
    backend.launch(spec(1))
    assert backend.observe()[1].reason == REASON_UNSCHEDULABLE  # but its agent still runs there
    release.set()
    deadline = threading.Event()
    while backend.placed_host(1) != "a" and not deadline.wait(0.01):
        backend.observe()
    assert backend.placed_host(1) == "a"
    backend.close()


def test_agents_on_other_hosts_are_not_told_a_loopback_master() -> None:
    cluster = FakeRayCluster(driver_address="10.0.0.1")
    cluster.add_node("far", address="10.0.0.2", CPU=1.0)
    backend = backend_on(cluster)
    with pytest.raises(SchedulerError, match=r"cannot dial: start the master with --bind-address 0\.0\.0\.0"):
        backend.launch(spec(0, env={"DLROVER_MASTER_ADDR": "127.0.0.1:5000"}))
    assert 0 not in cluster.agents
    # A wildcard bind is told as the address of the master's Ray node.
    cluster.add_node("near", address="10.0.0.1", CPU=1.0)
    backend.launch(spec(1, env={"DLROVER_MASTER_ADDR": "0.0.0.0:5000"}))
    assert cluster.agents[1].env["DLROVER_MASTER_ADDR"] == "10.0.0.1:5000"


def test_stop_signals_the_agent_with_the_grace_and_a_waiting_node_just_stops() -> None:
    cluster = cluster_with("a")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    backend.launch(spec(1))  # waits: no room
    running(cluster, 0)
    backend.stop(0)
    backend.stop(0)
    backend.stop(1)
    backend.stop(42)
    seen = backend.observe()
    assert seen[0].state is ObservedState.STOPPED
    assert seen[1].state is ObservedState.STOPPED
    backend.close()
    assert cluster.agents[0].stopped_with_grace == 2.0
    assert 1 not in cluster.agents  # never placed, nothing started
    assert cluster.closed


def test_close_stops_every_running_agent_and_is_idempotent() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    backend.launch(spec(1))
    running(cluster, 0)
    backend.close()
    backend.close()
    assert all(agent.stopped_with_grace == 2.0 for agent in cluster.agents.values())
    assert {n.state for n in backend.observe().values()} == {ObservedState.STOPPED}
    with pytest.raises(SchedulerError, match="closed"):
        backend.launch(spec(2))


def test_a_duplicate_launch_is_refused_and_changes_nothing() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    with pytest.raises(SchedulerError, match="node 0 was already launched"):
        backend.launch(spec(0))
    assert list(cluster.agents) == [0]


def test_the_agent_gets_the_token_itself_not_a_file_path_of_the_masters_host(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    write_token_file(token_file, "s3cret-token-0123456789abcdef")
    cluster = cluster_with("a")
    settings = RaySettings(log_dir=str(tmp_path / "logs"))
    backend = RayScheduler(COMMAND, cluster, settings=settings, clock=ManualClock(), watch=False)
    backend.launch(spec(0, env={TOKEN_FILE_ENV_VAR: str(token_file), "DLROVER_MASTER_ADDR": "10.0.0.1:5000"}))
    env = cluster.agents[0].env
    assert TOKEN_FILE_ENV_VAR not in env
    assert env[TOKEN_ENV_VAR] == "s3cret-token-0123456789abcdef"
    assert env["DLROVER_MASTER_ADDR"] == "10.0.0.1:5000"
    assert cluster.agents[0].log_path == str(tmp_path / "logs" / "node-0.log")


def test_the_watch_wakes_the_master_on_agent_exits_and_node_changes() -> None:
    cluster = cluster_with("a")
    backend = RayScheduler(COMMAND, cluster, settings=RaySettings(poll_interval_s=0.05), clock=ManualClock())
    woken = threading.Event()
    backend.on_change(woken.set)
    try:
        backend.launch(spec(0))
        woken.clear()
        cluster.set_fate(0, AgentReport(AgentFate.EXITED, exit_code=0))
        assert woken.wait(30)
        woken.clear()
        cluster.add_node("b", CPU=1.0)
        assert woken.wait(30)
    finally:
        backend.close()


def test_bad_settings_and_addresses_are_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="agent command"):
        RayScheduler([], cluster_with("a"), watch=False)
    with pytest.raises(ConfigError, match="address"):
        RaySettings(address="  ")
    with pytest.raises(ConfigError, match="connect_timeout_s"):
        RaySettings(connect_timeout_s=0)
    with pytest.raises(ConfigError, match=r"Ray 2\.3\.1 is not supported.*2\.40"):
        check_ray_version("2.3.1")
    with pytest.raises(ConfigError, match=r"Ray 3\.0\.0 is not supported"):
        check_ray_version("3.0.0")
    check_ray_version("2.60.0")
    with pytest.raises(ConfigError, match=r"no Ray cluster at 127\.0\.0\.1:1"):
        check_reachable("127.0.0.1:1", 5.0)
    with pytest.raises(ConfigError, match="no port number"):
        check_reachable("head:http", 5.0)


def test_agents_dial_a_master_bound_to_every_interface_at_this_hosts_address() -> None:
    assert dialable_address("127.0.0.1:5000") == "127.0.0.1:5000"
    host, _, port = dialable_address("0.0.0.0:5000").rpartition(":")
    assert port == "5000"
    assert host not in ("0.0.0.0", "")
    cluster = cluster_with("a")
    settings = RaySettings(master_address="head.example:7000")
    backend = RayScheduler(COMMAND, cluster, settings=settings, watch=False)
    backend.launch(spec(0, env={"DLROVER_MASTER_ADDR": "0.0.0.0:5000"}))
    assert cluster.agents[0].env["DLROVER_MASTER_ADDR"] == "head.example:7000"


def test_a_closed_backend_answers_from_what_it_saw_last_without_the_cluster() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    backend.launch(spec(0))
    backend.close()
    cluster.add_node("c", CPU=1.0)  # no longer read: the connection is gone after close
    assert backend.capacity() == 2
    assert backend.observe()[0].state is ObservedState.STOPPED


def test_nodes_a_previous_master_left_are_disruptions_at_once_and_others_are_followed() -> None:
    cluster = cluster_with("a", "b")
    backend = backend_on(cluster)
    backend.launch(spec(5))
    backend.adopt([3, 4, 5])  # 3 and 4 ran under the previous master; 5 is this backend's own
    seen = backend.observe()
    for node_id in (3, 4):
        assert (seen[node_id].state, seen[node_id].reason, seen[node_id].disruption) == (
            ObservedState.FAILED,
            REASON_DELETED,
            True,
        )
        assert "previous master's Ray driver" in seen[node_id].evidence
    assert seen[5].state is ObservedState.PENDING
    with pytest.raises(SchedulerError, match="node 3 was already launched"):
        backend.launch(spec(3))
    backend.stop(3)  # nothing runs: a no-op
    assert backend.observe()[3].state is ObservedState.FAILED


def test_a_restarted_master_relaunches_the_nodes_its_ray_driver_took_along_without_a_charge(tmp_path: Path) -> None:
    from dlrover.master import LifecycleConfig, Master, MasterConfig, NodeRange, NodeState
    from dlrover.master.journal import SqliteJournal

    def master_on(journal: SqliteJournal, cluster: FakeRayCluster, clock: ManualClock) -> Master:
        config = MasterConfig(
            job_name="j",
            lifecycle=LifecycleConfig(nodes=NodeRange(2, 2), node_start_timeout_s=None, max_job_failures=0),
        )
        return Master(config, backend_on(cluster, clock), journal, clock)

    clock = ManualClock()
    journal = SqliteJournal(tmp_path / "master.db")
    first = master_on(journal, cluster_with("a", "b"), clock)
    first.start()
    for node_id in (0, 1):
        first.register(node_id, f"agent{node_id}", f"h{node_id}")
    first.flush_state()
    journal.close()
    # The master's process ends (and Ray ends the actors it owned); a new one resumes from the journal.
    journal2 = SqliteJournal(tmp_path / "master.db")
    cluster2 = cluster_with("a", "b")
    second = master_on(journal2, cluster2, clock)
    try:
        second.tick()
        for node_id in (0, 1):
            assert second.node(node_id).state is not NodeState.RUNNING
        relaunched = sorted(cluster2.agents)
        assert len(relaunched) == 2, relaunched
        assert all(second.node(n).rank in (0, 1) for n in relaunched)
        assert second.status().job_failures == 0
        kinds = [e.kind for e in second.events(0, 1000)]
        assert "failure" not in kinds, kinds
    finally:
        journal2.close()


def test_a_loopback_master_places_agents_on_its_own_host_and_a_waiting_node_is_never_charged_for_it() -> None:
    loopback = {"DLROVER_MASTER_ADDR": "127.0.0.1:5000"}
    cluster = FakeRayCluster(driver_address="10.0.0.1")
    cluster.add_node("far", address="10.0.0.2", CPU=1.0)
    cluster.add_node("near", address="10.0.0.1", CPU=1.0)
    backend = backend_on(cluster)
    backend.launch(spec(0, env=loopback))
    assert backend.placed_host(0) == "near", "the Ray node the master's agents can dial, though 'far' sorts first"
    # A node waiting for room when room appears only on another host: it waits on, saying why, uncharged.
    cluster = FakeRayCluster(driver_address="10.0.0.1")
    cluster.add_node("near", address="10.0.0.1", CPU=1.0)
    backend = backend_on(cluster)
    backend.launch(spec(0, env=loopback))
    running(cluster, 0)
    backend.launch(spec(1, env=loopback))
    assert backend.placed_host(1) == ""
    cluster.add_node("far", address="10.0.0.2", CPU=1.0)
    waiting = backend.observe()[1]
    assert (waiting.state, waiting.reason) == (ObservedState.PENDING, REASON_UNSCHEDULABLE)
    assert "cannot dial: start the master with --bind-address 0.0.0.0" in waiting.evidence, waiting.evidence
    assert 1 not in cluster.agents
