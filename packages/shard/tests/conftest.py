from __future__ import annotations

from collections.abc import Iterator

import pytest

from dlrover.common import SystemClock, generate_token


@pytest.fixture
def token() -> str:
    return generate_token()


@pytest.fixture
def shard_server(token: str) -> Iterator[tuple[object, object]]:
    """A real ShardService (and PingService) on 127.0.0.1 with a random port: (server, servicer)."""
    from dlrover.common import GrpcServer, ServerConfig, add_ping_service
    from dlrover.shard import ShardRegistry
    from dlrover.shard.service import add_shard_service

    server = GrpcServer(ServerConfig(), token)
    servicer = add_shard_service(server, ShardRegistry(SystemClock()))
    add_ping_service(server)
    server.start()
    yield server, servicer
    server.stop(0)
