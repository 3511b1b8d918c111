from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from dlrover.common import DLRoverError, SystemClock
from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.launcher.control import FailureReport, Progress, ResourceUsage, RoundAssignment
from dlrover.launcher.grpc_control import GrpcControlPlane
from dlrover.master import MasterClient, MasterConfig, MasterRuntime, create_master
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.scheduler.base import ObservedState
from dlrover.master.scheduler.fake import FakeScheduler


@pytest.fixture
def master() -> Iterator[MasterRuntime]:
    config = MasterConfig(
        backend="external",
        lifecycle=LifecycleConfig(nodes=NodeRange(2, 2), heartbeat_timeout_s=2.0, node_start_timeout_s=None),
        heartbeat_interval_s=0.2,
        tick_interval_s=0.1,
        rendezvous_last_call_s=0.1,
    )
    with create_master(config) as runtime:
        yield runtime


def _plane(runtime: MasterRuntime, name: str) -> GrpcControlPlane:
    return GrpcControlPlane(
        runtime.address,
        runtime.token,
        node_name=name,
        host="localhost",
        local_addr="127.0.0.1",
        min_nodes=2,
        max_nodes=2,
    )


@pytest.mark.integration
def test_two_nodes_register_rendezvous_share_one_store_address_and_see_each_other_finish(master: MasterRuntime) -> None:
    planes = [_plane(master, f"node-{i}") for i in range(2)]
    try:
        ids = [p.register(1).node_id for p in planes]
        assert len(set(ids)) == 2
        rounds = _rounds(planes)
        assert sorted(r.group_rank for r in rounds.values()) == [0, 1]
        assert {r.group_world_size for r in rounds.values()} == {2}
        assert len({(r.master_addr, r.master_port) for r in rounds.values()}) == 1
        assert rounds[0].master_addr == "127.0.0.1"
        assert planes[0].heartbeat(Progress(step=3, samples=96)) == []
        usage = ResourceUsage(cpu_percent=150.0, memory_bytes=3 << 30, gpu_percent=40.0, gpu_memory_bytes=5 << 30)
        assert planes[1].heartbeat(Progress(step=4, resources=usage)) == []
        assert master.master.status().step == 4
        seen = master.master.resources(int(ids[1]))
        assert seen is not None
        assert (seen.cpu_percent, seen.memory_bytes, seen.gpu_percent, seen.gpu_memory_bytes) == (
            150.0,
            3 << 30,
            40.0,
            5 << 30,
        )
        assert master.master.resources(int(ids[0])) is None  # no sample sent, none recorded
        assert planes[0].nodes_waiting() == 0
        # Each node's success is seen by the other (node rank 0 keeps its store open until all are).
        (first, r0), (second, r1) = sorted(((planes[i], r) for i, r in rounds.items()), key=lambda p: p[1].group_rank)
        assert first.finished_ranks(r0) == frozenset()
        second.report_success(r1)
        assert first.finished_ranks(r0) == {1}
        assert first.nodes_waiting() == 0  # a finished node does not end the round
        first.report_success(r0)
        assert second.finished_ranks(r1) == first.finished_ranks(r0) == {0, 1}
        # A round that ends another way (here a node leaves) is seen by a finished node too.
        second.leave()
        assert first.nodes_waiting() >= 1
    finally:
        for p in planes:
            p.close()


def _rounds(planes: list[GrpcControlPlane]) -> dict[int, RoundAssignment]:
    """Each plane's next round, joined at once from threads (the round needs them all)."""
    rounds: dict[int, RoundAssignment] = {}
    errors: list[BaseException] = []

    def join(i: int) -> None:
        try:
            rounds[i] = planes[i].next_round(timeout_s=60)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(len(planes))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 90  # next_round's own bound is 60 s: only a hang gets here
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "next_round hung"
    assert not errors, errors
    return rounds


