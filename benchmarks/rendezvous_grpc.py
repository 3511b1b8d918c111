"""The rendezvous over real gRPC: N simulated agents join and all learn their ranks.

    python benchmarks/rendezvous_grpc.py            # 1,000 agents
    python benchmarks/rendezvous_grpc.py --quick    # 100 agents

One server on 127.0.0.1 hosts the RendezvousService and the no-op PingService. Agents are threads
(`--concurrency` at a time, sharing `--channels` channels): each joins, then polls until it holds
its rank (the client's poll interval starts at `--poll-interval-s` and doubles up to 1 s). The time
is from the first join to the last agent holding the round. In the same run, the same number of
Ping calls with the same concurrency give the floor: what N round trips cost on this server.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from dlrover.common import GrpcServer, ServerConfig, add_ping_service, create_channel, generate_token
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc
from dlrover.rendezvous import (
    PollState,
    RendezvousClient,
    RendezvousConfig,
    RendezvousManager,
    add_rendezvous_service,
)


def rendezvous(
    address: str, token: str, agents: int, concurrency: int, *, channels: int, poll_s: float
) -> dict[str, float]:
    clients = [RendezvousClient(address, token) for _ in range(channels)]
    polls = [0] * agents

    def agent(i: int) -> float:
        client = clients[i % channels]
        node = f"agent-{i:05d}"
        assert client.join(node).accepted
        while True:
            result = client.poll(node)
            polls[i] += 1
            if result.state is PollState.ASSIGNED:
                return time.perf_counter()
            assert result.state is PollState.WAITING, result
            time.sleep(min(poll_s * 2 ** (polls[i] - 1), 1.0))

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            done = list(pool.map(agent, range(agents)))
        return {"total_s": max(done) - t0, "polls": float(sum(polls))}
    finally:
        for c in clients:
            c.close()


def pings(address: str, token: str, calls: int, concurrency: int, channels: int) -> float:
    chans = [create_channel(address, token) for _ in range(channels)]
    stubs = [ping_pb2_grpc.PingServiceStub(c) for c in chans]  # type: ignore[no-untyped-call]

    def call(i: int) -> None:
        stubs[i % channels].Ping(ping_pb2.PingRequest(), timeout=30)

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(call, range(calls)))
        return time.perf_counter() - t0
    finally:
        for c in chans:
            c.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 agents (a smoke run)")
    parser.add_argument("--agents", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None, help="agent threads at a time (default: all)")
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--poll-interval-s", type=float, default=0.05)
    args = parser.parse_args()
    agents = args.agents or (100 if args.quick else 1_000)
    concurrency = args.concurrency or agents
    token = generate_token()
    manager = RendezvousManager(RendezvousConfig(min_nodes=agents, max_nodes=agents, last_call_s=0.0))
    server = GrpcServer(ServerConfig(max_workers=16), token)
    servicer = add_rendezvous_service(server, manager)
    add_ping_service(server)
    server.start()
    try:
        ping_warm = pings(server.address, token, 200, 8, args.channels)
        rdzv = rendezvous(
            server.address, token, agents, concurrency, channels=args.channels, poll_s=args.poll_interval_s
        )
        ping_s = pings(server.address, token, agents, concurrency, args.channels)
        ping_total = pings(server.address, token, int(rdzv["polls"]) + agents, concurrency, args.channels)
        with servicer.lock:
            assert manager.current_round is not None
            assert manager.current_round.world_size == agents
    finally:
        server.stop(0)
    calls = int(rdzv["polls"]) + agents
    print(
        f"rendezvous over gRPC: {agents:,} agents, {concurrency} threads, {args.channels} channels, 16 server threads"
    )
    print(f"{'measurement':<52}{'time':>10}{'calls':>8}{'per call':>11}")
    rows = [
        ("rendezvous: first join -> last agent holds its rank", rdzv["total_s"], calls),
        ("floor: N no-op Ping calls, same concurrency", ping_s, agents),
        ("floor: as many Pings as rendezvous calls", ping_total, calls),
    ]
    for name, seconds, n in rows:
        print(f"{name:<52}{seconds:>9.2f}s{n:>8}{seconds / n * 1e3:>9.2f}ms")
    print(f"(warm-up: 200 pings in {ping_warm:.2f}s; joins {agents}, polls {int(rdzv['polls'])})")


if __name__ == "__main__":
    main()
