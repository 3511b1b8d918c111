"""Kill tests with real processes: a training process SIGKILLed mid-copy, mid-persist and between
saves; a saver killed in the middle of a commit. Every time the restarted process loads a complete,
consistent state, and no shared memory of the job is left at the end."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flashckpt_testlib import our_files

from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.segment import cleanup_stale, process_start_ticks
from dlrover.flashckpt.stager import Stager
from dlrover.flashckpt.storage import PosixStorage
from dlrover.flashckpt.storage_loader import StorageReader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TRAINER = str(Path(__file__).with_name("flashckpt_trainer.py"))
WAIT_S = 60.0


class Proc:
    """A trainer process whose JSON lines are read on a thread."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.p = subprocess.Popen(
            [sys.executable, TRAINER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def wait_for(self, event: str, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                msg = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.p.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(msg)
            if msg.get("event") == event and all(msg.get(k) == v for k, v in match.items()):
                return msg
        err = self.p.stderr.read() if self.p.poll() is not None and self.p.stderr else ""
        raise AssertionError(f"no {event} {match} from trainer; saw {self.seen}; stderr: {err[-3000:]}")

    def kill(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(WAIT_S)
        self._close()

    def finish(self) -> int:
        rc = self.p.wait(WAIT_S)
        self._close()
        return rc

    def _close(self) -> None:
        for f in (self.p.stdout, self.p.stderr):
            if f is not None:
                f.close()


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while process_start_ticks(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_start_ticks(pid) is None, f"saver {pid} did not exit"


def _wait_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


def _wait_tracker(storage: PosixStorage, step: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        t = Committer(storage).tracker()
        if t is not None and t.step == step:
            return
        time.sleep(0.05)
    raise AssertionError(f"tracker never reached step {step}: {Committer(storage).tracker()}")


@pytest.fixture
def storage_dir(tmp_path: Path) -> str:
    return str(tmp_path / "ckpt")


def _resume(job: str, storage_dir: str) -> dict[str, Any]:
    proc = Proc(["resume", "--job", job, "--storage", storage_dir])
    started = proc.wait_for("started")
    loaded = proc.wait_for("loaded")
    proc.wait_for("closed")
    assert proc.finish() == 0
    _wait_gone(started["saver_pid"])  # job end: the saver removes the memory and exits
    return loaded


@pytest.mark.parametrize(
    ("fault", "expected_step"),
    [
        ("mid_copy", 2),  # killed while copying step 3: step 2 is the newest complete snapshot
        ("after_save", 3),  # killed between saves: step 3 is complete in memory
        ("mid_persist", 3),  # killed while the saver is half way through persisting step 3
    ],
)
def test_training_process_killed_restart_loads_consistent_state(
    job_id: str, storage_dir: str, fault: str, expected_step: int
) -> None:
    # mid_persist: the saver pauses after writing rank 0's tensor file of step 3, before its manifest.
    env = {"DLROVER_FLASHCKPT_FAULT_PAUSE_BEFORE": "3/rank_00000.json:1"} if fault == "mid_persist" else {}
    proc = Proc(
        ["train", "--job", job_id, "--storage", storage_dir, "--steps", "5", "--fault", fault, "--fault-step", "3"],
        env=env,
    )
    saver_pid = proc.wait_for("started")["saver_pid"]
    proc.wait_for("in_copy" if fault == "mid_copy" else "fault_point", step=3)
    if fault == "mid_persist":
        _wait_file(Path(storage_dir) / ".fault-paused")
        assert Committer(PosixStorage(storage_dir)).tracker() is None
    proc.kill()
    if fault == "mid_persist":
        (Path(storage_dir) / ".fault-resume").touch()
    # The saver outlives the training process and persists the newest complete snapshot.
    storage = PosixStorage(storage_dir)
    _wait_tracker(storage, expected_step)
    loaded = _resume(job_id, storage_dir)
    assert loaded == {
        "event": "loaded",
        "step": expected_step,
        "source": "memory",
        "consistent": True,
        "verified": True,
    }
    _wait_gone(saver_pid)
    assert our_files(job_id) == []
    from_disk = StorageReader(storage).load(0, 1)
    assert from_disk.step == expected_step
    assert bool((from_disk.state["w"] == float(expected_step)).all())


def test_saver_killed_during_commit_leaves_previous_checkpoint(job_id: str, storage_dir: str, tmp_path: Path) -> None:
    # The detached saver exits abruptly before its second tracker write (step 4's commit). Its
    # memory lives in a directory of this test's own: a stager of any other process sharing
    # /dev/shm would remove the dead run's files as stale before this test looks for them.
    shm = tmp_path / "shm"
    shm.mkdir()
    env = {"DLROVER_FLASHCKPT_FAULT_EXIT_BEFORE": "tracker.json:2"}
    argv = ["train", "--job", job_id, "--storage", storage_dir, "--steps", "4", "--persist-every", "2"]
    proc = Proc([*argv, "--shm-dir", str(shm)], env=env)
    saver_pid = proc.wait_for("started")["saver_pid"]
    assert proc.wait_for("persisted", step=2)["committed"] is True
    _wait_gone(saver_pid)  # it died writing step 4's commit
    proc.kill()
    storage = PosixStorage(storage_dir)
    assert Committer(storage).tracker() is not None
    assert Committer(storage).tracker().step == 2  # type: ignore[union-attr]
    loaded = StorageReader(storage).load(0, 1)
    assert loaded.step == 2
    assert bool((loaded.state["w"] == 2.0).all())
    # The dead saver's memory is stale; the next run of the job finds and removes it at start.
    assert list(shm.iterdir()) != []
    removed = cleanup_stale(shm)
    assert any(job_id in p.name for p in removed)
    stager = Stager(StagerConfig(job_id=job_id, run_id="run2", shm_dir=str(shm)))
    stager.close()
    assert list(shm.iterdir()) == []
