"""One rank of a DeepSpeed ZeRO job on CPU (gloo) for test_deepspeed.py; needs deepspeed.

Trains 2 steps, stages the engine state in shared memory, trains step 3 and records the result;
then, as a restarted trainer would, builds a new engine from another seed, restores step 2 from
memory and trains step 3 again: parameters, optimizer partition and loss must equal the first
run's bit for bit. Prints JSON lines.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os

import deepspeed
import torch

from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.deepspeed_adapter import deepspeed_state, load_deepspeed_state
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.stager import Stager


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def build(seed: int, stage: int, world: int) -> object:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cfg = {
        "train_batch_size": 4 * world,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def train_step(engine: object, step: int, rank: int) -> float:
    torch.manual_seed(1000 + step * 10 + rank)
    loss = engine(torch.randn(4, 8)).square().mean()  # type: ignore[operator]
    engine.backward(loss)  # type: ignore[attr-defined]
    engine.step()  # type: ignore[attr-defined]
    return float(loss.detach())


def fingerprint(engine: object) -> str:
    """Bytes of every parameter and of this rank's fp32 partition."""
    tensors = list(engine.module.parameters())  # type: ignore[attr-defined]
    tensors += list(engine.optimizer.single_partition_of_fp32_groups)  # type: ignore[attr-defined]
    parts = [t.detach().contiguous().view(torch.uint8).numpy().tobytes().hex() for t in tensors]
    return "|".join(parts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--stall-dump-s", type=float, default=200.0, help="print every stack and exit after this")
    a = p.parse_args()
    # A rank stuck in a collective or a lock says where before the test gives up on it.
    faulthandler.dump_traceback_later(a.stall_dump_s, exit=True)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cfg = StagerConfig(job_id=a.job, run_id="ds", rank=rank, world_size=world, copy_threads=1)

    engine = build(0, a.stage, world)
    stager = Stager(cfg)
    for step in (1, 2):
        train_step(engine, step, rank)
    stager.save(2, deepspeed_state(engine))
    stager.flush()
    loss3 = train_step(engine, 3, rank)
    first = fingerprint(engine)

    engine = build(99, a.stage, world)
    differs_before = fingerprint(engine) != first
    loaded = MemoryReader(cfg).load()
    load_deepspeed_state(engine, loaded.state)
    steps_after_load = engine.global_steps  # type: ignore[attr-defined]
    loss3_again = train_step(engine, 3, rank)
    emit(
        rank=rank,
        source=loaded.source,
        step=loaded.step,
        verified=loaded.verified,
        global_steps=steps_after_load,
        differs_before=differs_before,
        same_loss=loss3 == loss3_again,
        same_state=fingerprint(engine) == first,
        optimizer_keys=sorted(loaded.state["optimizer"]),
    )
    # Non-owners first, then owners one by one: the last to close also removes the owner record.
    torch.distributed.barrier()
    if not stager.owns_segments:
        stager.close(remove=True)
    for r in range(world):
        torch.distributed.barrier()
        if r == rank and stager.owns_segments:
            stager.close(remove=True)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
