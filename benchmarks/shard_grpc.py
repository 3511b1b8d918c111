"""ShardService over gRPC: shards dispatched per second from 8 client threads, against the same
server's no-op Ping measured in the same run.

    python benchmarks/shard_grpc.py                 # 20 pairs of 0.5 s rounds
    python benchmarks/shard_grpc.py --quick         # 2 pairs of 0.5 s rounds (smoke run)
    python benchmarks/shard_grpc.py --pairs 12 --seconds 1

The server (ShardService + PingService, token auth) runs in a child process so clients and
server do not share one interpreter lock. Every client thread has its own channel. Both RPCs go
through the same client path (`call_unary` with a deadline); a dispatch is `ShardClient.fetch(1)`,
which leases one shard of a 1,000,000-shard dataset.

Built for a shared machine, where other processes take CPU in bursts:

- Ping and FetchShards rounds come in pairs whose order alternates (P F, F P, P F, ...), so a
  burst of outside load, or a trend, falls on both alike; the goal is judged on the median of
  the per-pair ratios, not on one long run.
- Each round also records the CPU time the server process and this (client) process spent per
  call. CPU per call is much less sensitive to outside load than calls per second, so the ratio
  of CPU costs says what the rate ratio would be where CPU is the only limit.
- p50/p99 latency pool every call of every round.
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

import attrs

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
NUM_SHARDS = 1_000_000
GOAL = 0.8
POLICY = RetryPolicy(call_timeout_s=30.0, total_timeout_s=60.0)
PING = "Ping (no-op)"
FETCH = "FetchShards (1 shard)"


def serve() -> None:
    """Child process: serve; answer each stdin line with this process's CPU seconds; stop at EOF."""
    server = GrpcServer(ServerConfig(max_workers=16), os.environ["DLROVER_JOB_TOKEN"])
    add_shard_service(server, ShardRegistry(SystemClock()))
    add_ping_service(server)
    server.start()
    print(server.address, flush=True)
    for _line in sys.stdin:
        print(time.process_time(), flush=True)
    server.stop(0)


@attrs.frozen
class Round:
    """One timed round of one RPC."""

    calls: int
    seconds: float
    latencies: list[float]
    server_cpu_s: float
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    @property
    def server_us(self) -> float:
        return self.server_cpu_s / self.calls * 1e6

    @property
    def client_us(self) -> float:
        return self.client_cpu_s / self.calls * 1e6


class Server:
    """The child process serving both RPCs."""

    def __init__(self, token: str) -> None:
        env = {**os.environ, "DLROVER_JOB_TOKEN": token}
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert self._proc.stdout is not None
        assert self._proc.stdin is not None
        self._out = self._proc.stdout
        self._in = self._proc.stdin
        self.address = self._out.readline().strip()
        if not self.address:
            raise RuntimeError(f"the server process exited with {self._proc.wait()} before listening")

    def cpu_s(self) -> float:
        self._in.write("cpu\n")
        self._in.flush()
        return float(self._out.readline())

    def stop(self) -> None:
        self._in.close()
        self._proc.wait(timeout=30)
        self._out.close()


def run_round(server: Server, seconds: float, calls: list[Callable[[], object]]) -> Round:
    """Each of `calls` made in a loop by its own thread for `seconds`."""
    latencies: list[list[float]] = [[] for _ in calls]
    start = threading.Barrier(len(calls) + 1)
    stop = threading.Event()

    def worker(i: int) -> None:
        call, mine = calls[i], latencies[i]
        start.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            call()
            mine.append(time.perf_counter() - t0)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for t in pool:
        t.start()
    server_cpu0, client_cpu0 = server.cpu_s(), time.process_time()
    start.wait()
    t0 = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - t0
    server_cpu, client_cpu = server.cpu_s() - server_cpu0, time.process_time() - client_cpu0
    flat = [x for per in latencies for x in per]
    return Round(len(flat), elapsed, flat, server_cpu, client_cpu)


