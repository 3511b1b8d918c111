"""What journaling every shard change costs: ShardService progress reports on the master's server.

    python benchmarks/master_shard_journal.py            # 8 workers, 10 s per row
    python benchmarks/master_shard_journal.py --quick    # 4 workers, 3 s per row
    python benchmarks/master_shard_journal.py --held 10000   # and 10,000 other workers' leases

Three rows, each a fresh in-process master with a state directory in a temp dir:

- `library alone`: the shard library's own servicer on a bare `GrpcServer` (the peer: no master);
- `master, cadence only`: hosted by the master, journaled every `state_export_interval_s` (5 s);
- `master, every change`: hosted by the master, each changing request journaled (SQLite WAL,
  synchronous=FULL) before it is answered: the default.

Workers are threads in this process, each with its own `ShardClient`, acknowledging one sample
per `ReportProgress` of an exactly-once dataset. Latency is the round trip the worker sees.
Clients and server share the machine's cores, so the numbers are lower bounds. With `--held N`,
N more workers (a job's other ranks, silent here) each hold a lease before the measurement starts:
the state a journal that exported everything per write would carry.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from dlrover.common import GrpcServer, ServerConfig, SystemClock, generate_token
from dlrover.master import LifecycleConfig, MasterConfig, NodeRange, create_master
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.shard import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    ShardClient,
    ShardClientConfig,
    ShardRegistry,
    add_shard_service,
)

SPEC = DatasetSpec(
    name="bench",
    source=IndexSource(10_000_000),
    batch_size=64,
    batches_per_shard=16,
    num_epochs=None,
    delivery=DeliveryMode.EXACTLY_ONCE,
)


def _drive(address: str, token: str, workers: int, seconds: float) -> tuple[int, list[float]]:
    latencies: list[list[float]] = [[] for _ in range(workers)]
    stop_at = time.perf_counter() + seconds
    ShardClient(address, token, "bench", "setup").register(SPEC)

    def work(i: int) -> None:
        with ShardClient(address, token, "bench", str(i), config=ShardClientConfig(prefetch_shards=0)) as c:
            while time.perf_counter() < stop_at:
                shard = c.next_shard(timeout_s=30)
                assert shard is not None
                for n in range(shard.consumed + 1, shard.size + 1):
                    t0 = time.perf_counter()
                    c.report_progress(shard.shard_id, n)
                    latencies[i].append(time.perf_counter() - t0)
                    if time.perf_counter() >= stop_at:
                        return
                c.report_done(shard.shard_id)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return len(flat), flat


def _hold(registry: ShardRegistry, held: int) -> None:
    """`held` silent workers each lease one shard (the registry's own calls: a host that journals logs them)."""
    registry.register(SPEC)
    for i in range(held):
        registry.fetch(SPEC.name, f"held-{i}")


def _library(held: int) -> Callable[[int, float], tuple[int, list[float]]]:
    def run(workers: int, seconds: float) -> tuple[int, list[float]]:
        token = generate_token()
        server = GrpcServer(ServerConfig(), token)
        registry = ShardRegistry(SystemClock())
        _hold(registry, held)
        add_shard_service(server, registry)
        server.start()
        try:
            return _drive(server.address, token, workers, seconds)
        finally:
            server.stop()

    return run


def _master(every_change: bool, held: int) -> Callable[[int, float], tuple[int, list[float]]]:
    def run(workers: int, seconds: float) -> tuple[int, list[float]]:
        with tempfile.TemporaryDirectory() as state:
            cfg = MasterConfig(
                lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), node_start_timeout_s=None),
                backend="external",
                state_dir=state,
                journal_shard_changes=every_change,
            )
            with create_master(cfg, scheduler=ExternalScheduler()) as rt:
                assert rt.shards is not None
                with rt.shards.locked() as registry:
                    _hold(registry, held)
                rt.shards.changed_by_request()  # journaled before the measurement
                return _drive(rt.address, rt.token, workers, seconds)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--held", type=int, default=0, help="other workers' leases held meanwhile")
    args = parser.parse_args()
    if args.held < 0:
        parser.error(f"--held must not be negative, got {args.held}")
    workers, seconds = (4, 3.0) if args.quick else (8, 10.0)
    rows = [
        ("library alone", _library(args.held)),
        ("master, cadence only", _master(False, args.held)),
        ("master, every change", _master(True, args.held)),
    ]
    print(
        f"{workers} workers, {seconds:g} s per row, one ReportProgress per acknowledged sample, "
        f"{args.held} other leases held"
    )
    print(f"{'setup':<24}{'reports/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'vs library':>12}")
    alone = 0.0
    for name, run in rows:
        count, lat = run(workers, seconds)
        lat.sort()
        p50 = statistics.median(lat) * 1e3
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
        rate = count / seconds
        alone = alone or rate
        print(f"{name:<24}{rate:>12.0f}{p50:>10.2f}{p99:>10.2f}{rate / alone:>11.2f}x")


if __name__ == "__main__":
    main()
