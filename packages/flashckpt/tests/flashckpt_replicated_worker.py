"""One rank loading a replicated state for test_replicated.py (gloo on CPU, file rendezvous).

Each rank gets a shared-memory directory of its own, as a rank on its own node would, so what one
rank staged is invisible to the others. It loads with ``FlashCheckpointer(replicated=True)`` (or a
`ReplicatedLoader` with ``--chunk-bytes`` of staging) into a zeroed state of the `replica_state`
structure, or as ``--target`` says: ``fresh``, into nothing; ``mismatch``, on the last rank, into a
state whose momentum has another shape; ``noncontiguous``, a momentum that is a transposed view;
``unwritable``, on the last rank, an expanded tensor, which refuses the copy. It prints one JSON
line: where the state came from and whether it equals ``replica_state(--expect-seed,
--expect-step)`` bit for bit, or the error it raised.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.distributed as dist
from flashckpt_testlib import replica_state, same_bits, tensor_places, zeros_like_state

from dlrover.flashckpt import FlashCheckpointer, ReplicatedLoader, StagerConfig
from dlrover.flashckpt.collectives import RankGroup


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--shm", required=True)
    p.add_argument("--storage", required=True)
    p.add_argument(
        "--target", choices=["in-place", "fresh", "mismatch", "noncontiguous", "unwritable"], default="in-place"
    )
    p.add_argument("--chunk-bytes", type=int, default=0, help="the transfer's staging size (0: the default)")
    p.add_argument("--expect-seed", type=int, default=0)
    p.add_argument("--expect-step", type=int, default=0)
    a = p.parse_args()
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world)
    cfg = StagerConfig(job_id=a.job, run_id="r", rank=a.rank, world_size=a.world, shm_dir=a.shm)
    ckpt = FlashCheckpointer(cfg, a.storage, saver="none", replicated=True)
    target = None if a.target == "fresh" else zeros_like_state(replica_state(0, 0), memo={})
    if target is not None:
        target["counts"] = np.zeros(5, dtype=np.int64)
        last = a.rank == a.world - 1
        if a.target == "mismatch" and last:
            target["optim"]["state"][0]["momentum"] = torch.zeros(47, 16)
        if a.target == "noncontiguous":
            target["optim"]["state"][0]["momentum"] = torch.zeros(16, 48).t()
        if a.target == "unwritable" and last:
            # Fits the snapshot, but refuses the copy: its rows are one row's memory.
            target["optim"]["state"][0]["momentum"] = torch.zeros(1, 16).expand(48, 16)
    before = [(t, t.data_ptr()) for _, t in tensor_places(target)] if target is not None else []
    try:
        if a.chunk_bytes:
            loader = ReplicatedLoader(cfg, ckpt.storage, RankGroup(None), chunk_bytes=a.chunk_bytes)
            loaded = loader.load(target)
        else:
            loaded = ckpt.load(target=target)
    except Exception as e:  # reported: every rank must fail, none hang
        print(json.dumps({"rank": a.rank, "error": type(e).__name__, "reason": str(e)}), flush=True)
    else:
        expected = replica_state(a.expect_seed, a.expect_step)
        print(
            json.dumps(
                {
                    "rank": a.rank,
                    "step": loaded.step,
                    "source": loaded.source,
                    "verified": loaded.verified,
                    "detail": loaded.detail,
                    "equal": same_bits(expected, loaded.state),
                    "in_place": all(t.data_ptr() == ptr for t, ptr in before),
                    "tied": loaded.state["model"]["weight"] is loaded.state["model"]["head"],
                }
            ),
            flush=True,
        )
    ckpt.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
