"""Child process for test_group_sampler: one DDP-style trainer of a group (two by default; gloo, or
NCCL with `--backend nccl`, one GPU a rank) whose ShardSampler exchanges acknowledgements in a
collective and syncs with the service every `sync_every` steps.

Each step it takes a batch, "trains" it (appends the indices to `<out>/trained-r<R>-a<ATTEMPT>.jsonl`),
commits it and saves `state_dict()` to `<out>/state-r<R>-s<STEP>.json` (what a flash checkpoint
would hold). With `--die-after N` it kills itself (SIGKILL, no clean-up) after saving step N. With
`--resume-from STEP FILE` it loads that state (rank 0 restores the service from it) before training.

    python _group_trainer.py ADDRESS RANK OUT SYNC_EVERY ATTEMPT [--world W] [--batches-per-shard B]
        [--backend gloo|nccl] [--die-after N] [--resume-from STEP FILE] [--dataset NAME]
        [--pause-rank R --pause-s S] [--reload-at N] [--slow-lease-ahead-rank R]

`--pause-rank` makes that rank sleep `--pause-s` before it takes each batch (the pace of its steps,
not of the others'). `--reload-at N` has every rank load the state it saved at step N in the same
process (rank 0 restores the service from it) and go on; `--slow-lease-ahead-rank` delays that rank's
background leases by half a second (a slow network), so one is still out when the others reload.

The group meets through a file store in OUT (no port to race for).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from itertools import islice
from pathlib import Path

import torch
import torch.distributed as dist

from dlrover.common import RetryPolicy
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.torch_data import ShardSampler

BATCH = 4
CFG = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=0)


def spec(num_samples: int, batches_per_shard: int, name: str = "group") -> DatasetSpec:
    return DatasetSpec(
        name=name,
        source=IndexSource(num_samples),
        batch_size=BATCH,
        batches_per_shard=batches_per_shard,
        shuffle=True,
        shuffle_samples=True,
        seed=5,
        delivery=DeliveryMode.EXACTLY_ONCE,
        lease_timeout_s=300.0,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("rank", type=int)
    p.add_argument("out")
    p.add_argument("sync_every", type=int)
    p.add_argument("attempt", type=int)
    p.add_argument("--samples", type=int, default=160)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batches-per-shard", type=int, default=1)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--resume-from", nargs=2, default=None)
    p.add_argument("--dataset", default="group")
    p.add_argument("--pause-rank", type=int, default=-1)
    p.add_argument("--pause-s", type=float, default=0.0)
    p.add_argument("--reload-at", type=int, default=0)
    p.add_argument("--slow-lease-ahead-rank", type=int, default=-1)
    args = p.parse_args()
    out = Path(args.out)
    store = out / f"store-a{args.attempt}"
    device = torch.device("cpu")
    if args.backend == "nccl":  # one GPU per rank, as NCCL requires
        device = torch.device("cuda", args.rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"file://{store}", rank=args.rank, world_size=args.world)
    token = os.environ["DLROVER_JOB_TOKEN"]
    client = ShardClient(args.address, token, args.dataset, f"rank-{args.rank}", config=CFG)
    client.register(spec(args.samples, args.batches_per_shard, args.dataset))
    if args.rank == args.slow_lease_ahead_rank:
        fetch = client._fetch_shards

        def slow_fetch(count: int) -> object:
            if threading.current_thread().name.startswith("shard-lease-ahead"):
                time.sleep(0.5)
            return fetch(count)

        client._fetch_shards = slow_fetch  # type: ignore[method-assign,assignment]
    sampler = ShardSampler(client, process_group=dist.group.WORLD, sync_every=args.sync_every)
    step = 0
    if args.resume_from is not None:
        step = int(args.resume_from[0])
        state = json.loads(Path(args.resume_from[1]).read_text())
        sampler.load_state_dict(state, restore=args.rank == 0)
        dist.barrier()  # restored before anybody leases
    trained = (out / f"trained-r{args.rank}-a{args.attempt}.jsonl").open("a")
    batches = iter(sampler)
    while True:
        if args.rank == args.pause_rank:
            time.sleep(args.pause_s)
        indices = list(islice(batches, BATCH))
        counts = torch.tensor([len(indices)], device=device)
        dist.all_reduce(counts, op=dist.ReduceOp.MIN)
        if int(counts[0]) == 0:
            break
        step += 1
        trained.write(json.dumps({"step": step, "indices": indices}) + "\n")
        trained.flush()
        sampler.commit(len(indices))
        state = sampler.state_dict()
        path = out / f"state-r{args.rank}-s{step}.json"
        path.with_suffix(".tmp").write_text(json.dumps(state))
        path.with_suffix(".tmp").replace(path)
        if step == args.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.reload_at:
            # No barrier: load_state_dict returns on no trainer before the restore is done.
            sampler.load_state_dict(state, restore=args.rank == 0)
            batches = iter(sampler)
    trained.close()
    dist.barrier()
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
