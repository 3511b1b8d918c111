from __future__ import annotations

from collections.abc import Iterator

import pytest

from dlrover.common import GrpcServer, ServerConfig, add_ping_service, generate_token


@pytest.fixture
def token() -> str:
    return generate_token()


@pytest.fixture
def ping_server(token: str) -> Iterator[GrpcServer]:
    """A real PingService on 127.0.0.1 with a random port."""
    server = GrpcServer(ServerConfig(max_message_bytes=64 * 1024), token)
    add_ping_service(server)
    server.start()
    yield server
    server.stop(0)
