"""The worker bootstrap: a worker is the OOM killer's choice before its agent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover.common.orphan_guard import WORKER_OOM_SCORE_ADJ, guarded_argv

pytestmark = pytest.mark.timeout(120)


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="no /proc/self/oom_score_adj here")
def test_a_worker_started_through_the_guard_has_a_raised_oom_score() -> None:
    show = "print(open('/proc/self/oom_score_adj').read().strip())"
    argv = guarded_argv(os.getpid(), [sys.executable, "-c", show])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=100, check=True).stdout
    assert int(out) == WORKER_OOM_SCORE_ADJ
    mine = int(Path("/proc/self/oom_score_adj").read_text())
    assert mine < WORKER_OOM_SCORE_ADJ  # the caller (the agent) keeps its own