@pytest.mark.integration
def test_nodes_running_different_numbers_of_workers_get_torchruns_ranks(master: MasterRuntime) -> None:
    planes = [_plane(master, f"node-{i}") for i in range(2)]
    try:
        for plane, nproc in zip(planes, (3, 1), strict=True):
            plane.register(nproc)
        rounds = _rounds(planes)
        by_rank = {rounds[i].group_rank: (rounds[i], nproc) for i, nproc in enumerate((3, 1))}
        (first, first_nproc), (second, _) = by_rank[0], by_rank[1]
        # Node rank 0's workers come first; WORLD_SIZE counts every node's own number.
        assert first.worker_ranks(first_nproc) == (0, 4)
        assert second.worker_ranks(99) == (first_nproc, 4)  # the round says; the argument is no guess
    finally:
        for p in planes:
            p.close()


@pytest.mark.integration
def test_a_round_without_a_worker_layout_is_refused_rather_than_guessed(master: MasterRuntime) -> None:
    from dlrover.rendezvous import RendezvousClient

    plane = _plane(master, "node-0")
    try:
        plane.register(2)
        # A node of an older version: it joins without saying how many workers it runs.
        with MasterClient(master.address, master.token) as old, RendezvousClient(master.address, master.token) as rdzv:
            old_id = str(old.register("old-agent", "localhost").node_id)
            assert rdzv.join(old_id).accepted
            with pytest.raises(DLRoverError, match="no worker layout"):
                plane.next_round(timeout_s=60)
    finally:
        plane.close()


@pytest.mark.integration
def test_failure_report_returns_the_masters_decision(master: MasterRuntime) -> None:
    plane = _plane(master, "node-0")
    try:
        plane.register(1)
        decision = plane.report_failure(FailureReport(0, 1, None, "RuntimeError: boom", 0))
        assert isinstance(decision, Decision)
        assert isinstance(decision.action, ActionKind)
        assert isinstance(decision.kind, FailureKind)
        assert decision.outcome
    finally:
        plane.close()


@pytest.mark.integration
def test_the_agents_max_restarts_is_its_budget_and_a_node_left_out_by_the_check_is_let_go(
    master: MasterRuntime,
) -> None:
    planes = [_plane(master, f"node-{i}") for i in range(2)]
    try:
        node_id = int(planes[0].register(1, max_restarts=2).node_id)
        planes[1].register(1, max_restarts=2)
        assert master.master.node(node_id).max_process_restarts == 2
        answers = [planes[0].report_failure(FailureReport(0, 1, None, "boom", n)) for n in range(3)]
        # The external backend starts no node: two restarts in place, then the node leaves the job
        # (the other node goes on), and nothing claims it is relaunched.
        assert [d.action for d in answers] == [ActionKind.RESTART_PROCESSES] * 2 + [ActionKind.REMOVE_NODE]
        assert [d.outcome.rsplit("; ", 1)[-1] for d in answers[:2]] == [
            f"restart {k} of 2 (--max-restarts)" for k in (1, 2)
        ]
        assert "restarted 2 of 2 times (--max-restarts), no restarts left" in answers[2].outcome
        assert "relaunch" not in answers[2].outcome
        # The network check's report says the agent exits, so no restart is decided for it; the
        # decision names, as enums, the kind the master read in its evidence: a faulty node.
        decision = planes[1].report_failure(FailureReport(-1, 1, None, "probe failed", 0, network_check=True))
        assert decision.action is ActionKind.RELAUNCH_NODE, decision.outcome
        assert decision.kind is FailureKind.HARDWARE
    finally:
        for p in planes:
            p.close()


@pytest.mark.integration
def test_refused_join_is_a_clear_error(master: MasterRuntime) -> None:
    plane = GrpcControlPlane(
        master.address, master.token, node_name="n", host="h", local_addr="127.0.0.1", min_nodes=1, max_nodes=3
    )
    try:
        plane.register(1)
        with pytest.raises(DLRoverError, match="refused"):
            plane.next_round(timeout_s=5)
    finally:
        plane.close()


