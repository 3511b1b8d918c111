from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from dlrover.common import SystemClock, generate_token

# Set by the CI session that installs TensorFlow: there a missing TensorFlow is a failure, not a skip.
REQUIRE_TENSORFLOW_ENV = "DLROVER_REQUIRE_TENSORFLOW"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"tensorflow: needs TensorFlow; skipped where it is not installed unless {REQUIRE_TENSORFLOW_ENV}=1, "
        "which makes its absence a failure",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("tensorflow") is None:
        return
    try:
        importlib.import_module("tensorflow")
    except ImportError as exc:
        if os.environ.get(REQUIRE_TENSORFLOW_ENV) == "1":
            pytest.fail(f"{REQUIRE_TENSORFLOW_ENV}=1 but TensorFlow cannot be imported: {exc}", pytrace=False)
        pytest.skip(
            f"TensorFlow is not installed ({exc}); the TensorFlow CI session runs this with {REQUIRE_TENSORFLOW_ENV}=1"
        )


@pytest.fixture
def tf() -> Any:
    """The tensorflow module (for tests marked `tensorflow`, which are skipped or failed without it)."""
    return importlib.import_module("tensorflow")


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
