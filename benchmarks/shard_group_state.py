"""What a group sampler's saved data position costs a checkpoint taken every step, by group size.

A `ShardSampler` with a process group returns a state that carries the group's acknowledgements since
the sync before the last: with one-batch shards, up to ``2 x sync_every x trainers`` of them. The
trainer saves it with the model every step, so the checkpoint walks and encodes it every step.
Measured per save, on one thread (``time.thread_time``), the way a flash checkpoint handles it: the
state built (`make_state`), split into tree and tensors (`dlrover.flashckpt.tree.flatten_state`) and
the tree encoded as JSON (as the manifest is). The peer, measured in the same run: the same
acknowledgements as a list of ``[shard_id, consumed, done]`` (data state version 2).

    python benchmarks/shard_group_state.py            # groups of 8, 128 and 1,024 trainers
    python benchmarks/shard_group_state.py --quick    # 8 and 128
"""

from __future__ import annotations

import argparse
import json
import random
import time

from benchkit import fmt

from dlrover.flashckpt.tree import flatten_state
from dlrover.shard._data_state import make_state

SYNC_EVERY = 8  # ShardSampler's default


def per_save_ms(acknowledged: list[tuple[int, int, bool]], *, packed: bool, repeats: int) -> float:
    document = "x" * 4096  # the position read at the last sync (its size does not depend on the group)
    start = time.thread_time()
    for _ in range(repeats):
        state = make_state("dlrover.shard.torch", 3 if packed else 2, "ds", document, acknowledged, packed=packed)
        flat = flatten_state({"step": 1, "data": state})
        json.dumps(flat.tree)
    return (time.thread_time() - start) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="groups of 8 and 128 trainers only")
    parser.add_argument("--repeats", type=int, default=10, help="saves timed per cell")
    args = parser.parse_args()
    groups = (8, 128) if args.quick else (8, 128, 1024)
    rng = random.Random(0)
    print("| trainers | acknowledgements | list (v2) ms/save | packed (v3) ms/save | packed / list |")
    print("|---|---|---|---|---|")
    for trainers in groups:
        count = 2 * SYNC_EVERY * trainers
        acknowledged = [(rng.randrange(10**7), rng.randrange(64), rng.random() < 0.9) for _ in range(count)]
        as_list = per_save_ms(acknowledged, packed=False, repeats=args.repeats)
        packed = per_save_ms(acknowledged, packed=True, repeats=args.repeats)
        print(f"| {trainers:,} | {count:,} | {fmt(as_list)} | {fmt(packed)} | {fmt(packed / as_list)} |")


if __name__ == "__main__":
    main()
