"""Two real worker processes over gRPC: dynamic sharding balances speed; a killed worker loses nothing.

The workers run in lockstep with the test (see _lockstep_worker.py): per tick the fast worker trains
4 samples and the slow one 1, so "4x slower" is exact and independent of machine load.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlrover.common import GrpcServer, RetryPolicy, ServerConfig, SystemClock
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardRegistry
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.service import add_shard_service

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("_lockstep_worker.py")
REPLY_TIMEOUT_S = 60.0
CFG = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=0)


class _Worker:
    def __init__(self, address: str, token: str, name: str, per_tick: int) -> None:
        self.name = name
        env = {**os.environ, "DLROVER_JOB_TOKEN": token}
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), address, "ds", name, str(per_tick)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.trained: list[int] = []
        self.fetched: list[list[int]] = []
        self.finished = False
        self.current: list[int] | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def tick(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("tick\n")
        self.proc.stdin.flush()
        line = self._lines.get(timeout=REPLY_TIMEOUT_S)
        if line is None:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"worker {self.name} exited: {stderr[-3000:]}")
        reply = json.loads(line)
        self.trained += reply["trained"]
        self.fetched += reply["fetched"]
        self.finished = reply["finished"]
        self.current = reply["current"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def server(token: str) -> Iterator[tuple[GrpcServer, ShardRegistry]]:
    registry = ShardRegistry(SystemClock())
    srv = GrpcServer(ServerConfig(), token)
    add_shard_service(srv, registry)
    srv.start()
    yield srv, registry
    srv.stop(0)


def _register(address: str, token: str, n: int) -> None:
    spec = DatasetSpec(
        name="ds",
        source=IndexSource(n),
        batch_size=5,
        batches_per_shard=4,
        shuffle=True,
        shuffle_samples=True,
        seed=5,
        delivery=DeliveryMode.EXACTLY_ONCE,
        lease_timeout_s=300.0,  # leases end by removal here, never by the machine being slow
    )
    with ShardClient(address, token, "ds", "setup", config=CFG) as c:
        c.register(spec)


def _run_until_finished(workers: list[_Worker], max_ticks: int) -> None:
    for _ in range(max_ticks):
        for w in workers:
            w.tick()
        if all(w.finished for w in workers):
            return
    raise AssertionError(f"not finished after {max_ticks} ticks")


@pytest.mark.timeout(120)
def test_a_4x_slower_worker_gets_about_a_fifth_of_the_shards(server: Any, token: str) -> None:
    srv, _ = server
    n = 2000  # 100 shards of 20
    _register(srv.address, token, n)
    fast, slow = _Worker(srv.address, token, "fast", 4), _Worker(srv.address, token, "slow", 1)
    try:
        _run_until_finished([fast, slow], max_ticks=1000)
    finally:
        fast.stop()
        slow.stop()
    assert sorted(fast.trained + slow.trained) == list(range(n))
    shards_fast, shards_slow = len(fast.fetched), len(slow.fetched)
    assert shards_fast + shards_slow == 100
    # Exact speeds 4:1 give 20 of 100 to the slow worker; end effects move it by a shard or two.
    assert 17 <= shards_slow <= 23, (shards_fast, shards_slow)


@pytest.mark.timeout(120)
def test_a_killed_workers_remainder_is_finished_by_the_other_exactly_once(server: Any, token: str) -> None:
    srv, registry = server
    n = 400  # 20 shards of 20
    _register(srv.address, token, n)
    fast, slow = _Worker(srv.address, token, "fast", 4), _Worker(srv.address, token, "slow", 1)
    try:
        for _ in range(27):  # the slow worker is 7 samples into its second shard
            fast.tick()
            slow.tick()
        assert slow.current is not None
        killed_shard, acked = slow.current
        assert 0 < acked % 20 < 20
        slow.proc.send_signal(signal.SIGKILL)  # mid-shard, between two acknowledged steps
        slow.proc.wait(timeout=30)
        with ShardClient(srv.address, token, "ds", "master", config=CFG) as master:
            released = master.remove_worker("slow", "process killed")  # what the master does on a death
        assert released == {"ds": [killed_shard]}
        _run_until_finished([fast], max_ticks=1000)
    finally:
        fast.stop()
        slow.stop()
    # The other worker got the killed shard's unacknowledged remainder, not the whole shard ...
    assert [killed_shard, acked] in fast.fetched
    # ... and every sample was trained (and acknowledged) exactly once.
    everything = fast.trained + slow.trained
    assert len(everything) == n
    assert sorted(everything) == list(range(n))
    status = registry.manager("ds").status()
    assert status.finished
    assert status.failed == 0