def _pct_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def report(results: dict[str, list[Round]], seconds: float, load_before: tuple[float, ...], first_fetch_s: float,
           leased: int) -> None:  # fmt: skip
    """Print the table."""
    pairs = len(results[PING])
    load_after = os.getloadavg()
    print(f"\nShardService over gRPC: {THREADS} client threads, server in its own process, token auth on")
    print(
        f"{pairs} pairs of {seconds:g} s rounds, order alternating; {os.cpu_count()} CPUs; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (the machine may be shared)"
    )
    head = f"  {'RPC':<22} {'calls/s':>8} {'min..max':>13} {'p50 ms':>7} {'p99 ms':>7} {'srv CPU':>8} {'cli CPU':>8}"
    print(head)
    print(f"  {'':<22} {'median':>8} {'(rounds)':>13} {'':>7} {'':>7} {'us/call':>8} {'us/call':>8}")
    for name, rounds in results.items():
        rates = [r.rate for r in rounds]
        lat = [x for r in rounds for x in r.latencies]
        print(
            f"  {name:<22} {statistics.median(rates):>8,.0f} {min(rates):>6,.0f}..{max(rates):<6,.0f}"
            f" {_pct_ms(lat, 0.5):>7.2f} {_pct_ms(lat, 0.99):>7.2f}"
            f" {statistics.median(r.server_us for r in rounds):>8.0f}"
            f" {statistics.median(r.client_us for r in rounds):>8.0f}"
        )
    ratios = [f.rate / p.rate for p, f in zip(results[PING], results[FETCH], strict=True)]
    median = statistics.median(ratios)
    met = sum(r >= GOAL for r in ratios)
    verdict = "met" if median >= GOAL else "NOT met"
    print(
        f"  dispatch / no-op rate, per pair: median {median:.2f} (goal >= {GOAL:.2f}: {verdict}); "
        f"range {min(ratios):.2f}..{max(ratios):.2f}; {met}/{pairs} pairs >= {GOAL:.2f}"
    )
    ping_cpu = statistics.median(r.server_us + r.client_us for r in results[PING])
    fetch_cpu = statistics.median(r.server_us + r.client_us for r in results[FETCH])
    print(
        f"  CPU per call, server + client: Ping {ping_cpu:.0f} us, FetchShards {fetch_cpu:.0f} us; "
        f"ratio {ping_cpu / fetch_cpu:.2f} (the rate ratio where CPU is the only limit)"
    )
    print(
        f"  shards leased in all: {leased:,}; the first fetch, which shuffles {NUM_SHARDS:,} shard ids, "
        f"took {first_fetch_s:.2f} s (warm-up, not counted)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 pairs of 0.5 s rounds")
    parser.add_argument("--pairs", type=int, default=20, help="Ping/FetchShards round pairs (default 20)")
    parser.add_argument("--seconds", type=float, default=0.5, help="length of one round (default 0.5)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    pairs, seconds = (2, 0.5) if args.quick else (args.pairs, args.seconds)
    if pairs < 1 or not seconds > 0:
        parser.error(f"--pairs must be >= 1 and --seconds > 0, got {pairs} and {seconds}")
    load_before = os.getloadavg()
    token = generate_token()
    server = Server(token)
    channels = []
    clients: list[ShardClient] = []
    try:
        spec = DatasetSpec(
            name="bench", source=IndexSource(NUM_SHARDS), batch_size=1, shuffle=True, lease_timeout_s=3600.0
        )
        cfg = ShardClientConfig(retry=POLICY, prefetch_shards=0)
        clients = [ShardClient(server.address, token, "bench", f"worker-{i}", config=cfg) for i in range(THREADS)]
        clients[0].register(spec)
        t0 = time.perf_counter()
        clients[0].fetch(1)
        first_fetch_s = time.perf_counter() - t0
        ping_calls: list[Callable[[], object]] = []
        for _ in range(THREADS):
            channel = create_channel(server.address, token)
            channels.append(channel)
            stub = ping_pb2_grpc.PingServiceStub(channel)  # type: ignore[no-untyped-call]
            ping_calls.append(
                lambda stub=stub: call_unary(stub.Ping, ping_pb2.PingRequest(), idempotent=True, policy=POLICY)
            )
        fetch_calls: list[Callable[[], object]] = [lambda c=c: c.fetch(1) for c in clients]
        run_round(server, 0.5, ping_calls)  # warm-up of both paths, not counted
        run_round(server, 0.5, fetch_calls)
        results: dict[str, list[Round]] = {PING: [], FETCH: []}
        for k in range(pairs):
            order = [(PING, ping_calls), (FETCH, fetch_calls)]
            for name, calls in order if k % 2 == 0 else reversed(order):
                results[name].append(run_round(server, seconds, calls))
        leased = clients[0].status().doing
    finally:
        for c in clients:
            c.close(return_buffered=False)
        for ch in channels:
            ch.close()
        server.stop()
    report(results, seconds, load_before, first_fetch_s, leased)


if __name__ == "__main__":
    main()
