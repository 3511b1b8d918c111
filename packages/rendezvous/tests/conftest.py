from __future__ import annotations

from collections.abc import Iterator

import pytest

from dlrover.common import GrpcServer, ManualClock, ServerConfig, generate_token
from dlrover.rendezvous import (
    KeyValueStore,
    KvLimits,
    RendezvousClient,
    RendezvousConfig,
    RendezvousManager,
    RendezvousServicer,
    add_rendezvous_service,
)


@pytest.fixture
def token() -> str:
    return generate_token()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def servicer_and_server(token: str, clock: ManualClock) -> Iterator[tuple[RendezvousServicer, GrpcServer]]:
    """A real RendezvousService on 127.0.0.1 (min 2, max 3 nodes) whose time moves only when told."""
    manager = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=3, last_call_s=5.0, heartbeat_timeout_s=30))
    server = GrpcServer(ServerConfig(), token)
    servicer = add_rendezvous_service(
        server, manager, kv=KeyValueStore(KvLimits(max_value_bytes=1024, max_keys=100)), clock=clock
    )
    server.start()
    yield servicer, server
    server.stop(0)


@pytest.fixture
def client(servicer_and_server: tuple[RendezvousServicer, GrpcServer], token: str) -> Iterator[RendezvousClient]:
    with RendezvousClient(servicer_and_server[1].address, token) as c:
        yield c
