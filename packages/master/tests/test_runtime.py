"""The runtime hosts extra services (how shard and rendezvous plug in) and serves TLS when configured."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dlrover.common import (
    ChannelConfig,
    GrpcServer,
    ManualClock,
    RetryPolicy,
    TLSConfig,
    add_ping_service,
    create_channel,
)
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc
from dlrover.master.client import MasterClient
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.factory import create_master
from dlrover.master.scheduler.external import ExternalScheduler

pytestmark = pytest.mark.integration


def _config(**kw: object) -> MasterConfig:
    return MasterConfig(
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), node_start_timeout_s=None),
        backend="external",
        **kw,  # type: ignore[arg-type]
    )


def test_extra_services_are_hosted_on_the_masters_server() -> None:
    hosted: list[GrpcServer] = []

    def register(server: GrpcServer) -> None:
        hosted.append(server)
        add_ping_service(server)

    runtime = create_master(_config(), scheduler=ExternalScheduler(), clock=ManualClock(), extra_services=[register])
    runtime.start()
    try:
        assert len(hosted) == 1
        channel = create_channel(runtime.address, runtime.token)
        try:
            stub = ping_pb2_grpc.PingServiceStub(channel)  # type: ignore[no-untyped-call]
            assert stub.Ping(ping_pb2.PingRequest(payload=b"hi"), timeout=30).payload == b"hi"
        finally:
            channel.close()
    finally:
        runtime.stop()
        runtime.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_master_serves_tls_clients(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    runtime = create_master(
        _config(tls=TLSConfig(cert_file=str(cert), key_file=str(key))),
        scheduler=ExternalScheduler(),
        clock=ManualClock(),
    )
    runtime.start()
    try:
        tls_client = ChannelConfig(tls=TLSConfig(ca_file=str(cert), server_name_override="localhost"))
        with MasterClient(runtime.address, runtime.token, channel_config=tls_client) as client:
            assert client.register("a", "h").rank == 0
        # A plaintext client cannot talk to a TLS master.
        with (
            MasterClient(
                runtime.address, runtime.token, policy=RetryPolicy(max_attempts=1, call_timeout_s=5, total_timeout_s=5)
            ) as plain,
            pytest.raises(Exception, match="UNAVAILABLE"),
        ):
            plain.job_status()
    finally:
        runtime.stop()


@pytest.mark.parametrize(
    ("state_dir", "journal_shard_changes", "expected"),
    [(False, True, False), (True, True, True), (True, False, False)],
)
def test_shard_changes_are_journaled_before_answers_only_where_the_journal_outlives_the_master(
    tmp_path: Path, state_dir: bool, journal_shard_changes: bool, expected: bool
) -> None:
    # An in-memory journal (no state dir: the master `dlrover-run --standalone` embeds) dies with
    # the master, so exporting every dataset's progress before each answer would buy nothing.
    config = _config(
        state_dir=str(tmp_path / "state") if state_dir else None, journal_shard_changes=journal_shard_changes
    )
    runtime = create_master(config, scheduler=ExternalScheduler(), clock=ManualClock())
    try:
        assert runtime.shards is not None
        assert runtime.shards.journals_every_change is expected
    finally:
        runtime.stop()
