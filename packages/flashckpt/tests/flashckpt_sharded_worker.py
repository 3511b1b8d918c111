"""FSDP2 (``fully_shard``, CPU, gloo) jobs of several sizes for test_sharded.py.

The driver runs phases in order, each a job of WORLD ranks forked from it:

* ``train:WORLD``: trains 3 steps, staging every step in shared memory; steps 1 and 2 are
  persisted with DCP; prints the full (unsharded) state after each step. Then, as a restarted
  trainer of the same size, restores (below), which finds step 3 in memory.
* ``restore:WORLD``: builds the model from another seed, scrambles it, loads (memory when every
  rank holds a step with this sharding, else storage, resharded) and prints where it came from,
  the full state and whether the parameters' local shards kept their memory.
* ``trainonly:WORLD``: ``train`` without the restore: the processes die with their snapshots in memory.
* ``corrupt:STEP``: flips a byte of one DCP file of that step; ``corruptrank:STEP`` of the last
  rank's file of a step saved rank by rank.
* ``nodesave:WORLD``: plays the node saver after the training processes died: persists each
  rank's newest complete snapshot from shared memory in the per-rank format (exactly what the
  saver writes: `payload_from_slot` + `persist_rank`) and commits the step.

Each line on stdout is one JSON object. Segments are kept (``close(remove=False)``) so a later
phase of the same job sees them; the test removes them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.layout import SlotState
from dlrover.flashckpt.payloads import payload_from_slot
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.sharded import ShardedCheckpointer, get_sharded_state, set_sharded_state
from dlrover.flashckpt.slotio import peek_header, read_header
from dlrover.flashckpt.storage import PosixStorage


def emit(sink: Path | None, **kw: object) -> None:
    """One JSON line to `sink` (a rank's own file: lines of forked ranks on one pipe could
    interleave), or to stdout."""
    line = json.dumps(kw) + "\n"
    if sink is None:
        sys.stdout.write(line)
        sys.stdout.flush()
    else:
        with open(sink, "a") as f:
            f.write(line)


def build(world: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def digest(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, str]:
    """The full state (gathered, collective) as exact strings: dtype, shape and bytes of tensors."""
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    out: dict[str, str] = {}

    def visit(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().contiguous().cpu()
            out[path] = f"{t.dtype}{list(t.shape)}:{t.reshape(-1).view(torch.uint8).numpy().tobytes().hex()}"
        elif isinstance(obj, dict):
            for k, v in obj.items():
                visit(v, f"{path}/{k}")
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                visit(v, f"{path}/{i}")
        else:
            out[path] = repr(obj)

    visit({"model": msd, "optim": osd}, "")
    return out


def local_ptrs(model: torch.nn.Module) -> list[int]:
    return [p.to_local().data_ptr() for p in model.parameters()]  # type: ignore[operator]


def restore(ckpt: ShardedCheckpointer, world: int, rank: int, sink: Path) -> None:
    """Build the model from another seed, scramble it, load, and report."""
    model, opt = build(world, 99)
    state = get_sharded_state(model, opt)
    state["step"] = -1
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().fill_(7.0)  # type: ignore[operator]
    before = local_ptrs(model)
    loaded = ckpt.load(state)
    set_sharded_state(model, opt, loaded.state)
    same_memory = local_ptrs(model) == before
    full = digest(model, opt)
    emit(
        sink,
        event="loaded",
        world=world,
        rank=rank,
        source=loaded.source,
        step=loaded.step,
        state_step=loaded.state["step"],
        same_memory=same_memory,
        verified=loaded.verified,
        events=[[e.kind, e.step, e.reason] for e in ckpt.events.snapshot()],
        full=full,
    )


def train(ckpt: ShardedCheckpointer, world: int, rank: int, sink: Path) -> None:
    """Train 3 steps, staging each, persisting steps 1 and 2; report the full state of each."""
    model, opt = build(world, 0)
    ckpt.prepare(get_sharded_state(model, opt))
    for step in (1, 2, 3):
        torch.manual_seed(100 + step * 10 + rank)
        opt.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        state = get_sharded_state(model, opt)
        state["step"] = step
        saved = ckpt.save(step, state)
        ckpt.stager.flush()
        if step == 1:
            decision = ckpt.persist(step)
        elif step == 2:
            # In the background, on the checkpointer's own group, while step 3 trains.
            pending = ckpt.persist_async(step)
        else:
            decision = pending.result(timeout=60)
        full = digest(model, opt)
        if rank == 0:
            emit(
                sink,
                event="trained",
                step=step,
                saved=saved.saved,
                committed=decision.commit if step != 2 else None,
                reason=decision.reason if step != 2 else None,
                full=full,
            )


def run_rank(mode: str, rank: int, world: int, *, init: str, job: str, storage: str, sink: Path) -> None:
    """One rank of one phase (a forked child of the driver)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    cfg = StagerConfig(job_id=job, run_id="fsdp", rank=rank, world_size=world, copy_threads=1)
    ckpt = ShardedCheckpointer(cfg, storage, group=dist.new_group(backend="gloo"))
    if mode in ("train", "trainonly"):
        train(ckpt, world, rank, sink)
        ckpt.close(remove=False)
        dist.barrier()
        if mode == "trainonly":  # the processes die here; their snapshots stay in memory
            dist.destroy_process_group()
            return
        # A restarted trainer of the same size (played by the same process to stay fast): a
        # fresh checkpointer finds every rank's step 3 in memory.
        ckpt = ShardedCheckpointer(cfg, storage, group=dist.new_group(backend="gloo"))
    restore(ckpt, world, rank, sink)
    dist.barrier()
    ckpt.close(remove=False)
    dist.destroy_process_group()


