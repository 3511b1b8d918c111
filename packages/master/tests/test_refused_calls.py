"""Refused calls on the master's real gRPC server (127.0.0.1): counted by reason, logged with the
caller's address at most once per reason per interval, and the master keeps serving."""

from __future__ import annotations

import logging
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dlrover.common import AUTH_METADATA_KEY, ManualClock, generate_token
from dlrover.master import LifecycleConfig, MasterConfig, MasterRuntime, NodeRange, create_master, node_metadata
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.master.v1 import agent_pb2, job_pb2

pytestmark = pytest.mark.integration

MAX_BYTES = 64 * 1024
INTERVAL_S = 30.0
REGISTER = "/dlrover.master.v1.AgentService/RegisterNode"
HEARTBEAT = "/dlrover.master.v1.AgentService/Heartbeat"
STATUS = "/dlrover.master.v1.JobService/GetJobStatus"
STOP = "/dlrover.master.v1.JobService/StopJob"


@pytest.fixture
def served() -> Iterator[tuple[MasterRuntime, ManualClock]]:
    clock = ManualClock()
    config = MasterConfig(
        job_name="refusals",
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 2), node_start_timeout_s=None),
        token=generate_token(),
        backend="external",
        tick_interval_s=3600.0,
        max_message_bytes=MAX_BYTES,
        metrics_port=0,
        refusal_log_interval_s=INTERVAL_S,
    )
    runtime = create_master(config, scheduler=ExternalScheduler(), clock=clock)
    runtime.start()
    yield runtime, clock
    runtime.stop()


def _call(channel: grpc.Channel, path: str, payload: bytes, metadata: Any = ()) -> grpc.StatusCode:
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    return grpc.StatusCode.OK


def _scraped(runtime: MasterRuntime) -> dict[str, float]:
    """`dlrover_refused_calls_total` by reason, read from the master's /metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{runtime.metrics_port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    pattern = r'^dlrover_refused_calls_total\{job="refusals",reason="(\w+)"\} ([0-9.e+]+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def _refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "dlrover.common.refusals" and r.levelno == logging.WARNING
    ]


def test_refused_calls_are_counted_by_reason_and_logged_with_the_peer(
    served: tuple[MasterRuntime, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    runtime, clock = served
    good = ((AUTH_METADATA_KEY, f"Bearer {runtime.token}"),)
    wrong = ((AUTH_METADATA_KEY, f"Bearer {generate_token()}"),)
    assert set(_scraped(runtime).values()) == {0.0}  # every reason is exposed before any refusal
    caplog.set_level(logging.WARNING, logger="dlrover.common.refusals")
    with grpc.insecure_channel(runtime.address) as channel:
        for _ in range(3):
            assert _call(channel, STATUS, b"", wrong) is grpc.StatusCode.UNAUTHENTICATED
        assert _call(channel, STATUS, b"") is grpc.StatusCode.UNAUTHENTICATED
        # Bytes that are no RegisterNodeRequest.
        assert _call(channel, REGISTER, b"\xff\xff\xff\xff", good) is grpc.StatusCode.INVALID_ARGUMENT
        # Well-formed, but a field the servicer refuses.
        bad_reason = job_pb2.StopJobRequest(reason="x" * 5000).SerializeToString()
        assert _call(channel, STOP, bad_reason, good) is grpc.StatusCode.INVALID_ARGUMENT
        too_big = agent_pb2.RegisterNodeRequest(node_name="n" * MAX_BYTES).SerializeToString()
        assert _call(channel, REGISTER, too_big, good) is grpc.StatusCode.RESOURCE_EXHAUSTED
        # The job token, but another node's credential.
        heartbeat = agent_pb2.HeartbeatRequest(node_id=0).SerializeToString()
        forged = good + node_metadata(0, "0" * 64)
        assert _call(channel, HEARTBEAT, heartbeat, forged) is grpc.StatusCode.UNAUTHENTICATED

        assert _scraped(runtime) == {
            "missing_token": 1.0,
            "bad_token": 3.0,
            "malformed": 1.0,
            "too_large": 1.0,
            "no_request": 0.0,
            "invalid_argument": 1.0,
            "unauthenticated": 1.0,
            "permission_denied": 0.0,
        }
        lines = _refusal_lines(caplog)
        # One line per reason: the three wrong tokens make one.
        assert len(lines) == 6, lines
        assert all("ipv4:127.0.0.1:" in line for line in lines), lines
        bad_token_lines = [line for line in lines if "bad_token" in line]
        assert len(bad_token_lines) == 1
        assert STATUS in bad_token_lines[0]
        assert any("malformed" in line and REGISTER in line for line in lines)
        assert any("too_large" in line and f"at most {MAX_BYTES}" in line for line in lines)

        # An interval later the next wrong token is logged with what was held back.
        clock.advance(INTERVAL_S)
        assert _call(channel, STATUS, b"", wrong) is grpc.StatusCode.UNAUTHENTICATED
        lines = _refusal_lines(caplog)
        assert len(lines) == 7
        assert "2 more bad_token refusals" in lines[-1]
        assert "ipv4:127.0.0.1:" in lines[-1]
        assert _scraped(runtime)["bad_token"] == 4.0

        # The master keeps serving, and an accepted call is no refusal.
        assert _call(channel, STATUS, b"", good) is grpc.StatusCode.OK
    assert sum(_scraped(runtime).values()) == 9.0
    assert runtime.master.status().job_name == "refusals"


def test_a_node_speaking_for_another_is_counted_as_permission_denied(
    served: tuple[MasterRuntime, ManualClock],
) -> None:
    runtime, _clock = served
    node = runtime.master.register(None, "agent-0", "host-0")
    metadata = (
        (AUTH_METADATA_KEY, f"Bearer {runtime.token}"),
        *node_metadata(node.node_id, runtime.node_credential(node.node_id)),
    )
    other = agent_pb2.HeartbeatRequest(node_id=node.node_id + 1).SerializeToString()
    with grpc.insecure_channel(runtime.address) as channel:
        assert _call(channel, HEARTBEAT, other, metadata) is grpc.StatusCode.PERMISSION_DENIED
    assert _scraped(runtime)["permission_denied"] == 1.0
