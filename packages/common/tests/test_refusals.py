"""Refused calls: the rate limiter (a pure core), the log, and real gRPC on 127.0.0.1."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import (
    AUTH_METADATA_KEY,
    GrpcServer,
    LogRateLimiter,
    ManualClock,
    Refusal,
    RefusalLog,
    ServerConfig,
    add_ping_service,
    backstop_bytes,
    create_channel,
    generate_token,
)
from dlrover.common.refusals import BAD_TOKEN, MALFORMED, MISSING_TOKEN, NO_REQUEST, TOO_LARGE, report_refusal
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc

PING = "/dlrover.common.v1.PingService/Ping"
MAX_BYTES = 4096


def test_the_limiter_admits_one_line_per_key_per_interval_and_counts_the_rest() -> None:
    limiter = LogRateLimiter(10.0)
    assert limiter.admit("a", 0.0) == 0
    assert limiter.admit("a", 1.0) is None
    assert limiter.admit("a", 9.99) is None
    assert limiter.admit("b", 5.0) == 0  # keys are independent
    assert limiter.admit("a", 10.0) == 2  # two held back since the last line
    assert limiter.admit("a", 10.5) is None
    assert limiter.admit("a", 25.0) == 1
    assert limiter.admit("a", 40.0) == 0


def test_an_interval_of_zero_admits_every_line() -> None:
    limiter = LogRateLimiter(0.0)
    assert [limiter.admit("a", 1.0) for _ in range(3)] == [0, 0, 0]


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        LogRateLimiter(-1.0)


@given(
    interval=st.floats(min_value=0.1, max_value=100.0),
    gaps=st.lists(st.floats(min_value=0.0, max_value=50.0), min_size=1, max_size=60),
)
def test_the_limiter_accounts_for_every_line(interval: float, gaps: list[float]) -> None:
    """Lines written plus lines reported as held back (plus those still held) equal lines offered;
    two written lines are never closer than the interval."""
    limiter = LogRateLimiter(interval)
    now, written, reported, held, last = 0.0, 0, 0, 0, None
    for gap in gaps:
        now += gap
        answer = limiter.admit("k", now)
        if answer is None:
            held += 1
        else:
            assert last is None or now - last >= interval
            assert answer == held
            written, reported, held, last = written + 1, reported + answer, 0, now
    assert written + reported + held == len(gaps)


class Recorder:
    """A `RefusalObserver` that keeps what it is told."""

    def __init__(self) -> None:
        self.refusals: list[Refusal] = []
        self._lock = threading.Lock()

    def refused(self, refusal: Refusal) -> None:
        with self._lock:
            self.refusals.append(refusal)

    def reasons(self) -> list[str]:
        with self._lock:
            return [r.reason for r in self.refusals]


def test_the_log_writes_one_warning_per_reason_per_interval_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    log = RefusalLog(logging.getLogger("test.refusals"), clock, 30.0)
    refusal = Refusal(BAD_TOKEN, "/s/M", "ipv4:127.0.0.1:5000", "wrong job token")
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for _ in range(5):
            log.refused(refusal)
        log.refused(Refusal(MALFORMED, "/s/M", "", "bad bytes"))
        clock.advance(30.0)
        log.refused(refusal)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "ipv4:127.0.0.1:5000" in lines[0]
    assert "bad_token" in lines[0]
    assert "more" not in lines[0]
    assert "an unknown peer" in lines[1]
    assert "malformed" in lines[1]
    assert "4 more bad_token refusals" in lines[2]
    assert "every 30 s" in lines[2]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_a_burst_that_ends_in_silence_is_counted_when_the_log_is_flushed(caplog: pytest.LogCaptureFixture) -> None:
    log = RefusalLog(logging.getLogger("test.refusals"), ManualClock(), 30.0)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for _ in range(7):
            log.refused(Refusal(BAD_TOKEN, "/s/M", "ipv4:127.0.0.1:5000", "wrong job token"))
        log.flush()
        log.flush()  # nothing more to say
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[1].startswith("6 more bad_token refusals since the last such line were not logged")


def test_an_observer_that_raises_fails_neither_the_call_nor_the_others(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def refused(self, refusal: Refusal) -> None:
            raise RuntimeError("boom")

    recorder = Recorder()
    with caplog.at_level(logging.ERROR):
        report_refusal((Broken(), recorder), Refusal(BAD_TOKEN, "/s/M", "", "x"))
    assert recorder.reasons() == [BAD_TOKEN]
    assert "refusal observer" in caplog.text


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


@pytest.fixture
def watched() -> Iterator[tuple[GrpcServer, Recorder, str]]:
    token = generate_token()
    recorder = Recorder()
    server = GrpcServer(ServerConfig(max_message_bytes=MAX_BYTES), token, refusal_observers=[recorder])
    add_ping_service(server)
    server.start()
    yield server, recorder, token
    server.stop(0)


def _raw(channel: grpc.Channel, payload: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    call = channel.unary_unary(PING, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    return grpc.StatusCode.OK


@pytest.mark.integration
def test_every_refused_call_is_reported_with_its_reason_and_peer(
    watched: tuple[GrpcServer, Recorder, str],
) -> None:
    server, recorder, token = watched
    good = ((AUTH_METADATA_KEY, f"Bearer {token}"),)
    with grpc.insecure_channel(server.address) as plain:
        assert _raw(plain, b"") is grpc.StatusCode.UNAUTHENTICATED
        assert _raw(plain, b"", ((AUTH_METADATA_KEY, f"Bearer {generate_token()}"),)) is grpc.StatusCode.UNAUTHENTICATED
        assert _raw(plain, b"", ((AUTH_METADATA_KEY, token),)) is grpc.StatusCode.UNAUTHENTICATED  # no "Bearer "
        assert _raw(plain, b"\xff\xff\xff", good) is grpc.StatusCode.INVALID_ARGUMENT
        assert _raw(plain, b"\x0a" + b"\x00" * MAX_BYTES, good) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _raw(plain, b"\x0a" + b"\x00" * (backstop_bytes(MAX_BYTES) + 10), good) is (
            grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC's own backstop answers it
        )
    expected = [MISSING_TOKEN, BAD_TOKEN, BAD_TOKEN, MALFORMED, TOO_LARGE, NO_REQUEST]
    # The last is reported by a serving thread that may finish after the client has its answer.
    wait_for(lambda: len(recorder.reasons()) == len(expected))
    assert recorder.reasons() == expected
    for refusal in recorder.refusals[:5]:
        assert refusal.method == PING
        assert refusal.peer.startswith("ipv4:127.0.0.1:"), refusal
    assert "wrong job token" in recorder.refusals[1].detail
    assert f"this server accepts at most {MAX_BYTES}" in recorder.refusals[4].detail
    # Still serving, and an accepted call is no refusal.
    with create_channel(server.address, token) as channel:
        assert ping_pb2_grpc.PingServiceStub(channel).Ping(ping_pb2.PingRequest(payload=b"ok"), timeout=10).payload
    assert len(recorder.reasons()) == len(expected)


@pytest.mark.integration
def test_refusals_are_logged_by_the_server_itself(token: str, caplog: pytest.LogCaptureFixture) -> None:
    server = GrpcServer(ServerConfig(refusal_log_interval_s=3600.0), token, clock=ManualClock())
    add_ping_service(server)
    with server, grpc.insecure_channel(server.address) as plain, caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert _raw(plain, b"") is grpc.StatusCode.UNAUTHENTICATED
    lines = [r.getMessage() for r in caplog.records if r.name == "dlrover.common.refusals"]
    # One line while it served; the two held back are counted as the server stops.
    assert len(lines) == 2, lines
    assert lines[1].startswith("2 more missing_token refusals")
    assert "missing_token" in lines[0]
    assert "127.0.0.1" in lines[0]
    assert PING in lines[0]
