"""ShardService over gRPC: shards dispatched per second from 8 client threads, against the same
server's no-op Ping measured in the same run.

    python benchmarks/shard_grpc.py            # 2 s per round, 4 rounds of each
    python benchmarks/shard_grpc.py --quick    # 1 s per round, 1 round (smoke run)

The server (ShardService + PingService, token auth) runs in a child process so clients and
server do not share one interpreter lock. Every client thread has its own channel. Both RPCs go
through the same client path (`call_unary` with a deadline); a dispatch is `ShardClient.fetch(1)`,
which leases one shard of a 1,000,000-shard dataset. Rounds of Ping and fetch alternate so that
load from other processes on the machine falls on both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from dlrover.common import (
    GrpcServer,
    RetryPolicy,
    ServerConfig,
    SystemClock,
    add_ping_service,
    call_unary,
    create_channel,
    generate_token,
)
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc
from dlrover.shard import DatasetSpec, IndexSource, ShardClient, ShardClientConfig, ShardRegistry, add_shard_service

THREADS = 8
POLICY = RetryPolicy(call_timeout_s=10.0, total_timeout_s=30.0)


def serve() -> None:
    """Child process: serve until stdin closes."""
    server = GrpcServer(ServerConfig(max_workers=16), os.environ["DLROVER_JOB_TOKEN"])
    add_shard_service(server, ShardRegistry(SystemClock()))
    add_ping_service(server)
    server.start()
    print(server.address, flush=True)
    sys.stdin.read()
    server.stop(0)


def _run(threads: int, seconds: float, make_call: Callable[[int], Callable[[], object]]) -> tuple[int, list[float]]:
    """Calls made by `threads` threads for `seconds`; returns the count and every latency."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(i: int) -> None:
        call = make_call(i)
        call()  # warm the channel before the clock starts
        start.wait()
        mine = latencies[i]
        while not stop.is_set():
            t0 = time.perf_counter()
            call()
            mine.append(time.perf_counter() - t0)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - t0
    flat = [x for per in latencies for x in per]
    return int(len(flat) / elapsed), flat


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 s rounds, one of each")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    seconds, rounds = (1.0, 1) if args.quick else (2.0, 4)
    token = generate_token()
    env = {**os.environ, "DLROVER_JOB_TOKEN": token}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    channels = []
    clients: list[ShardClient] = []
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        spec = DatasetSpec(
            name="bench", source=IndexSource(1_000_000), batch_size=1, shuffle=True, lease_timeout_s=3600.0
        )
        cfg = ShardClientConfig(retry=POLICY, prefetch_shards=0)
        clients = [ShardClient(address, token, "bench", f"worker-{i}", config=cfg) for i in range(THREADS)]
        clients[0].register(spec)

        def ping_call(i: int) -> Callable[[], object]:
            channel = create_channel(address, token)
            channels.append(channel)
            stub = ping_pb2_grpc.PingServiceStub(channel)  # type: ignore[no-untyped-call]
            return lambda: call_unary(stub.Ping, ping_pb2.PingRequest(), idempotent=True, policy=POLICY)

        def fetch_call(i: int) -> Callable[[], object]:
            return lambda: clients[i].fetch(1)

        results: dict[str, list[tuple[int, list[float]]]] = {"Ping (no-op)": [], "FetchShards (1 shard)": []}
        _run(THREADS, 0.5, ping_call)  # warm-up of both paths, not counted
        _run(THREADS, 0.5, fetch_call)
        for _ in range(rounds):
            results["Ping (no-op)"].append(_run(THREADS, seconds, ping_call))
            results["FetchShards (1 shard)"].append(_run(THREADS, seconds, fetch_call))
        dispatched = clients[0].status().doing
    finally:
        for c in clients:
            c.close(return_buffered=False)
        for ch in channels:
            ch.close()
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    print(f"\nShardService over gRPC, {THREADS} client threads, server in its own process, token auth on")
    print(f"  {'RPC':<22} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    rates = {}
    for name, runs in results.items():
        rate = int(statistics.mean(r for r, _ in runs))
        lat = [x for _, per in runs for x in per]
        rates[name] = rate
        print(f"  {name:<22} {rate:>9,} {_pct(lat, 0.5):>8.2f} {_pct(lat, 0.99):>8.2f}")
    ratio = rates["FetchShards (1 shard)"] / rates["Ping (no-op)"]
    per_round = [f[0] / p[0] for p, f in zip(results["Ping (no-op)"], results["FetchShards (1 shard)"], strict=True)]
    print(f"  dispatch / no-op rate: {ratio:.2f} (goal >= 0.80); per round: {', '.join(f'{r:.2f}' for r in per_round)}")
    print(f"  shards leased in all: {dispatched:,}")


if __name__ == "__main__":
    main()
