"""The master's services over real gRPC on 127.0.0.1: authentication, node identity, every RPC."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dlrover.common import RetryPolicy, RpcError, generate_token
from dlrover.diagnosis import ActionKind, FailureKind, PeerExcuse, RankStepStats
from dlrover.master.client import CheckpointStepsAnswer, MasterClient, StopAnswer
from dlrover.master.eventlog import read_event_log
from dlrover.master.goodput import AttemptReport, StepMark
from dlrover.master.journal import JournaledEvent
from dlrover.master.runtime import MasterRuntime
from dlrover.master.states import JobState, NodeState
from dlrover.master.status import JobSummary
from dlrover.master.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.integration

MakeRuntime = Callable[..., MasterRuntime]

NO_RETRY = RetryPolicy(max_attempts=1, call_timeout_s=20.0, total_timeout_s=20.0)


def client(runtime: object, token: str | None = None) -> MasterClient:
    return MasterClient(runtime.address, token or runtime.token, policy=NO_RETRY)  # type: ignore[attr-defined]


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(RpcError) as info:
        call()  # type: ignore[operator]
    return info.value.code


def test_register_heartbeat_report_and_status(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(nodes=2)
    with client(rt) as a, client(rt) as b:
        ra = a.register("agent-a", "host-a", local_world_size=2)
        rb = b.register("agent-b", "host-b")
        assert (ra.rank, rb.rank) == (0, 1)
        assert ra.node_credential != rb.node_credential
        assert ra.heartbeat_timeout_s == rt.master.config.lifecycle.heartbeat_timeout_s
        assert a.heartbeat(step=5, samples=50).job_state == "running"
        decision = b.report_failure(FailureKind.UNKNOWN, "Traceback ... exit 1")
        assert decision.action is ActionKind.RESTART_PROCESSES
        # The reply delivered the restart; the next heartbeat does not order it again.
        assert list(b.heartbeat(step=1).actions) == []
        assert a.report_checkpoint_steps(2, {0: [3]}) == CheckpointStepsAnswer(None, None)
        assert b.report_checkpoint_steps(2, {1: [3]}) == CheckpointStepsAnswer(complete_step=3, committed_step=None)
        assert a.commit_checkpoint(3, "/ck/3") == 3
        assert a.report_checkpoint_steps(2, {0: [3, 4]}) == CheckpointStepsAnswer(complete_step=3, committed_step=3)
        status = a.job_status()
        assert isinstance(status, JobSummary)
        assert status.state is JobState.RUNNING
        assert status.committed_step == 3
        assert [n.rank for n in status.nodes] == [0, 1]
        assert status.nodes[0].step == 5
        assert status.nodes[0].state is NodeState.RUNNING
        events = a.list_events(limit=1000)
        assert all(isinstance(e, JournaledEvent) for e in events)
        # The client's events are the master's own, data included.
        assert events == rt.master.events(limit=1000)
        kinds = [e.kind for e in events]
        assert "process_restart" in kinds
        assert "checkpoint" in kinds
        assert a.stop_job("done testing") == StopAnswer(JobState.STOPPED, "done testing")
        stop_action = a.heartbeat().actions[0]
        assert stop_action.kind is ActionKind.REMOVE_NODE


def test_wrong_or_missing_token_is_refused_and_changes_nothing(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    before = rt.master.state_digest()
    with client(rt, token=generate_token()) as bad:
        assert code_of(lambda: bad.register("x", "h")) is grpc.StatusCode.UNAUTHENTICATED
        assert code_of(bad.job_status) is grpc.StatusCode.UNAUTHENTICATED
        assert code_of(lambda: bad.stop_job("no")) is grpc.StatusCode.UNAUTHENTICATED
    channel = grpc.insecure_channel(rt.address)
    try:
        stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as info:
            stub.RegisterNode(agent_pb2.RegisterNodeRequest(node_name="x", host="h"), timeout=20)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    assert rt.master.state_digest() == before


def test_a_node_cannot_report_for_another(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(nodes=2)
    with client(rt) as a, client(rt) as b:
        a.register("agent-a", "host-a")
        rb = b.register("agent-b", "host-b")
        before = rt.master.state_digest()
        # a's credential, b's node id in the request.
        assert code_of(lambda: a.heartbeat(node_id=rb.node_id)) is grpc.StatusCode.PERMISSION_DENIED
        assert (
            code_of(lambda: a.report_failure(FailureKind.HARDWARE, "lies", node_id=rb.node_id))
            is grpc.StatusCode.PERMISSION_DENIED
        )
        assert code_of(lambda: a.report_success(node_id=rb.node_id)) is grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: a.commit_checkpoint(1, node_id=rb.node_id)) is grpc.StatusCode.PERMISSION_DENIED
        # b's id with a's credential in metadata: the credential does not match the id.
        a.set_identity(rb.node_id, a.credential or "")
        assert code_of(a.heartbeat) is grpc.StatusCode.UNAUTHENTICATED
        # Taking over b's registration needs b's credential.
        with client(rt) as c:
            assert (
                code_of(lambda: c.register("agent-b", "host-b", node_id=rb.node_id)) is grpc.StatusCode.ALREADY_EXISTS
            )
        assert rt.master.state_digest() == before
        # b itself may reconnect (after a lost answer or a master restart).
        with client(rt) as b2:
            b2.set_identity(rb.node_id, rb.node_credential)
            assert b2.register("agent-b", "host-b", node_id=rb.node_id).rank == rb.rank


def test_calls_without_identity_are_unauthenticated(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    with client(rt) as a:
        a.register("agent-a", "host-a")
        anonymous = client(rt)
        try:
            before = rt.master.state_digest()
            assert code_of(lambda: anonymous.heartbeat(node_id=0)) is grpc.StatusCode.UNAUTHENTICATED
            assert code_of(lambda: anonymous.report_checkpoint_steps(1, {0: [1]}, node_id=0)) is (
                grpc.StatusCode.UNAUTHENTICATED
            )
            assert rt.master.state_digest() == before
        finally:
            anonymous.close()


def test_an_agents_max_restarts_is_its_nodes_restart_budget(make_runtime: MakeRuntime) -> None:
    # The external backend relaunches nothing, so a failing node restarts in place up to its
    # agent's --max-restarts, and only a node whose agent exits anyway is let go at once.
    from dlrover.diagnosis import NODE_CHECK_FAILED

    rt = make_runtime(nodes=2)
    with client(rt) as a, client(rt) as b:
        before = rt.master.state_digest()
        assert code_of(lambda: a.register("agent-a", "host-a", max_restarts=-1)) is grpc.StatusCode.INVALID_ARGUMENT
        assert rt.master.state_digest() == before
        reg = a.register("agent-a", "host-a", max_restarts=4)
        b.register("agent-b", "host-b", max_restarts=4)
        assert rt.master.node(reg.node_id).max_process_restarts == 4
        answers = [a.report_failure(FailureKind.UNKNOWN, "exit code 1", exit_code=1) for _ in range(5)]
        assert [r.action for r in answers] == [ActionKind.RESTART_PROCESSES] * 4 + [ActionKind.REMOVE_NODE]
        assert [r.outcome.rsplit("; ", 1)[-1].split(",")[0] for r in answers[:4]] == [
            f"restart {k} of 4 (--max-restarts)" for k in (1, 2, 3, 4)
        ]
        assert "restarted 4 of 4 times (--max-restarts), no restarts left" in answers[-1].outcome
        assert "relaunch" not in answers[-1].outcome
        left_out = b.report_failure(
            FailureKind.COMMUNICATION, f"{NODE_CHECK_FAILED}: the network check left this node out", agent_exits=True
        )
        assert left_out.action is ActionKind.RELAUNCH_NODE


NCCL_TIMEOUT = (
    "local rank 0 exited with exit code 1\n"
    "[rank0]:[E1121 04:18:03 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600048 milliseconds before timing out.\n"
)


def test_the_stop_reason_answered_is_the_one_in_the_status_and_the_event_log(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    # A standalone job: one node, the external backend, its agent's --max-restarts=2.
    events = f"{tmp_path}/events.jsonl"
    rt = make_runtime(nodes=1, event_log=events)
    with client(rt) as a:
        a.register("agent-a", "host-a", max_restarts=2)
        answers = [a.report_failure(FailureKind.UNKNOWN, NCCL_TIMEOUT, exit_code=1) for _ in range(3)]
        assert [r.action for r in answers] == [ActionKind.RESTART_PROCESSES] * 2 + [ActionKind.ABORT_JOB]
        assert answers[1].outcome.endswith("; restart 2 of 2 (--max-restarts)")
        reason = answers[-1].outcome
        assert reason.startswith("node 0 (rank 0) failed with exit status 1: communication: ")
        assert "Watchdog caught collective operation timeout" in reason
        assert "restarted 2 of 2 times (--max-restarts), no restarts left" in reason
        assert reason.endswith("no node is left: the job stops")
        assert "relaunch" not in reason
        assert "replace" not in reason
        status = a.job_status()
        assert (status.state, status.exit_reason) == ("failed", reason)
        listed = list(a.list_events(limit=1000))
    # No node was said to be created or relaunched for the rank: nothing here would start one.
    assert [e.kind for e in listed].count("node_created") == 1  # the job's start
    assert "relaunch" not in [e.kind for e in listed]
    ends = [e.message for e in listed if e.kind == "job_end"]
    assert ends == [f"job failed: {reason}"]
    assert [e["message"] for e in read_event_log(events) if e["kind"] == "job_end"] == ends


def test_refusals_map_to_clear_status_codes(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(nodes=1)
    with client(rt) as a, client(rt) as b:
        a.register("agent-a", "host-a")
        assert code_of(lambda: b.register("agent-b", "host-b")) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert code_of(lambda: b.register("agent-b", "host-b", node_id=77)) is grpc.StatusCode.NOT_FOUND
        assert code_of(lambda: b.register("", "host-b")) is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(RpcError, match="node_name must be printable"):
            b.register("bad\x00name", "h")
        with pytest.raises(RpcError, match="rank 5 is outside the world of size 1"):
            a.report_checkpoint_steps(1, {5: [1]})
        assert code_of(lambda: a.commit_checkpoint(9)) is grpc.StatusCode.FAILED_PRECONDITION
        assert a.report_success() == "succeeded"
        assert code_of(lambda: a.report_failure(FailureKind.HOST_OOM, "late")) is grpc.StatusCode.FAILED_PRECONDITION


def test_heartbeat_step_stats_reach_the_master_and_bad_ones_are_refused(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(nodes=1)
    with client(rt) as a:
        a.register("agent-a", "host-a", local_world_size=2)
        good = [
            RankStepStats(rank=0, steps=3, samples=12, median_step_s=0.5, since_step_s=0.1, phase="train"),
            RankStepStats(
                rank=1,
                steps=3,
                samples=12,
                median_step_s=0.5,
                since_step_s=0.2,
                median_sync_lead_s=0.3,
                steps_per_mark=5.0,
                sync_group=1,
            ),
        ]
        assert a.heartbeat(step=3, rank_steps=good).job_state == "running"
        # The client cannot build bad stats; a peer that sends them on the wire is refused.
        for bad in (
            agent_pb2.RankStepStats(rank=-1, steps=1),
            agent_pb2.RankStepStats(rank=0, steps=1, since_step_s=float("nan")),
            agent_pb2.RankStepStats(rank=0, steps=-4),
            agent_pb2.RankStepStats(rank=0, steps=1, median_sync_lead_s=-0.5),
            agent_pb2.RankStepStats(rank=0, steps=1, steps_per_mark=0.5),
            agent_pb2.RankStepStats(rank=0, steps=1, sync_group=-2),
        ):
            request = agent_pb2.HeartbeatRequest(node_id=a.node_id, rank_steps=[bad])
            call = lambda r=request: a._call(a._agent.Heartbeat, r, idempotent=False)  # noqa: E731
            assert code_of(call) is grpc.StatusCode.INVALID_ARGUMENT


def test_a_nodes_hang_excuse_reaches_the_other_nodes_with_their_heartbeat_answers(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(nodes=2)
    clock = rt.master._clock  # the fixture's ManualClock
    with client(rt) as a, client(rt) as b:
        a.register("agent-a", "host-a", local_world_size=1)
        b.register("agent-b", "host-b", local_world_size=1)
        assert b.heartbeat().peer_excuses == ()  # nobody excuses anything yet
        evaluating = PeerExcuse(2.0, 1798.0, "rank 0 in phase 'eval'")
        assert a.heartbeat(excuses=[evaluating]).peer_excuses == ()  # never its own
        clock.advance(5.0)
        assert b.heartbeat().peer_excuses == (PeerExcuse(7.0, 1793.0, "rank 0 in phase 'eval'"),)
        # A peer that sends nonsense on the wire is refused, and nothing changes: the excuse it had stays.
        fine = agent_pb2.HangExcuse(began_s_ago=1.0, remaining_s=1.0)
        for bad in (
            [agent_pb2.HangExcuse(began_s_ago=-1.0, remaining_s=1.0)],
            [fine, agent_pb2.HangExcuse(began_s_ago=1.0, remaining_s=float("inf"))],
            [agent_pb2.HangExcuse(began_s_ago=1.0, remaining_s=30 * 24 * 3600.0)],
            [fine] * 65,  # more than a node has ranks to excuse
        ):
            request = agent_pb2.HeartbeatRequest(node_id=a.node_id, excuses=bad)
            call = lambda r=request: a._call(a._agent.Heartbeat, r, idempotent=False)  # noqa: E731
            assert code_of(call) is grpc.StatusCode.INVALID_ARGUMENT
        assert b.heartbeat().peer_excuses == (PeerExcuse(7.0, 1793.0, "rank 0 in phase 'eval'"),)
        a.heartbeat()  # its rank trains again
        assert b.heartbeat().peer_excuses == ()


def test_step_marks_and_saver_commits_reach_the_status(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(nodes=1)
    clock = rt.master._clock  # the fixture's ManualClock
    with client(rt) as a:
        a.register("agent-a", "host-a", local_world_size=2)
        t0 = clock.wall_time()
        marks = tuple(StepMark(step, t0 + step, 0.0, 8 * step) for step in range(1, 5))
        report = AttemptReport(node_id=0, attempt=1, rank=0, ready_time=t0, marks=marks)
        clock.advance(4.0)
        assert a.heartbeat(step=4, samples=32, attempts=[report]).job_state == "running"
        # A saver committed step 4 of 2 ranks itself: recorded without held-step reports.
        assert a.commit_checkpoint(4, "/ck/4", world_size=2) == 4
        assert a.commit_checkpoint(2, "/ck/2", world_size=2) == 4  # older: changes nothing
        status = a.job_status()
        assert (status.committed_step, status.committed_path) == (4, "/ck/4")
        assert status.useful_s == pytest.approx(4.0)
        assert {name for name, _ in status.goodput_buckets} >= {"startup", "steps_redone", "checkpoint_save"}
        assert status.useful_s + sum(seconds for _, seconds in status.goodput_buckets) == pytest.approx(
            status.elapsed_s
        )
        before = rt.master.state_digest()
        for bad in (
            agent_pb2.AttemptReport(attempt=1, rank=0, marks=[agent_pb2.StepMark(step=-1, end_time=1.0)]),
            agent_pb2.AttemptReport(attempt=1, rank=0, ready_time=float("nan")),
            agent_pb2.AttemptReport(attempt=-1, rank=0),
        ):
            request = agent_pb2.HeartbeatRequest(node_id=a.node_id, attempts=[bad])
            call = lambda r=request: a._call(a._agent.Heartbeat, r, idempotent=False)  # noqa: E731
            assert code_of(call) is grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: a.commit_checkpoint(5, "/ck/5", world_size=-2)) is grpc.StatusCode.INVALID_ARGUMENT
        assert rt.master.state_digest() == before


class _LostReply(grpc.RpcError):
    """What a caller sees when the master handled its call but the answer never arrived."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the answer was lost on the way back (scripted)"


