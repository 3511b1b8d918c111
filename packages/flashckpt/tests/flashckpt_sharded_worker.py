"""FSDP (CPU, gloo) jobs of several sizes for test_sharded.py: FSDP2 (``fully_shard``) by default,
FSDP1 (``FullyShardedDataParallel`` with a ``device_mesh``) with ``--fsdp 1``.

The driver runs phases in order, each a job of WORLD ranks forked from it:

* ``train:WORLD``: trains 3 steps, staging every step in shared memory; steps 1 and 2 are
  persisted with DCP; prints the full (unsharded) state after each step. Then, as a restarted
  trainer of the same size, restores (below), which finds step 3 in memory.
* ``restore:WORLD``: builds the model from another seed, scrambles it, loads (memory when every
  rank holds a step with this sharding, else storage, resharded) and prints where it came from,
  the full state and whether the parameters' local shards kept their memory.
* ``traindie:WORLD``: ``train`` with a detached node saver (``saver="auto"``), then every rank
  SIGKILLs itself: the saver persists the newest snapshot rank by rank. ``awaitcommit:STEP``
  waits until that step is committed; ``stopsaver:WORLD`` shuts the saver down.
* ``corrupt:STEP``: flips a byte of one DCP file of that step; ``corruptrank:STEP`` of the last
  rank's file of a step saved rank by rank.

FSDP1's sharded state dict is made of DTensors only when it is built with a ``device_mesh``;
on CPU it also needs ``device_id=cpu`` (without one it looks for an accelerator). Its
parameters are flat parameters (``use_orig_params=False``, the default) and its state dict
tensors are copies of their shards, not views: "in place" means the flat parameters keep their
memory.

Each line on stdout is one JSON object. Segments are kept (``close(remove=False)``) so a later
phase of the same job sees them; the test removes them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.tensor import DTensor

from dlrover.flashckpt.client import SaverClient
from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.saver import socket_path
from dlrover.flashckpt.sharded import ShardedCheckpointer, get_sharded_state, set_sharded_state
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


def build(world: int, seed: int, fsdp: int, device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model on `device`, each Linear and the whole sharded (FSDP1 or FSDP2), and its optimizer."""
    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(seed)
    layers = [m.to(device) for m in (torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6))]
    model: torch.nn.Module
    if fsdp == 1:
        on = torch.device(device)
        wrapped = [
            FullyShardedDataParallel(m, device_mesh=mesh, device_id=on) if isinstance(m, torch.nn.Linear) else m
            for m in layers
        ]
        model = FullyShardedDataParallel(torch.nn.Sequential(*wrapped), device_mesh=mesh, device_id=on)
    else:
        model = torch.nn.Sequential(*layers)
        for layer in layers:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def local_shards(model: torch.nn.Module) -> list[torch.Tensor]:
    """The memory this rank trains: FSDP2's DTensor parameters' local shards, FSDP1's flat
    parameters (plain tensors)."""
    return [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]


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
    return [t.data_ptr() for t in local_shards(model)]


def restore(ckpt: ShardedCheckpointer, world: int, rank: int, sink: Path, fsdp: int) -> None:
    """Build the model from another seed, scramble it, load, and report."""
    model, opt = build(world, 99, fsdp)
    state = get_sharded_state(model, opt)
    state["step"] = -1
    with torch.no_grad():
        for shard in local_shards(model):
            shard.fill_(7.0)
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


def train(ckpt: ShardedCheckpointer, world: int, rank: int, sink: Path, fsdp: int) -> None:
    """Train 3 steps, staging each, persisting steps 1 and 2; report the full state of each."""
    model, opt = build(world, 0, fsdp)
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


