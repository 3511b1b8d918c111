from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dlrover.common import (
    ChannelConfig,
    ConfigError,
    DLRoverError,
    GrpcServer,
    ServerConfig,
    TLSConfig,
    add_ping_service,
    create_channel,
    format_host_port,
)
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="port"):
        ServerConfig(port=70000)
    with pytest.raises(ConfigError, match="max_message_bytes"):
        ServerConfig(max_message_bytes=0)
    with pytest.raises(ConfigError, match="together"):
        TLSConfig(cert_file="a.pem")
    with pytest.raises(ConfigError, match="empty"):
        create_channel("", "t" * 20)


def test_ipv6_literals_are_bracketed() -> None:
    assert format_host_port("::1", 80) == "[::1]:80"
    assert format_host_port("127.0.0.1", 80) == "127.0.0.1:80"


def test_port_before_start_is_an_error(token: str) -> None:
    server = GrpcServer(ServerConfig(), token)
    with pytest.raises(DLRoverError, match="not started"):
        _ = server.port
    server.stop(0)


@pytest.mark.integration
def test_oversized_request_is_refused_and_server_keeps_serving(ping_server: GrpcServer, token: str) -> None:
    with create_channel(ping_server.address, token) as channel:
        stub = ping_pb2_grpc.PingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Ping(ping_pb2.PingRequest(payload=b"x" * 100_000), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Ping(ping_pb2.PingRequest(payload=b"ok"), timeout=10).payload == b"ok"


@pytest.mark.integration
def test_second_server_on_a_taken_port_fails_clearly(ping_server: GrpcServer, token: str) -> None:
    other = GrpcServer(ServerConfig(port=ping_server.port), token)
    with pytest.raises(ConfigError, match=str(ping_server.port)):
        other.start()
    other.stop(0)


@pytest.mark.integration
def test_servicers_cannot_be_added_after_start(ping_server: GrpcServer) -> None:
    with pytest.raises(DLRoverError, match="before the server starts"):
        add_ping_service(ping_server)


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.mark.integration
def test_tls_server_serves_tls_clients_only(tmp_path: Path, token: str) -> None:
    cert, key = _self_signed(tmp_path)
    server = GrpcServer(ServerConfig(tls=TLSConfig(cert_file=cert, key_file=key)), token)
    add_ping_service(server)
    with server:
        tls = ChannelConfig(tls=TLSConfig(ca_file=cert, server_name_override="localhost"))
        with create_channel(server.address, token, tls) as channel:
            reply = ping_pb2_grpc.PingServiceStub(channel).Ping(ping_pb2.PingRequest(payload=b"s"), timeout=10)
            assert reply.payload == b"s"
        with create_channel(server.address, token) as plain:
            with pytest.raises(grpc.RpcError) as info:
                ping_pb2_grpc.PingServiceStub(plain).Ping(ping_pb2.PingRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_unreadable_tls_file_names_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        TLSConfig(cert_file=missing, key_file=missing).server_credentials()
