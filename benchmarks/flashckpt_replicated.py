"""A replicated (DDP) restore after a grow: a rank with no snapshot receives one, 2 ranks (gloo, CPU).

Rank 0's node holds the newest snapshot in shared memory; rank 1's node holds none (it joined).
Rows, each the slower rank's time, median and range of several repetitions:

* replicated load: ``FlashCheckpointer(replicated=True).load(target)`` on both ranks: rank 0
  restores from its memory, rank 1 receives the state over the process group into its existing
  tensors (the JSON tree, then each tensor's bytes);
* raw broadcast: ``dist.broadcast`` of one flat uint8 tensor of the same size, already in memory:
  the transport's own limit here, which the ratio is against;
* rank 0's own restore: rank 0 alone restoring the snapshot from its memory into its tensors
  (checksums verified), the part of the replicated load that is not the transfer;
* torch.load: rank 1 reading the same state with ``torch.load`` from a local file (page cache
  warm), what a joining rank reads from storage without this path.

    python benchmarks/flashckpt_replicated.py            # 256 MB of state
    python benchmarks/flashckpt_replicated.py --mb 1024 --reps 3

The machine may be shared: numbers vary between runs; compare medians, and the ranges.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlrover.flashckpt import FlashCheckpointer, MemoryReader, StagerConfig

TENSORS = 64


def _state(mb: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    per = (mb << 20) // TENSORS // 4
    weights = {f"layer{i}": torch.randn(per, generator=g) for i in range(TENSORS // 2)}
    moments = {f"layer{i}": torch.randn(per, generator=g) for i in range(TENSORS // 2)}
    return {"model": weights, "optim": {"exp_avg": moments, "step": 10}, "step": 10}


def _rank(rank: int, args: argparse.Namespace, root: str, results: Any) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=2)
    shm = Path(root) / f"shm{rank}"  # each rank its own "node"
    shm.mkdir(exist_ok=True)
    job = "bench" + uuid.uuid4().hex[:8] if rank == 0 else ""
    job = _broadcast_text(job)
    cfg = StagerConfig(job_id=job, run_id="r", rank=rank, world_size=2, shm_dir=str(shm))
    if rank == 0:
        stage = FlashCheckpointer(
            StagerConfig(job_id=job, run_id="r", shm_dir=str(shm)), f"{root}/ck", saver="none", replicated=True
        )
        stage.save(10, _state(args.mb, 1))
        stage.stager.flush()
        stage.close()
    target = _state(args.mb, 2)
    nbytes = sum(t.numel() * 4 for part in (target["model"], target["optim"]["exp_avg"]) for t in part.values())
    if rank == 1:
        torch.save(_state(args.mb, 1), f"{root}/state.pt")
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    rows: dict[str, list[float]] = {
        "replicated load": [],
        "raw broadcast": [],
        "rank 0's restore": [],
        "torch.load": [],
    }
    for _ in range(args.reps):
        ckpt = FlashCheckpointer(cfg, f"{root}/ck", saver="none", replicated=True)
        rows["replicated load"].append(_slowest(lambda c=ckpt: c.load(target=target)))
        ckpt.close()
        rows["raw broadcast"].append(_slowest(lambda: dist.broadcast(flat, src=0)))
        reader = MemoryReader(cfg)
        rows["rank 0's restore"].append(_slowest(lambda r=reader: r.load(target=target) if rank == 0 else None))
        rows["torch.load"].append(
            _slowest(lambda: torch.load(f"{root}/state.pt", weights_only=True) if rank == 1 else None)
        )
    if rank == 0:
        results.put((rows, nbytes))
    dist.barrier()
    dist.destroy_process_group()


def _broadcast_text(text: str) -> str:
    data = torch.zeros(64, dtype=torch.uint8)
    data[: len(text)] = torch.tensor(list(text.encode()), dtype=torch.uint8)
    dist.broadcast(data, src=0)
    return bytes(data.tolist()).rstrip(b"\0").decode()


def _slowest(work: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    work()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=256, help="state size in MB")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="bench-replicated-", dir="/dev/shm")  # snapshots live in shared memory
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    try:
        procs = [ctx.Process(target=_rank, args=(r, args, root, results)) for r in range(2)]
        for proc in procs:
            proc.start()
        rows, nbytes = results.get(timeout=1800)
        for proc in procs:
            proc.join(timeout=120)
            if proc.exitcode != 0:
                raise SystemExit(f"a rank failed (exit code {proc.exitcode})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(rows["raw broadcast"])
    print(f"\nreplicated restore of {nbytes / 2**20:.0f} MB to a rank with no snapshot (2 ranks, gloo)\n")
    print(f"| {'row':<16} | {'median s':>9} | {'range s':>13} | {'GB/s':>6} | {'vs raw broadcast':>16} |")
    print(f"|{'-' * 18}|{'-' * 11}|{'-' * 15}|{'-' * 8}|{'-' * 18}|")
    for name, times in rows.items():
        med = statistics.median(times)
        span = f"{min(times):.3f}..{max(times):.3f}"
        print(f"| {name:<16} | {med:>9.3f} | {span:>13} | {nbytes / med / 1e9:>6.2f} | {med / base:>15.2f}x |")


if __name__ == "__main__":
    main()
