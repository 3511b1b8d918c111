"""A real 2-rank DDP job (gloo, CPU): snapshots every step, a restarted checkpointer agrees on the
newest step both ranks hold and restores it in place; the persisted step is committed for both."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flashckpt_testlib import our_files

from dlrover.flashckpt import Committer, PosixStorage, Tracker, common_newest
from dlrover.flashckpt.segment import process_start_ticks

WORKER = str(Path(__file__).with_name("flashckpt_ddp_worker.py"))


def test_common_newest() -> None:
    assert common_newest([[3, 2], [2, 3]]) == 3
    assert common_newest([[3, 2], [2, 1]]) == 2
    assert common_newest([[3], [2]]) is None
    assert common_newest([]) is None


def _run_ranks(job: str, tmp: Path) -> list[dict[str, object]]:
    init = f"file://{tmp / 'pg.init'}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                WORKER,
                "--rank",
                str(r),
                "--init",
                init,
                "--job",
                job,
                "--storage",
                str(tmp / "ck"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    events: list[dict[str, object]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err[-3000:]
        events += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return events


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_ddp_restart_restores_agreed_step_in_place(job_id: str, tmp_path: Path) -> None:
    events = _run_ranks(job_id, tmp_path)
    trained = [e for e in events if e["event"] in ("persisted", "trained")]
    loaded = [e for e in events if e["event"] == "loaded"]
    assert len(loaded) == 2
    assert all(e["ok"] for e in trained if e["event"] == "persisted")
    assert Committer(PosixStorage(tmp_path / "ck")).tracker() == Tracker(2, 2)
    sums = {e["rank"]: e["wsum"] for e in trained if e["event"] == "trained"}
    assert sums[0] == sums[1]  # DDP keeps replicas identical
    for e in loaded:
        assert (e["step"], e["source"], e["in_place"]) == (3, "memory", True)
        assert e["wsum"] == sums[0]
    saver_pid = int(loaded[0]["saver_pid"])  # type: ignore[call-overload]
    deadline = time.monotonic() + 60
    while process_start_ticks(saver_pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_start_ticks(saver_pid) is None
    assert our_files(job_id) == []
