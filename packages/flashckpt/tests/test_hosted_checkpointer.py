"""FlashCheckpointer(saver="auto") under an agent's SaverHost (DLROVER_FLASHCKPT_HOST set): no
detached saver is spawned, persist and reconnect go through the host, an unreachable host is a
clear error, and a killed training process's newest snapshot is persisted by the host and loaded
from memory by its successor."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from flashckpt_testlib import our_files

from dlrover.common import processes_mentioning
from dlrover.flashckpt import FlashCheckpointer, StagerConfig
from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.errors import SaverUnavailableError
from dlrover.flashckpt.host import HOST_SOCKET_ENV_VAR, SaverHost, SaverHostConfig, host_socket_path
from dlrover.flashckpt.storage import PosixStorage
from dlrover.flashckpt.storage_loader import StorageReader

WAIT_S = 60.0
TRAINER = str(Path(__file__).with_name("flashckpt_trainer.py"))


def _wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.fixture
def host_shm(tmp_path: Path) -> Path:
    d = tmp_path / "host"
    d.mkdir()
    return d


@pytest.fixture
def host(host_shm: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SaverHost]:
    h = SaverHost(SaverHostConfig(str(host_socket_path(host_shm)), stop_timeout_s=WAIT_S))
    h.start()
    monkeypatch.setenv(HOST_SOCKET_ENV_VAR, str(h.socket_path))
    yield h
    h.stop(remove_memory=True)
    assert list(host_shm.iterdir()) == []


def _state(step: int) -> dict[str, object]:
    return {"w": torch.full((64,), float(step)), "step": step}


def test_persist_and_reconnect_go_through_the_host(host: SaverHost, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    cfg = StagerConfig(job_id="hosted", run_id="r", shm_dir=str(shm))
    ckpt = FlashCheckpointer(cfg, str(tmp_path / "ckpt"))
    try:
        assert ckpt.client is not None
        assert ckpt.client.saver_pid == os.getpid()  # the host's process, not a detached saver
        assert not ckpt.stager.owns_segments  # the hosted saver owns the memory
        assert set(host.runs()) == {("hosted", "r")}
        assert not list(shm.glob("*.spawnlock"))  # the detached path was never taken
        assert not processes_mentioning("dlrover.flashckpt.saver_main\0--job\0hosted")
        ckpt.save(1, _state(1), persist=True)
        outcome = ckpt.wait_persisted(1, WAIT_S)
        assert (outcome.ok, outcome.committed) == (True, True), outcome

        # Another request replaces the run's saver: this rank's connection drops, and the next
        # persist reconnects through the host.
        old = host.saver("hosted", "r")
        request = host.runs()[("hosted", "r")]
        host.ensure(attrs.evolve(request, coordinator=False))
        _wait_until(lambda: ckpt.client is not None and ckpt.client.closed)
        ckpt.save(2, _state(2), persist=True)
        assert any(e.kind == "saver_restarted" and "agent" in e.reason for e in ckpt.events.snapshot())
        assert ckpt.wait_persisted(2, WAIT_S).committed
        assert host.saver("hosted", "r") is not old
        assert Committer(PosixStorage(tmp_path / "ckpt")).tracker().step == 2  # type: ignore[union-attr]
    finally:
        ckpt.close(job_end=True)
    # The job ended: the host stops the run's saver and removes its memory.
    _wait_until(lambda: host.runs() == {})
    assert list(shm.iterdir()) == []


def test_after_a_resize_the_run_commits_with_the_new_world_size(host: SaverHost, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    storage = PosixStorage(tmp_path / "ckpt")
    two = FlashCheckpointer(
        StagerConfig(job_id="resize", run_id="r", world_size=2, shm_dir=str(shm)),
        str(tmp_path / "ckpt"),
        agree=lambda steps: max(steps, default=None),
    )
    two.save(1, _state(1), persist=True)
    first = two.wait_persisted(1, WAIT_S)
    assert (first.ok, first.committed) == (True, False)  # rank 1 (gone now) never persists
    two.close()
    # The job shrank to one rank: the saver is replaced and commits with one rank.
    one = FlashCheckpointer(StagerConfig(job_id="resize", run_id="r", shm_dir=str(shm)), str(tmp_path / "ckpt"))
    try:
        assert host.runs()[("resize", "r")].world_size == 1
        one.save(2, _state(2), persist=True)
        assert one.wait_persisted(2, WAIT_S).committed
        assert Committer(storage).tracker().step == 2  # type: ignore[union-attr]
    finally:
        one.close(job_end=True)
    _wait_until(lambda: list(shm.iterdir()) == [])


def test_a_plain_close_keeps_the_memory_for_the_next_process(host: SaverHost, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    cfg = StagerConfig(job_id="hosted", run_id="r", shm_dir=str(shm))
    first = FlashCheckpointer(cfg, str(tmp_path / "ckpt"))
    first.save(3, _state(3))
    first.close()
    second = FlashCheckpointer(cfg, str(tmp_path / "ckpt"))
    try:
        target = _state(0)
        loaded = second.load(target=target)
        assert (loaded.source, loaded.step) == ("memory", 3)
        assert torch.equal(target["w"], torch.full((64,), 3.0))  # type: ignore[arg-type]
    finally:
        second.close(job_end=True)
    _wait_until(lambda: list(shm.iterdir()) == [])


def test_an_unreachable_host_is_an_error_not_a_detached_saver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    missing = tmp_path / "gone.sock"
    monkeypatch.setenv(HOST_SOCKET_ENV_VAR, str(missing))
    cfg = StagerConfig(job_id="nohost", run_id="r", shm_dir=str(shm))
    with pytest.raises(SaverUnavailableError, match=str(missing)):
        FlashCheckpointer(cfg, str(tmp_path / "ckpt"))
    assert list(shm.iterdir()) == []  # no spawn lock, no segment, no saver socket
    assert not processes_mentioning("dlrover.flashckpt.saver_main\0--job\0nohost")


# -- real processes ---------------------------------------------------------------------------------


class Trainer:
    """flashckpt_trainer.py as a child process whose JSON lines are read on a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            [sys.executable, TRAINER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def wait_for(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        seen = []
        while time.monotonic() < deadline:
            try:
                msg = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.p.poll() is not None and self.lines.empty():
                    break
                continue
            seen.append(msg)
            if msg.get("event") == event:
                return msg
        err = self.p.stderr.read() if self.p.poll() is not None and self.p.stderr else ""
        raise AssertionError(f"no {event} from the trainer; saw {seen}; stderr: {err[-3000:]}")

    def end(self, kill: bool) -> int:
        if kill:
            self.p.send_signal(signal.SIGKILL)
        rc = self.p.wait(WAIT_S)
        for f in (self.p.stdout, self.p.stderr):
            if f is not None:
                f.close()
        return rc


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_host_persists_a_killed_process_snapshot_and_its_successor_loads_it_from_memory(
    host: SaverHost, job_id: str, tmp_path: Path
) -> None:
    storage_dir = str(tmp_path / "ckpt")
    env = {HOST_SOCKET_ENV_VAR: str(host.socket_path)}
    args = ["--job", job_id, "--storage", storage_dir, "--numel", "4096"]
    train = Trainer(["train", *args, "--steps", "5", "--fault", "after_save", "--fault-step", "3"], env)
    assert train.wait_for("started")["saver_pid"] == os.getpid()
    train.wait_for("fault_point")
    assert train.end(kill=True) == -signal.SIGKILL
    # Nobody asked to persist step 3: the host's saver does it for the process that died.
    storage = PosixStorage(storage_dir)
    _wait_until(lambda: (t := Committer(storage).tracker()) is not None and t.step == 3)
    resume = Trainer(["resume", *args], env)
    loaded = resume.wait_for("loaded")
    resume.wait_for("closed")
    assert resume.end(kill=False) == 0
    assert loaded == {"event": "loaded", "step": 3, "source": "memory", "consistent": True, "verified": True}
    _wait_until(lambda: host.runs() == {})  # resume closed with job_end: the run is over
    assert our_files(job_id) == []
    assert not processes_mentioning(job_id)  # no detached saver was ever started
    assert StorageReader(storage).load(0, 1).step == 3
