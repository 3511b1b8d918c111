"""Sharded (FSDP2) flash checkpoint beside plain DCP, 2 ranks on CPU (gloo), in one run.

Rows (each the slowest rank; the median and range of several repetitions, the two disk writers
interleaved and taking turns going first):

* blocking save: ``ShardedCheckpointer.save`` (local shards -> shared memory) beside
  ``torch.distributed.checkpoint.save`` of the live state to local disk with fsync (what training
  blocks for without flashckpt); the ratio is the speed-up;
* persist: our DCP write of the staged snapshot with checksums and commit, beside the same
  plain DCP save (the cost of reading the snapshot, checksums and the commit protocol);
* restore: from shared memory into the existing shards beside ``torch.distributed.checkpoint.load``
  from disk.

With ``--staged``, two more rows price the object-store path (a `Storage` that is not a POSIX
path: DCP writes a local staging copy that is streamed to the storage, and a load downloads the
whole step into a staging copy first). The "object store" here is the same local disk behind a
wrapper, so the rows measure the staging and streaming alone, not a network:

* persist: staged (DCP into staging + CRC-32 while uploading + commit) beside in place;
* restore from storage: staged (download + verify + DCP load) beside in place (verify + DCP load).

    python benchmarks/flashckpt_sharded.py                # about 256 MB of state in all
    python benchmarks/flashckpt_sharded.py --mb 1024 --reps 6
    python benchmarks/flashckpt_sharded.py --staged

Every row starts after ``os.sync()``, and both writers' directories are removed after each
repetition (outside the timing), so neither writes onto a fuller disk than the other. The machine
may be shared: numbers vary between runs; compare medians, and the ranges.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dcp_transfer import StagingConfig
from dlrover.flashckpt.segment import remove_run
from dlrover.flashckpt.sharded import ShardedCheckpointer, get_sharded_state
from dlrover.flashckpt.storage import Chunk, PosixStorage

MB = 1 << 20
WORLD = 2


def timed(fn: Callable[[], object]) -> float:
    """Seconds of `fn` on the slowest rank (all ranks start together).

    Dirty pages of the previous row are flushed first: otherwise whichever write comes second
    pays for the disk still writing back the first.
    """
    os.sync()
    dist.barrier()
    start = time.perf_counter()
    fn()
    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took.item())


class LocalObjectStore:
    """A POSIX directory that the checkpointer must treat as an object store (it is no
    `PosixStorage`), so the staged path runs at local-disk speed: what staging itself costs."""

    def __init__(self, root: Path) -> None:
        self.inner = PosixStorage(root)

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        return self.inner.write_file(path, chunks)

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        return self.inner.read_bytes(path, offset, length)

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        self.inner.read_into(path, offset, buf)

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def list_dir(self, path: str) -> list[str]:
        return self.inner.list_dir(path)

    def remove_tree(self, path: str) -> None:
        self.inner.remove_tree(path)


def rank_main(rank: int, init: str, job: str, *, tmp: str, total_mb: int, reps: int, out: str, staged: bool) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    width = 1024
    # A Linear(width, width) holds 4 MB of weights; AdamW adds two more copies: 12 MB of state.
    layers = max(1, total_mb // 12)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    state = get_sharded_state(model, opt)
    state_bytes = sum(
        t.to_local().numel() * t.element_size() if hasattr(t, "to_local") else t.numel() * t.element_size()
        for t in _tensors(state)
    )
    cfg = StagerConfig(job_id=job, run_id="bench", rank=rank, world_size=WORLD, copy_threads=2)
    ckpt = ShardedCheckpointer(cfg, Path(tmp) / "flash")
    ckpt.prepare(state)
    rows: dict[str, list[float]] = {"save_mem": [], "save_dcp": [], "persist": [], "load_mem": [], "load_dcp": []}
    other: ShardedCheckpointer | None = None
    if staged:
        rows.update({"persist_staged": [], "load_posix": [], "load_staged": []})
        other = ShardedCheckpointer(
            StagerConfig(job_id=job, run_id="bench-staged", rank=rank, world_size=WORLD, copy_threads=2),
            storage=LocalObjectStore(Path(tmp) / "objects"),
            staging=StagingConfig(parent_dir=tmp),
        )
        other.prepare(state)
    for i in range(reps):
        step = i + 1
        rows["save_mem"].append(timed(lambda step=step: ckpt.save(step, state)))
        ckpt.stager.flush()
        plain = Path(tmp) / f"plain{step}"

        def plain_save(path: Path = plain) -> None:
            dcp_save(state, storage_writer=FileSystemWriter(path, sync_files=True))

        # The two disk writers take turns going first: the second one here runs measurably slower
        # (the virtual disk is still absorbing the first one's data after os.sync returns).
        writers = [("save_dcp", plain_save), ("persist", lambda step=step: ckpt.persist(step))]
        for name, fn in writers if i % 2 == 0 else writers[::-1]:
            rows[name].append(timed(fn))
        rows["load_mem"].append(timed(lambda: ckpt.load(state)))

        def plain_load(path: Path = plain) -> None:
            dcp_load(state, storage_reader=FileSystemReader(path))

        rows["load_dcp"].append(timed(plain_load))
        if other is not None:
            other.save(step, state)
            other.stager.flush()
            rows["persist_staged"].append(timed(functools.partial(_persist_committed, other, step)))
            for name, c in (("load_posix", ckpt), ("load_staged", other)):
                rows[name].append(timed(functools.partial(_load_from_storage, c, state, step)))
        dist.barrier()
        if rank == 0:
            # Every writer's output goes, so each writes onto the same disk state.
            shutil.rmtree(plain, ignore_errors=True)
            shutil.rmtree(Path(tmp) / "flash" / str(step), ignore_errors=True)
            shutil.rmtree(Path(tmp) / "objects" / str(step), ignore_errors=True)
    if rank == 0:
        result = {"rank_state_mb": state_bytes / MB, "layers": layers, "rows": rows}
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    ckpt.close(remove=True)
    if other is not None:
        other.close(remove=True)
    dist.destroy_process_group()


def _persist_committed(ckpt: ShardedCheckpointer, step: int) -> None:
    decision = ckpt.persist(step)
    if not decision.commit:
        raise RuntimeError(f"persist not committed: {decision.reason}")


def _load_from_storage(ckpt: ShardedCheckpointer, state: Any, step: int) -> None:
    loaded = ckpt.load(state, from_memory=False)
    if (loaded.source, loaded.step) != ("storage", step):
        raise RuntimeError(f"loaded {loaded.source} step {loaded.step}, expected storage step {step}")


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=256, help="model + optimizer state over both ranks, MB")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary dir)")
    p.add_argument("--staged", action="store_true", help="also time the object-store (staged) path")
    a = p.parse_args()
    job = "bench" + uuid.uuid4().hex[:8]
    tmp = tempfile.mkdtemp(prefix="flashckpt-sharded-", dir=a.dir)
    out = str(Path(tmp) / "result.json")
    try:
        # torch and FSDP are imported here once; the ranks are forked.
        ctx = mp.get_context("fork")
        init = f"file://{Path(tmp) / 'pg'}"
        procs = [
            ctx.Process(
                target=rank_main,
                args=(r, init, job),
                kwargs={"tmp": tmp, "total_mb": a.mb, "reps": a.reps, "out": out, "staged": a.staged},
            )
            for r in range(WORLD)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(1800)
        if any(proc.exitcode != 0 for proc in procs):
            raise SystemExit(f"a rank failed: exit codes {[proc.exitcode for proc in procs]}")
        result = json.loads(Path(out).read_text())
    finally:
        remove_run("/dev/shm", job, "bench")
        remove_run("/dev/shm", job, "bench-staged")
        shutil.rmtree(tmp, ignore_errors=True)
    runs = result["rows"]
    rows = {k: statistics.median(v) for k, v in runs.items()}
    print(f"FSDP2, {WORLD} ranks, {result['rank_state_mb']:.0f} MB of state per rank, median of {a.reps}")
    print(f"{'what':<44}{'flashckpt s':>12}{'DCP s':>10}{'ratio':>9}   ranges (s)")
    table = [
        ("blocking save (memory vs DCP to disk)", "save_mem", "save_dcp"),
        ("persist (DCP + checksums + commit vs DCP)", "persist", "save_dcp"),
        ("restore (memory in place vs DCP load)", "load_mem", "load_dcp"),
    ]
    if a.staged:
        table += [
            ("persist: staged vs in place (the 'DCP s' col)", "persist_staged", "persist"),
            ("storage load: staged vs in place", "load_staged", "load_posix"),
        ]
    for name, ours, theirs in table:
        spans = f"{min(runs[ours]):.3f}-{max(runs[ours]):.3f} vs {min(runs[theirs]):.3f}-{max(runs[theirs]):.3f}"
        print(f"{name:<44}{rows[ours]:>12.4f}{rows[theirs]:>10.4f}{rows[theirs] / rows[ours]:>8.2f}x   {spans}")
    print("every repetition (s):")
    for name, values in runs.items():
        print(f"  {name:<15}" + " ".join(f"{v:.3f}" for v in values))


if __name__ == "__main__":
    main()
