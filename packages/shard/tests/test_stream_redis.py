"""RedisStreamSource passes the StreamSource contract against a real redis-server on 127.0.0.1.

The server is started by the test in a temporary directory on a free port and stopped after.
Without redis-server the tests skip locally, but fail under CI=true (where .ci/run installs it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .stream_contract import StreamSourceContract

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed; CI must provide it (.ci/run installs the Debian package)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    try:
        import redis
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the redis client is not installed; it is in dlrover-shard's test extra")
        pytest.skip("the redis client is not installed (pip install redis)")
    workdir: Path = tmp_path_factory.mktemp("redis")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 30
        while True:  # bounded wait for the server to accept connections
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on port {port} (exit code {proc.poll()})")
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class TestRedisStreamSource(StreamSourceContract):
    @pytest.fixture
    def source(self, redis_url: str) -> Iterator[Any]:
        import redis

        from dlrover.shard.redis_stream import RedisStreamSource

        client = redis.Redis.from_url(redis_url)
        client.flushdb()
        yield RedisStreamSource(client, ["p0", "p1"])
        client.close()


def test_entries_not_written_by_the_adapter_are_reported_not_guessed(redis_url: str) -> None:
    import redis

    from dlrover.shard import InvalidShardRequestError
    from dlrover.shard.redis_stream import RedisStreamSource

    client = redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
        client.xadd("dlrover:shard:p0", {b"d": b"x"})  # an automatic id
        with pytest.raises(InvalidShardRequestError, match="not added by RedisStreamSource"):
            RedisStreamSource(client, ["p0"]).end_offset("p0")
    finally:
        client.close()
