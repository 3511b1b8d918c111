"""A one-rank sharded checkpointer that SIGKILLs itself part way through persisting step 2.

Usage: flashckpt_sharded_kill.py JOB STORAGE POINT, POINT one of:
``mid_dcp`` (while DCP writes the data files), ``before_done`` (files written, no done marker),
``before_tracker`` (manifest written, tracker not moved). Step 1 is committed first.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch

from dlrover.flashckpt import dcp_site, sharded
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.storage.posix import PosixStorage


def state(value: float) -> dict[str, Any]:
    return {"model": {"w": torch.full((64, 64), value), "b": torch.full((3,), value)}, "step": int(value)}


def die(*_args: object, **_kwargs: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    job, storage, point = sys.argv[1:4]
    ckpt = sharded.ShardedCheckpointer(StagerConfig(job_id=job, run_id="kill", copy_threads=1), storage)
    ckpt.save(1, state(1.0))
    ckpt.stager.flush()
    assert ckpt.persist(1).commit
    ckpt.save(2, state(2.0))
    ckpt.stager.flush()
    if point == "mid_dcp":
        real_save = torch.save

        def save_then_die(obj: object, f: Any, *args: object, **kwargs: object) -> None:
            real_save(obj, f, *args, **kwargs)  # one item written, the rest not
            die()

        torch.save = save_then_die  # type: ignore[assignment]
    elif point == "before_done":
        dcp_site.checksum_file = die  # type: ignore[assignment]
    elif point == "before_tracker":
        real_write = PosixStorage.write_file

        def write_then_die(self: PosixStorage, path: str, chunks: Any) -> int:
            if path == "tracker.json":
                die()
            return real_write(self, path, chunks)

        PosixStorage.write_file = write_then_die  # type: ignore[method-assign]
    ckpt.persist(2)
    raise SystemExit("persist returned: the kill point was not reached")


if __name__ == "__main__":
    main()
