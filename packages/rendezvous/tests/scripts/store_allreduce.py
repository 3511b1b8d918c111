"""One process of a gloo group initialised through `ServiceStore` (run by test_torch_store.py).

argv: ADDRESS RANK WORLD_SIZE; the job token comes from DLROVER_JOB_TOKEN. Prints the all-reduced sum.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from dlrover.common import load_token
from dlrover.rendezvous import RendezvousClient
from dlrover.rendezvous.torch_store import ServiceStore


def main() -> None:
    address, rank, world_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with RendezvousClient(address, load_token()) as client:
        store = ServiceStore(client, timeout_s=60).with_prefix("gloo-test")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        print(f"SUM {t.item():.0f}", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