@pytest.mark.integration
def test_a_node_waiting_for_its_peer_longer_than_the_heartbeat_timeout_stays_alive(master: MasterRuntime) -> None:
    first, second = _plane(master, "early"), _plane(master, "late")
    try:
        first.register(1)
        waited: list[RoundAssignment] = []
        thread = threading.Thread(target=lambda: waited.append(first.next_round(timeout_s=120)))
        thread.start()
        # Let several heartbeat timeouts pass while the first node waits alone.
        with MasterClient(master.address, master.token) as client:
            deadline = time.monotonic() + 60
            while client.job_status().elapsed_s < 3 * master.master.config.lifecycle.heartbeat_timeout_s:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            statuses = {n.name: n for n in client.job_status().nodes}
        assert statuses["early"].state == "running"
        assert statuses["early"].relaunch_count == 0
        second.register(1)
        late_round = second.next_round(timeout_s=60)
        thread.join(60)
        assert waited, "the early node got no round"
        assert {waited[0].group_rank, late_round.group_rank} == {0, 1}
    finally:
        first.close()
        second.close()


@pytest.mark.integration
def test_a_stop_request_ends_the_wait_for_a_round(master: MasterRuntime) -> None:
    plane = _plane(master, "alone")
    polls: list[int] = []

    def stop_after_a_few_polls() -> bool:
        polls.append(1)
        return len(polls) > 3

    try:
        plane.register(1)
        with pytest.raises(DLRoverError, match="stopped while waiting"):
            plane.next_round(timeout_s=120, should_stop=stop_after_a_few_polls)
    finally:
        plane.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.integration
def test_register_waits_for_a_master_that_starts_later_and_gives_up_on_one_that_never_does() -> None:
    from dlrover.common import generate_token

    port, token = _free_port(), generate_token()
    config = MasterConfig(backend="external", port=port, token=token, lifecycle=LifecycleConfig(nodes=NodeRange(1, 1)))
    plane = GrpcControlPlane(
        f"127.0.0.1:{port}", token, node_name="late", host="localhost", local_addr="127.0.0.1", min_nodes=1,
        max_nodes=1, connect_timeout_s=60.0,
    )  # fmt: skip
    registering, starting = threading.Event(), threading.Event()
    runtime = create_master(config)

    def start_later() -> None:
        # The agent starts first, as a node may under a torchrun-style command line.
        registering.wait(timeout=60)
        time.sleep(1.5)
        starting.set()  # before the master serves: a registration can only succeed after this
        runtime.start()

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        registering.set()
        registration = plane.register(1)
        assert starting.is_set()
        assert registration.node_id == "0"
    finally:
        thread.join()
        plane.close()
        runtime.stop()

    nobody = f"127.0.0.1:{_free_port()}"
    stopping = GrpcControlPlane(
        nobody, token, node_name="x", host="localhost", local_addr="127.0.0.1", min_nodes=1, max_nodes=1
    )
    with pytest.raises(DLRoverError, match="stopped while waiting for the master"):
        stopping.register(1, should_stop=lambda: True)
    stopping.close()
    impatient = GrpcControlPlane(
        nobody, token, node_name="x", host="localhost", local_addr="127.0.0.1", min_nodes=1, max_nodes=1,
        connect_timeout_s=0.5,
    )  # fmt: skip
    with pytest.raises(DLRoverError, match=r"did not accept a connection in 0\.5 s"):
        impatient.register(1)
    impatient.close()


@pytest.mark.integration
def test_asking_whether_a_round_has_formed_leaves_registering_unharmed_and_tells_a_formed_one() -> None:
    from dlrover.common import generate_token

    port, token = _free_port(), generate_token()
    config = MasterConfig(backend="external", port=port, token=token, lifecycle=LifecycleConfig(nodes=NodeRange(1, 1)),
                          rendezvous_last_call_s=0.1)  # fmt: skip
    plane = GrpcControlPlane(
        f"127.0.0.1:{port}", token, node_name="early", host="localhost", local_addr="127.0.0.1", min_nodes=1,
        max_nodes=1, connect_timeout_s=60.0,
    )  # fmt: skip
    runtime = create_master(config)
    try:
        # Asked before the master serves (the node stops while waiting for it): the channel the node
        # registers on is untouched, so registering once the master serves succeeds at once.
        with pytest.raises(DLRoverError, match="stopped while waiting for the master"):
            plane.round_has_formed(should_stop=lambda: True)
        runtime.start()
        assert plane.round_has_formed() is False, "no round formed yet"
        plane.register(1)
        plane.next_round(30.0)
        assert plane.round_has_formed() is True
    finally:
        plane.close()
        runtime.stop()


