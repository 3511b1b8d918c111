"""Child process for test_torch_data: a DataLoader(num_workers=2, forkserver) over ShardIterableDataset.

Runs an interrupted pass and a resumed one and prints the trained indices as JSON. It runs in its
own process so the forkserver and its resource tracker end with it.

    python _iterable_trainer.py ADDRESS DATASET        (the token comes from DLROVER_JOB_TOKEN)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

from torch.utils.data import DataLoader

from dlrover.common import RetryPolicy
from dlrover.shard.client import ShardClientConfig
from dlrover.shard.torch_data import ShardIterableDataset

CFG = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60))


def main() -> None:
    address, dataset = sys.argv[1], sys.argv[2]
    # Loader workers fork from a server process that has imported torch and this package but
    # never opened a gRPC channel, so they start fast and gRPC never crosses a fork with state.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "dlrover.shard.torch_data"])
    token = os.environ["DLROVER_JOB_TOKEN"]
    trained: list[int] = []
    first = ShardIterableDataset(address, token, dataset, "a", config=CFG)
    it = iter(DataLoader(first, batch_size=4, num_workers=2, multiprocessing_context=ctx))
    for _ in range(9):
        samples, cursors = next(it)
        trained.extend(samples.tolist())
        first.commit(cursors)
    state = first.state_dict()
    del it  # interrupted: loaded but untrained batches are dropped
    first.close()
    second = ShardIterableDataset(address, token, dataset, "b", config=CFG)
    second.load_state_dict(state)
    loader = DataLoader(second, batch_size=4, num_workers=2, multiprocessing_context=ctx, persistent_workers=True)
    passes = 0
    while not second.finished() and passes < 50:
        passes += 1
        for samples, cursors in loader:
            trained.extend(samples.tolist())
            second.commit(cursors)
    del loader
    second.close()
    print(json.dumps({"trained": trained, "passes": passes}))


if __name__ == "__main__":
    main()
