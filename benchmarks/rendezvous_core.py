"""In-process rendezvous at scale: N nodes join, the round completes, every node reads its rank.

    python benchmarks/rendezvous_core.py            # 10,000 nodes
    python benchmarks/rendezvous_core.py --quick    # 1,000 nodes

The peer measured in the same run is the floor for the same work: one dict insert per join and one
dict lookup per poll. Time is wall time (time.perf_counter); memory is tracemalloc's peak of the
manager's allocations, measured in a second, separate pass so tracing does not slow the timed one.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from dlrover.rendezvous import PollState, RendezvousConfig, RendezvousManager


def run(nodes: int) -> dict[str, float]:
    ids = [f"node-{i:06d}" for i in range(nodes)]
    manager = RendezvousManager(RendezvousConfig(min_nodes=nodes, max_nodes=nodes, last_call_s=0.0))
    t0 = time.perf_counter()
    for i, node in enumerate(ids[:-1]):
        manager.join(node, now=i * 1e-6)
    t_joined = time.perf_counter()
    manager.join(ids[-1], now=nodes * 1e-6)  # the last join completes the round (max reached)
    t_complete = time.perf_counter()
    ranks = 0
    for node in ids:
        result = manager.poll(node, now=nodes * 1e-6)
        assert result.state is PollState.ASSIGNED
        ranks += 1
    t_polled = time.perf_counter()
    assert ranks == nodes
    return {
        "joins_s": t_joined - t0,
        "completing_join_s": t_complete - t_joined,
        "polls_s": t_polled - t_complete,
        "total_s": t_polled - t0,
    }


def floor(nodes: int) -> float:
    ids = [f"node-{i:06d}" for i in range(nodes)]
    t0 = time.perf_counter()
    table: dict[str, int] = {}
    for i, node in enumerate(ids):
        table[node] = i
    total = 0
    for node in ids:
        total += table[node]
    return time.perf_counter() - t0


def peak_memory(nodes: int) -> int:
    tracemalloc.start()
    try:
        run(nodes)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, one repetition (a smoke run)")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=None)
    args = parser.parse_args()
    nodes = args.nodes or (1_000 if args.quick else 10_000)
    repeat = args.repeat or (1 if args.quick else 5)
    runs = [run(nodes) for _ in range(repeat)]
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    base = min(floor(nodes) for _ in range(repeat))
    peak = peak_memory(nodes)
    print(f"rendezvous core: {nodes:,} nodes, best of {repeat}")
    print(f"{'step':<40}{'time':>12}{'per node':>12}")
    rows = [
        ("N-1 joins (waiting)", best["joins_s"]),
        ("last join (completes round, ranks)", best["completing_join_s"]),
        ("N polls (each node reads its rank)", best["polls_s"]),
        ("total", best["total_s"]),
        ("floor: N dict inserts + N lookups", base),
    ]
    for name, seconds in rows:
        print(f"{name:<40}{seconds * 1e3:>10.1f}ms{seconds / nodes * 1e6:>10.2f}us")
    print(f"{'peak memory (tracemalloc)':<40}{peak / 2**20:>10.1f}MB{peak / nodes:>10.0f} B")


if __name__ == "__main__":
    main()
