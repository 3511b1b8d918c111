"""One rank of a 2-rank DDP job for test_ddp.py (gloo on CPU, file rendezvous).

Trains 3 steps with a memory snapshot every step (step 2 persisted), closes its checkpointer
without ending the job, then, as a restarted trainer would, builds a fresh model (another seed)
and a new checkpointer and loads in place; the ranks agree on the newest step both hold. (Real
process restarts are covered by test_kill.py; here one process plays both parts to stay fast.)
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlrover.flashckpt import FlashCheckpointer, StagerConfig, torch_distributed_agree


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def build(rank: int, seed: int) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--storage", required=True)
    a = p.parse_args()
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=2)
    cfg = StagerConfig(job_id=a.job, run_id="ddp", rank=a.rank, world_size=2)

    model, opt = build(a.rank, 0)
    ckpt = FlashCheckpointer(cfg, a.storage, agree=torch_distributed_agree(), idle_exit_s=30)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}
    ckpt.prepare(state)
    for step in (1, 2, 3):
        torch.manual_seed(step * 10 + a.rank)
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        state["step"] = step
        ckpt.save(step, state, persist=step == 2)
        if step == 2:
            outcome = ckpt.wait_persisted(2, 60)
            emit(event="persisted", ok=outcome.ok, reason=outcome.reason)
    ckpt.stager.flush()
    emit(event="trained", wsum=float(model.module.weight.sum()), rank=a.rank)
    dist.barrier()
    ckpt.close()

    model, opt = build(a.rank, 99)
    ckpt = FlashCheckpointer(cfg, a.storage, agree=torch_distributed_agree(), idle_exit_s=30)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}
    weight = model.module.weight
    ptr = weight.data_ptr()
    loaded = ckpt.load(target=state)
    emit(
        event="loaded",
        rank=a.rank,
        step=loaded.step,
        source=loaded.source,
        wsum=float(weight.sum()),
        in_place=weight.data_ptr() == ptr,
        saver_pid=ckpt.client.saver_pid if ckpt.client else -1,
    )
    dist.barrier()
    ckpt.close(job_end=a.rank == 0)
    del model, opt  # the DDP model first: freed after the group, it can hang with a gloo thread
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
