"""`torch_distributed_agree` over a real gloo group of two processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Each rank agrees on a few lists; the answers are printed as one JSON line.
_RANK = """
import json, sys
import torch.distributed as dist
from dlrover.flashckpt.dist import torch_distributed_agree
rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
agree = torch_distributed_agree(num_slots=2)
mine = {
    "short": [[5, 4], [5, 3]],
    "long_on_one_rank": [[9, 8, 7, 6, 3, 2], [3, 1]],
    "none_common": [[9, 8, 7], [6]],
    "empty_on_one_rank": [[4, 3], []],
}
answers = {name: agree(lists[rank]) for name, lists in mine.items()}
dist.destroy_process_group()
print(json.dumps(answers))
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_ranks_agree_on_the_newest_common_step_whatever_their_list_lengths(tmp_path: Path) -> None:
    init = f"file://{tmp_path / 'pg.init'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(rank), init], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for rank in range(2)
    ]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err[-3000:]
        answers.append(json.loads(out.strip().splitlines()[-1]))
    expected = {"short": 5, "long_on_one_rank": 3, "none_common": None, "empty_on_one_rank": None}
    assert answers == [expected, expected]