def test_a_registration_whose_answer_was_lost_is_retried_and_gets_the_node_it_registered(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime(nodes=2)
    retrying = RetryPolicy(max_attempts=3, call_timeout_s=20.0, total_timeout_s=60.0)
    with MasterClient(rt.address, rt.token, policy=retrying) as agent:
        real = agent._agent.RegisterNode
        answers: list[agent_pb2.RegisterNodeResponse] = []

        def lose_the_first_answer(request: agent_pb2.RegisterNodeRequest, **kw: object) -> object:
            answer = real(request, **kw)
            answers.append(answer)
            if len(answers) == 1:
                raise _LostReply()
            return answer

        agent._agent.RegisterNode = lose_the_first_answer
        registration = agent.register("agent-a", "host-a")
        first, second = answers
        # The repeat was the same registration: the same node, rank and credential, one node taken.
        assert (second.node_id, second.rank, second.node_credential) == (
            first.node_id,
            first.rank,
            first.node_credential,
        )
        assert registration.node_id == first.node_id
        assert [e.kind for e in rt.master.events(limit=100)].count("node_state") == 1
        assert sum(n.registered for n in rt.master.nodes().values()) == 1
        assert agent.heartbeat(step=1).job_state == "running"


def test_only_the_same_registration_key_repeats_a_registration_and_a_malformed_one_is_refused(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime(nodes=3)
    auth = [("authorization", f"Bearer {rt.token}")]
    with grpc.insecure_channel(rt.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]

        def register(key: str) -> agent_pb2.RegisterNodeResponse:
            request = agent_pb2.RegisterNodeRequest(node_name="a", host="h", registration_key=key)
            return stub.RegisterNode(request, metadata=auth, timeout=20)  # type: ignore[no-any-return]

        for key in ("short", "k" * 129, "k" * 15 + "\n"):
            with pytest.raises(grpc.RpcError) as info:
                register(key)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "registration_key" in (info.value.details() or "")
        assert not any(n.registered for n in rt.master.nodes().values())
        first = register("k" * 32)
        assert register("k" * 32).node_id == first.node_id
        # Another key, or none, is another agent: the next free rank.
        assert register("j" * 32).rank == first.rank + 1
        assert register("").rank == first.rank + 2
