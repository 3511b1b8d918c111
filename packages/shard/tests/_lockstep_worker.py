"""Child process for test_two_workers: a training worker driven in lockstep by the test.

Each `tick` line on stdin makes it train `per_tick` samples (fetching shards from ShardService as
it runs out), acknowledge its position (exactly-once), and answer one JSON line. A worker that is
"4x slower" simply trains a quarter as many samples per tick: speed is a count, not a time, so
the outcome does not depend on how busy the machine is.

    python _lockstep_worker.py ADDRESS DATASET WORKER PER_TICK   (token from DLROVER_JOB_TOKEN)
"""

from __future__ import annotations

import json
import os
import sys

from dlrover.common import RetryPolicy
from dlrover.shard import Shard
from dlrover.shard.client import ShardClient, ShardClientConfig

CFG = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=0)


def main() -> None:
    address, dataset, worker, per_tick = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = ShardClient(address, os.environ["DLROVER_JOB_TOKEN"], dataset, worker, config=CFG)
    shard: Shard | None = None
    todo: list[int] = []
    position = 0
    finished = False
    for line in sys.stdin:
        if line.strip() != "tick":
            break
        trained: list[int] = []
        fetched: list[list[int]] = []
        while len(trained) < per_tick and not finished:
            if shard is None:
                res = client.fetch(1)
                if not res.shards:
                    finished = res.finished
                    break  # nothing to do this tick (the rest is leased to others)
                shard = res.shards[0]
                fetched.append([shard.shard_id, shard.consumed])
                todo = shard.remaining_samples()
                position = shard.consumed
            take = todo[: per_tick - len(trained)]
            todo = todo[len(take) :]
            trained.extend(take)  # "training" these samples
            position += len(take)
            if todo:
                client.report_progress(shard.shard_id, position)  # acknowledge what was trained
            else:
                client.report_done(shard.shard_id)
                shard = None
        current = None if shard is None else [shard.shard_id, position]
        print(json.dumps({"trained": trained, "fetched": fetched, "current": current, "finished": finished}))
        sys.stdout.flush()
    client.close()


if __name__ == "__main__":
    main()