def run_rank(mode: str, rank: int, world: int, *, init: str, job: str, storage: str, sink: Path, fsdp: int) -> None:
    """One rank of one phase (a forked child of the driver)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    cfg = StagerConfig(job_id=job, run_id="fsdp", rank=rank, world_size=world, copy_threads=1)
    saver = "auto" if mode == "traindie" else "none"  # a detached node saver, started by the first rank
    ckpt = ShardedCheckpointer(cfg, storage, group=dist.new_group(backend="gloo"), saver=saver)
    if mode == "traindie":
        train(ckpt, world, rank, sink, fsdp)
        ckpt.stager.flush()  # every snapshot sealed: the saver was told
        if rank == 0 and ckpt.client is not None:
            emit(sink, event="saver", pid=ckpt.client.saver_pid)
        # Every rank has sealed its last snapshot before any dies: a file barrier, since a gloo
        # barrier's peers may still be in it when the first one is killed.
        (sink.parent / f"sealed.{rank}").touch()
        deadline = time.monotonic() + 60
        while not all((sink.parent / f"sealed.{r}").exists() for r in range(world)):
            if time.monotonic() > deadline:
                raise SystemExit("the other ranks never sealed their last snapshot")
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)  # the processes die; the saver outlives them
    if mode == "train":
        train(ckpt, world, rank, sink, fsdp)
        ckpt.close(remove=False)
        dist.barrier()
        # A restarted trainer of the same size (played by the same process to stay fast): a
        # fresh checkpointer finds every rank's step 3 in memory.
        ckpt = ShardedCheckpointer(cfg, storage, group=dist.new_group(backend="gloo"))
    restore(ckpt, world, rank, sink, fsdp)
    dist.barrier()
    ckpt.close(remove=False)
    dist.destroy_process_group()


def await_commit(storage: str, step: int, timeout_s: float = 90.0) -> None:
    """Wait (bounded) until the tracker names `step`; report the step's manifest format."""
    committer = Committer(PosixStorage(storage))
    deadline = time.monotonic() + timeout_s
    while (tracker := committer.tracker()) is None or tracker.step < step:
        if time.monotonic() > deadline:
            raise SystemExit(f"step {step} was not committed within {timeout_s} s (tracker {tracker})")
        time.sleep(0.1)
    manifest = json.loads(Path(storage, str(tracker.step), "manifest.json").read_text())
    emit(None, event="committed", step=tracker.step, format=manifest["format"])


def stop_saver(job: str, world: int, timeout_s: float = 60.0) -> None:
    """Tell the run's detached saver the job ended, and wait (bounded) until it is gone."""
    client = SaverClient(socket_path("/dev/shm", job, "fsdp"), 0, world)
    pid = client.saver_pid
    client.close(shutdown_saver=True)
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise SystemExit(f"the saver {pid} did not exit within {timeout_s} s of its shutdown")
        time.sleep(0.05)
    emit(None, event="saver_stopped", pid=pid)


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
    p.add_argument("--fsdp", type=int, choices=(1, 2), default=2, help="FSDP1 or FSDP2 (fully_shard)")
    p.add_argument(
        "phases", nargs="+", help="train:WORLD, restore:WORLD, corrupt:STEP, ... (see the docstring), in order"
    )
    a = p.parse_args()
    for n, phase in enumerate(a.phases):
        mode, arg = phase.split(":")
        if mode == "corrupt":
            corrupt(a.storage, int(arg))
            continue
        if mode == "corruptrank":
            corrupt(a.storage, int(arg), "rank_*.safetensors")
            continue
        if mode == "awaitcommit":
            await_commit(a.storage, int(arg))
            continue
        if mode == "stopsaver":
            stop_saver(a.job, int(arg))
            continue
        world = int(arg)
        run_ranks(
            run_rank,
            (mode,),
            world,
            tmp=Path(a.tmp),
            n=n,
            timeout_s=a.timeout_s,
            expect_code=-signal.SIGKILL if mode == "traindie" else 0,
            job=a.job,
            storage=a.storage,
            fsdp=a.fsdp,
        )


def run_ranks(
    target: Callable[..., None],
    args: tuple[Any, ...],
    world: int,
    *,
    tmp: Path,
    n: int,
    timeout_s: float,
    expect_code: int = 0,
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
    if codes != [expect_code] * world:
        raise SystemExit(f"phase {n} ({args}, world {world}) failed: exit codes {codes}")


if __name__ == "__main__":
    main()