@pytest.mark.integration
def test_a_spare_waits_past_the_round_timeout_and_takes_the_rank_of_a_lost_node() -> None:
    scheduler = FakeScheduler()
    config = MasterConfig(
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), spare_nodes=1, node_start_timeout_s=None),
        heartbeat_interval_s=0.2,
        tick_interval_s=0.1,
        rendezvous_last_call_s=0.1,
    )
    with create_master(config, scheduler=scheduler) as runtime:
        planes = [
            GrpcControlPlane(
                runtime.address,
                runtime.token,
                node_name=f"node-{i}",
                host="localhost",
                local_addr="127.0.0.1",
                min_nodes=1,
                max_nodes=1,
                node_id=i,
            )
            for i in range(2)
        ]
        try:
            for plane in planes:
                plane.register(1)
            assert planes[0].next_round(timeout_s=30).group_rank == 0
            got: list[RoundAssignment] = []
            errors: list[BaseException] = []

            def wait_as_spare() -> None:
                try:
                    got.append(planes[1].next_round(timeout_s=1.0))
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            thread = threading.Thread(target=wait_as_spare, daemon=True)
            thread.start()
            thread.join(3.0)  # three times its round timeout: a spare waits on
            assert thread.is_alive(), errors
            scheduler.set_state(0, ObservedState.FAILED, exit_code=-9)  # node 0's agent is gone
            thread.join(60.0)
            assert not errors, errors
            assert [(r.group_rank, r.group_world_size) for r in got] == [(0, 1)]
            assert runtime.master.node(1).rank == 0
        finally:
            for plane in planes:
                plane.close()


class _RecordingClock(SystemClock):
    """The system clock, keeping every sleep asked of it."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        super().sleep(seconds)


@pytest.mark.integration
def test_a_waiting_node_polls_as_often_as_the_master_paces_it_not_on_a_growing_backoff(
    master: MasterRuntime,
) -> None:
    clock = _RecordingClock()
    early = GrpcControlPlane(
        master.address,
        master.token,
        node_name="early",
        host="localhost",
        local_addr="127.0.0.1",
        min_nodes=2,
        max_nodes=2,
        clock=clock,
    )
    late = _plane(master, "late")
    try:
        early.register(1)
        got: list[RoundAssignment] = []
        waiter = threading.Thread(target=lambda: got.append(early.next_round(timeout_s=60)), daemon=True)
        waiter.start()
        deadline = time.monotonic() + 30
        while len(clock.sleeps) < 8 and time.monotonic() < deadline:  # it has polled a while
            time.sleep(0.05)
        late.register(1)
        late.next_round(timeout_s=60)
        waiter.join(60)
        assert got, "the early node never saw the round"
        # One waiting node: the master asks for its floor (0.05 s) every time; the client's own
        # backoff would have doubled to 0.1, 0.2, 0.4 ...
        polls = clock.sleeps[:8]
        assert len(polls) == 8
        assert max(polls) <= 0.05 + 1e-9, polls
    finally:
        early.close()
        late.close()


@pytest.mark.integration
def test_a_master_without_the_restart_announcement_is_asked_once_and_the_restart_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dlrover.common import GrpcServer, ServerConfig, generate_token
    from dlrover.common.ping import add_ping_service

    token = generate_token()
    server = GrpcServer(ServerConfig(), token)  # serves no rendezvous: AnnounceRestart is UNIMPLEMENTED
    add_ping_service(server)
    with server:
        plane = GrpcControlPlane(
            server.address, token, node_name="a", host="localhost", local_addr="127.0.0.1", min_nodes=1, max_nodes=1
        )
        try:
            with caplog.at_level("WARNING", logger="dlrover.launcher.grpc_control"):
                plane.restarting_for_round(1, 3)
                plane.restarting_for_round(2, 4)  # not asked again
        finally:
            plane.close()
    warned = [r.getMessage() for r in caplog.records if "cannot be told" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "UNIMPLEMENTED" in warned[0]
