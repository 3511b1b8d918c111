"""Fuzzing every RPC over real gRPC: malformed and oversized requests get errors, the master keeps
serving, and a refused request leaves its state exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlrover.common import create_channel
from dlrover.master.identity import node_metadata
from dlrover.master.runtime import MasterRuntime
from dlrover.master.v1 import agent_pb2, checkpoint_pb2, job_pb2

pytestmark = [pytest.mark.integration, pytest.mark.timeout(110)]

MakeRuntime = Callable[..., MasterRuntime]
MAX_BYTES = 64 * 1024

I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
TEXT = st.one_of(st.text(max_size=300), st.text(alphabet=st.characters(codec="utf-8"), min_size=250, max_size=600))
FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(-1.0))


def _register() -> st.SearchStrategy[Any]:
    return st.builds(
        lambda nid, has, name, host, lws: agent_pb2.RegisterNodeRequest(
            node_name=name, host=host, local_world_size=lws, **({"node_id": nid} if has else {})
        ),
        I64,
        st.booleans(),
        TEXT,
        TEXT,
        I32,
    )


def _heartbeat() -> st.SearchStrategy[Any]:
    return st.builds(
        lambda nid, step, samples, cpu, mem: agent_pb2.HeartbeatRequest(
            node_id=nid,
            progress=agent_pb2.StepProgress(step=step, samples=samples),
            resources=agent_pb2.ResourceSample(cpu_percent=cpu, memory_bytes=mem),
        ),
        st.one_of(I64, st.just(0)),
        I64,
        I64,
        FLOAT,
        I64,
    )


def _failure() -> st.SearchStrategy[Any]:
    return st.builds(
        lambda nid, kind, ev: agent_pb2.ReportFailureRequest(node_id=nid, kind=kind, evidence=ev),
        st.one_of(I64, st.just(0)),
        st.one_of(st.just(0), st.integers(8, 1000), I32),
        st.one_of(TEXT, TEXT, TEXT, st.just("x" * (64 * 1024 + 1))),  # the oversized one now and then
    )


def _ckpt() -> st.SearchStrategy[Any]:
    return st.builds(
        lambda nid, world, ranks: checkpoint_pb2.ReportCheckpointStepsRequest(
            node_id=nid, world_size=world, ranks=[checkpoint_pb2.RankSteps(rank=r, steps=s) for r, s in ranks]
        ),
        st.one_of(I64, st.just(0)),
        st.one_of(I32, st.integers(-2, 3)),
        st.lists(st.tuples(st.one_of(I32, st.integers(-1, 3)), st.lists(I64, max_size=5)), max_size=5),
    )


# (service method path, request strategy, response class, whether identity metadata is sent)
RPCS: dict[str, tuple[str, Callable[[], st.SearchStrategy[Any]], Any]] = {
    "RegisterNode": ("/dlrover.master.v1.AgentService/RegisterNode", _register, agent_pb2.RegisterNodeResponse),
    "Heartbeat": ("/dlrover.master.v1.AgentService/Heartbeat", _heartbeat, agent_pb2.HeartbeatResponse),
    "ReportFailure": ("/dlrover.master.v1.AgentService/ReportFailure", _failure, agent_pb2.ReportFailureResponse),
    "ReportSuccess": (
        "/dlrover.master.v1.AgentService/ReportSuccess",
        lambda: st.builds(lambda n: agent_pb2.ReportSuccessRequest(node_id=n), st.one_of(I64, st.integers(1, 5))),
        agent_pb2.ReportSuccessResponse,
    ),
    "ReportCheckpointSteps": (
        "/dlrover.master.v1.CheckpointService/ReportCheckpointSteps",
        _ckpt,
        checkpoint_pb2.ReportCheckpointStepsResponse,
    ),
    "CommitCheckpoint": (
        "/dlrover.master.v1.CheckpointService/CommitCheckpoint",
        lambda: st.builds(
            lambda n, s, p: checkpoint_pb2.CommitCheckpointRequest(node_id=n, step=s, path=p),
            st.one_of(I64, st.just(0)),
            I64,
            TEXT,
        ),
        checkpoint_pb2.CommitCheckpointResponse,
    ),
    "GetJobStatus": (
        "/dlrover.master.v1.JobService/GetJobStatus",
        lambda: st.just(job_pb2.GetJobStatusRequest()),
        job_pb2.GetJobStatusResponse,
    ),
    "ListEvents": (
        "/dlrover.master.v1.JobService/ListEvents",
        lambda: st.builds(lambda a, lim: job_pb2.ListEventsRequest(after_seq=a, limit=lim), I64, I32),
        job_pb2.ListEventsResponse,
    ),
    "StopJob": (
        "/dlrover.master.v1.JobService/StopJob",
        # Only malformed reasons: a well-formed stop ends the job, which is not what this test probes.
        lambda: st.builds(
            lambda r: job_pb2.StopJobRequest(reason=r),
            st.one_of(st.text(min_size=4097, max_size=5000), st.text(min_size=1).map(lambda t: t + "\x00")),
        ),
        job_pb2.StopJobResponse,
    ),
    "ResizeJob": (
        "/dlrover.master.v1.JobService/ResizeJob",
        lambda: st.builds(lambda t, r: job_pb2.ResizeJobRequest(target=t, reason=r), I32, TEXT),
        job_pb2.ResizeJobResponse,
    ),
    "SetCapacity": (
        "/dlrover.master.v1.JobService/SetCapacity",
        lambda: st.builds(
            lambda n: job_pb2.SetCapacityRequest() if n is None else job_pb2.SetCapacityRequest(slots=n),
            st.none() | I32,
        ),
        job_pb2.SetCapacityResponse,
    ),
}


def _raw_call(channel: grpc.Channel, path: str, payload: bytes, metadata: Any) -> grpc.StatusCode:
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    return grpc.StatusCode.OK


@pytest.mark.parametrize("rpc", sorted(RPCS))
def test_fuzz_rpc(rpc: str, make_runtime: MakeRuntime) -> None:
    path, strategy, _response = RPCS[rpc]
    rt = make_runtime(nodes=4, max_message_bytes=MAX_BYTES)
    master = rt.master
    auth_node = master.register(0, "agent-0", "host-0")
    metadata = node_metadata(auth_node.node_id, rt.node_credential(auth_node.node_id))
    channel = create_channel(rt.address, rt.token)
    try:

        def check(payload: bytes) -> None:
            before = master.state_digest()
            code = _raw_call(channel, path, payload, metadata)
            if code is not grpc.StatusCode.OK:
                assert code is not grpc.StatusCode.UNKNOWN, "an unhandled exception reached the client"
                assert code is not grpc.StatusCode.INTERNAL
                assert master.state_digest() == before, f"{rpc} refused with {code} but changed state"

        @settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example], deadline=None)
        @given(st.one_of(strategy().map(lambda m: m.SerializeToString()), st.binary(max_size=512)))
        def fuzz(payload: bytes) -> None:
            check(payload)

        fuzz()
        # Oversized: refused by the transport before any handler runs.
        before = master.state_digest()
        assert _raw_call(channel, path, b"\x0a" + b"\xff" * (MAX_BYTES + 10), metadata) is (
            grpc.StatusCode.RESOURCE_EXHAUSTED
        )
        assert master.state_digest() == before
        # Still serving.
        status_path = RPCS["GetJobStatus"][0]
        assert _raw_call(channel, status_path, b"", metadata) is grpc.StatusCode.OK
    finally:
        channel.close()
