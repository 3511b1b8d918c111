"""In-process shard manager: operations per second and memory per outstanding shard.

    python benchmarks/shard_manager.py            # 1,000,000 shards, 10,000 workers
    python benchmarks/shard_manager.py --quick    # 100,000 shards, 1,000 workers (smoke run)

Memory is measured with tracemalloc in its own phase (tracing slows everything down); speeds are
measured without it. The clock is a ManualClock: the core never reads time, so a benchmark of
the core measures the core.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from collections.abc import Callable

from dlrover.common import ManualClock
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardManager, ShardRegistry
from dlrover.shard.progress import encode_progress
from dlrover.shard.shard import encode_bitmap, mix_seed


def _spec(num_shards: int, delivery: DeliveryMode = DeliveryMode.EXACTLY_ONCE) -> DatasetSpec:
    return DatasetSpec(
        name="bench",
        source=IndexSource(num_shards * 64),
        batch_size=16,
        batches_per_shard=4,
        shuffle=True,
        shuffle_samples=True,
        delivery=delivery,
        lease_timeout_s=3600.0,
    )


def _rate(n: int, fn: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def memory(num_shards: int, workers: int, per_worker: int) -> list[tuple[str, str]]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    m = ShardManager(_spec(num_shards), ManualClock())
    m.fetch("w0", 1)  # materializes epoch 0: the shuffled order of every shard
    todo_bytes = tracemalloc.get_traced_memory()[0] - base
    before = tracemalloc.get_traced_memory()[0]
    for w in range(workers):
        m.fetch(f"worker-{w}", per_worker)
    leased = workers * per_worker
    leased_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return [
        ("outstanding shards (todo)", f"{num_shards:,}"),
        ("bytes per todo shard", f"{todo_bytes / num_shards:.1f}"),
        ("leased shards", f"{leased:,} ({workers:,} workers x {per_worker})"),
        ("bytes per leased shard", f"{leased_bytes / leased:.0f}"),
        ("manager total (MiB)", f"{(todo_bytes + leased_bytes) / 2**20:.1f}"),
    ]


def speed(num_shards: int, workers: int, ops: int) -> list[tuple[str, str]]:
    clock = ManualClock()
    reg = ShardRegistry(clock)
    reg.register(_spec(num_shards))
    m = reg.manager("bench")
    names = [f"worker-{w}" for w in range(workers)]
    rows = []
    t0 = time.perf_counter()
    m.fetch(names[0], 1)
    rows.append(("first fetch (materialize + shuffle epoch), s", f"{time.perf_counter() - t0:.2f}"))
    leased: list[tuple[str, int]] = []

    def fetch(i: int) -> None:
        w = names[i % workers]
        leased.append((w, m.fetch(w, 1).shards[0].shard_id))

    rows.append(("fetch 1 shard, ops/s", f"{_rate(ops, fetch):,.0f}"))
    rows.append(("progress report, ops/s", f"{_rate(ops, lambda i: m.report_progress(*leased[i], 10)):,.0f}"))
    rows.append(("done report, ops/s", f"{_rate(ops, lambda i: m.report_done(*leased[i])):,.0f}"))
    cycle_ids: list[int] = []

    def cycle(i: int) -> None:
        w = names[i % workers]
        sid = m.fetch(w, 1).shards[0].shard_id
        m.report_progress(w, sid, 32)
        m.report_done(w, sid)
        cycle_ids.append(sid)

    rows.append(("fetch+progress+done cycle, cycles/s", f"{_rate(ops, cycle):,.0f}"))
    for w in range(workers):
        m.fetch(names[w], 5)
    t0 = time.perf_counter()
    gone = sum(len(m.remove_worker(n)) for n in names)
    rows.append((f"remove {workers:,} workers ({gone:,} leases), s", f"{time.perf_counter() - t0:.3f}"))
    for w in range(workers):
        m.fetch(names[w], 5)
    clock.advance(7200)
    t0 = time.perf_counter()
    expired = len(m.expire_leases())
    rows.append((f"expire {expired:,} leases, s", f"{time.perf_counter() - t0:.3f}"))
    t0 = time.perf_counter()
    doc = reg.checkpoint("bench")
    rows.append(("progress checkpoint (50,000 shards requeued), s", f"{time.perf_counter() - t0:.3f}"))
    rows.append(("progress checkpoint size, KiB", f"{len(doc) / 1024:,.0f}"))
    t0 = time.perf_counter()
    ShardRegistry(clock).restore(doc)
    rows.append(("restore, s", f"{time.perf_counter() - t0:.3f}"))
    return rows


def position_read(num_shards: int, ranks: int) -> list[tuple[str, str]]:
    """Data position reads in steady training: a fifth of the epoch done, one lease per rank.

    A training loop reads its position after every step on every rank, so what a step's reads cost
    the master matters, not one read. Measured here: one step of `ranks` ranks in lockstep (each
    acknowledges its shard; then each reads the position and leases its next shard, as
    `ShardClient.checkpoint(lease_next=True)` does), with the registry's reads (`checkpoint`, which
    reuses a read while only leases changed the position) beside the same reads written afresh
    every time (`encode_progress`, what each read cost before reuse). A single read is also timed
    beside its peer: encoding the done ids the way a set of them must be (a walk over every id).
    """
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(num_shards))
    m = reg.manager("bench")
    names = [f"rank-{r}" for r in range(ranks)]
    for i in range(num_shards // 5):
        w = names[i % ranks]
        m.report_done(w, m.fetch(w, 1).shards[0].shard_id)
    held = {w: m.fetch(w, 1).shards[0].shard_id for w in names}

    def step(read: Callable[[], str]) -> float:
        for w in names:
            m.report_done(w, held[w])
        t0 = time.perf_counter()
        for w in names:
            read()
            held[w] = m.fetch(w, 1).shards[0].shard_id
        return time.perf_counter() - t0

    # One step each, measured alike (the afresh one takes seconds at a million shards).
    reused_s = step(lambda: reg.checkpoint("bench"))
    afresh_s = step(lambda: encode_progress(m))
    t0 = time.perf_counter()
    doc = encode_progress(m)
    read_s = time.perf_counter() - t0
    done_ids = sorted(m.snapshot().done)
    t0 = time.perf_counter()
    encode_bitmap(done_ids, 0, num_shards)
    walk_s = time.perf_counter() - t0
    # What a recovery waits for: rank 0 restores the position its checkpoint holds. Its floor is
    # the epoch's shuffled order, which a restore must compute again from the seed.
    position = reg.checkpoint("bench")
    t0 = time.perf_counter()
    ShardRegistry(ManualClock()).restore(position)
    restore_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    random.Random(mix_seed(0, 0)).shuffle(list(range(num_shards)))
    shuffle_s = time.perf_counter() - t0
    return [
        (f"one read ({len(done_ids):,} done, {ranks:,} leased), ms", f"{read_s * 1e3:.2f}"),
        ("  peer: encoding those done ids from a list, ms", f"{walk_s * 1e3:.2f}"),
        ("  read / peer", f"{read_s / walk_s:.3f}x"),
        ("  position size, KiB", f"{len(doc) / 1024:,.0f}"),
        (f"a step's reads and leases by {ranks:,} ranks, reused reads, ms", f"{reused_s * 1e3:.1f}"),
        ("  peer: the same reads written afresh each time, ms", f"{afresh_s * 1e3:.1f}"),
        ("  reused / afresh", f"{reused_s / afresh_s:.4f}x"),
        ("restore of that position, ms", f"{restore_s * 1e3:.1f}"),
        ("  peer: shuffling the epoch's shard ids once, ms", f"{shuffle_s * 1e3:.1f}"),
        ("  restore / shuffle", f"{restore_s / shuffle_s:.2f}x"),
    ]


def _table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(f"\n{title}")
    print(f"  {'measure':<{width}}  value")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100,000 shards and 1,000 workers")
    args = parser.parse_args()
    shards, workers = (100_000, 1_000) if args.quick else (1_000_000, 10_000)
    ops = 20_000 if args.quick else 100_000
    _table(f"memory: {shards:,} shards, {workers:,} workers", memory(shards, workers, 10))
    _table(f"speed: {shards:,} shards, {workers:,} workers, {ops:,} ops each", speed(shards, workers, ops))
    ranks = 100 if args.quick else 1_000
    _table(f"data position reads in steady training: {shards:,} shards, {ranks:,} ranks", position_read(shards, ranks))


if __name__ == "__main__":
    main()
