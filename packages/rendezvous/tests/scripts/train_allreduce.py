"""A worker started by torchrun (run by test_torchrun.py): a gloo all-reduce over env://.

argv: RESULT_DIR [FAIL_MARKER]. When FAIL_MARKER is given and does not exist yet, the group rank 0
worker creates it and exits with code 3 before joining the group, so its agent restarts it once.
Each worker writes RESULT_DIR/rank<RANK>.txt holding the sum and the restart count.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    result_dir = Path(sys.argv[1])
    marker = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    rank = int(os.environ["RANK"])
    if marker is not None and rank == 0 and not marker.exists():
        marker.write_text("failed once\n")
        sys.exit(3)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    (result_dir / f"rank{rank}.txt").write_text(f"{t.item():.0f} {dist.get_world_size()} {restarts}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