def node_save(job: str, storage: str, world: int) -> None:
    """Persist every rank's newest complete snapshot as a node saver does, without the ranks."""
    steps = set()
    for rank in range(world):
        found = []
        for slot in range(2):
            path = segment_path("/dev/shm", job, "fsdp", rank, slot)
            header = peek_header(path)
            if header is not None and header.state >= SlotState.COMPLETE:
                found.append((header.seq, slot))
        _, slot = max(found)
        seg = ShmSegment.attach(segment_path("/dev/shm", job, "fsdp", rank, slot))
        try:
            assert seg.try_lock(exclusive=False)
            header = read_header(seg)
            assert header is not None
            persist_rank(PosixStorage(storage), payload_from_slot(seg, header, rank, world))
            steps.add(header.step)
            seg.unlock()
        finally:
            seg.close()
    (step,) = steps
    decision = Committer(PosixStorage(storage)).try_commit(step, world)
    emit(None, event="node_saved", step=step, committed=decision.commit)


def corrupt(storage: str, step: int, pattern: str = "*.distcp") -> None:
    """Flip one byte in the middle of the first DCP data file (or other `pattern`) of `step`."""
    path = sorted(Path(storage, str(step)).glob(pattern))[-1]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    emit(None, event="corrupted", file=f"{step}/{path.name}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--storage", required=True)
    p.add_argument("--tmp", required=True)
    p.add_argument("--timeout-s", type=float, default=100.0)
    p.add_argument("phases", nargs="+", help="train:WORLD, restore:WORLD, corrupt:STEP or nodesave:WORLD, in order")
    a = p.parse_args()
    for n, phase in enumerate(a.phases):
        mode, arg = phase.split(":")
        if mode == "corrupt":
            corrupt(a.storage, int(arg))
            continue
        if mode == "corruptrank":
            corrupt(a.storage, int(arg), "rank_*.safetensors")
            continue
        if mode == "nodesave":
            node_save(a.job, a.storage, int(arg))
            continue
        world = int(arg)
        run_ranks(run_rank, (mode,), world, tmp=Path(a.tmp), n=n, timeout_s=a.timeout_s, job=a.job, storage=a.storage)


def run_ranks(
    target: Callable[..., None],
    args: tuple[Any, ...],
    world: int,
    *,
    tmp: Path,
    n: int,
    timeout_s: float,
    **kwargs: Any,
) -> None:
    """Phase `n`: `world` ranks forked from this process, each ``target(*args, rank, world, init=...,
    sink=..., **kwargs)``; their output is copied to stdout.

    torch and FSDP are imported once by the driver and the ranks are forked: importing them in
    every rank would cost seconds per process on a busy machine. Nothing has started a thread yet.

    Raises:
        SystemExit: a rank failed or did not finish within `timeout_s`.
    """
    ctx = mp.get_context("fork")
    init = f"file://{tmp / f'pg.{n}'}"
    sinks = [tmp / f"events.{n}.{r}.jsonl" for r in range(world)]
    procs = [
        ctx.Process(target=target, args=(*args, r, world), kwargs={"init": init, "sink": sinks[r], **kwargs})
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout_s)
    codes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    for sink in sinks:
        if sink.exists():
            sys.stdout.write(sink.read_text())
    sys.stdout.flush()
    if codes != [0] * world:
        raise SystemExit(f"phase {n} ({args}, world {world}) failed: exit codes {codes}")


if __name__ == "__main__":
    main()
