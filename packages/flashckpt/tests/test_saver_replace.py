"""A replaced saver stops committing at once and never delays the host's answer; a replacement
that cannot start leaves the old saver serving; persists at stop ignore the rate cap."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from dlrover.common import ManualClock
from dlrover.flashckpt import host as host_mod
from dlrover.flashckpt.ckpt_format import safetensors_path
from dlrover.flashckpt.client import SaverClient
from dlrover.flashckpt.commit import Committer, Tracker
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.host import EnsureAction, SaverHost, SaverHostConfig, SaverRequest, host_socket_path
from dlrover.flashckpt.saver import Saver, SaverConfig
from dlrover.flashckpt.stager import Stager
from dlrover.flashckpt.storage import Chunk, InMemoryStorage

WAIT_S = 60.0


class _GatedStorage(InMemoryStorage):
    """Every write waits for `gate`: a persist on storage as slow as a test needs."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        return super().write_file(path, chunks)


def _host(shm: Path, storage: InMemoryStorage) -> SaverHost:
    config = SaverHostConfig(str(host_socket_path(shm)), stop_timeout_s=WAIT_S, drain_timeout_s=5.0)
    return SaverHost(config, storage_factory=lambda _dir: storage)


def _request(shm: Path, tmp_path: Path, world_size: int) -> SaverRequest:
    return SaverRequest("job", "run", world_size, str(tmp_path / "ckpt"), shm_dir=str(shm))


@pytest.fixture
def stager(shm: Path) -> Iterator[Stager]:
    s = Stager(StagerConfig(job_id="job", run_id="run", shm_dir=str(shm), seal_in_background=False))
    assert s.save(1, {"w": torch.ones(64)}).saved
    yield s
    s.close()


def test_resize_is_answered_while_the_old_saver_persists_and_the_old_one_never_commits(
    shm: Path, tmp_path: Path, stager: Stager
) -> None:
    storage = _GatedStorage()
    host = _host(shm, storage)
    host.start()
    try:
        decision, old = host.ensure(_request(shm, tmp_path, 1))
        assert old is not None
        old.request_persist(0, 1)
        assert storage.entered.wait(WAIT_S)  # the old saver is stuck writing step 1
        answered: list[Any] = []
        t = threading.Thread(target=lambda: answered.append(host.ensure(_request(shm, tmp_path, 2))))
        t.start()
        t.join(WAIT_S / 2)  # before the fix: blocked until the gate opens (stop_timeout_s is longer)
        assert answered, "the host did not answer while the replaced saver was persisting"
        decision, new = answered[0]
        assert decision.action is EnsureAction.REPLACE
        assert new is not None
        assert new is not old
        storage.gate.set()
        assert old.wait_idle(WAIT_S)
        assert storage.exists(safetensors_path(1, 0))  # the old saver finished its rank file...
        assert Committer(storage).tracker() is None  # ...but did not commit after replacement
        assert "committed" not in old.events.kinds()
        deadline = threading.Event()
        for _ in range(int(WAIT_S / 0.01)):
            if "saver_retired" in host.events.kinds() or deadline.wait(0.01):
                break
        assert "saver_retired" in host.events.kinds()
        SaverClient(new.socket_path, 0, 2).close()  # stopping the old saver left the new one's socket
    finally:
        storage.gate.set()
        host.stop(remove_memory=True)


def test_a_replacement_that_cannot_start_leaves_the_old_saver_serving(
    shm: Path, tmp_path: Path, stager: Stager, monkeypatch: pytest.MonkeyPatch
) -> None:
    class _NoStart(Saver):
        def start(self) -> None:
            raise OSError("no socket for you")

    storage = InMemoryStorage()
    host = _host(shm, storage)
    host.start()
    try:
        _, old = host.ensure(_request(shm, tmp_path, 1))
        assert old is not None
        monkeypatch.setattr(host_mod, "Saver", _NoStart)
        decision, saver = host.ensure(_request(shm, tmp_path, 2))
        assert decision.action is EnsureAction.REFUSE
        assert saver is None
        assert "no socket for you" in decision.reason
        assert "keeps serving" in decision.reason
        assert host.saver("job", "run") is old
        SaverClient(old.socket_path, 0, 1).close()  # still reachable at the run's socket
        old.request_persist(0, 1)
        assert old.wait_idle(WAIT_S)
        assert Committer(storage).tracker() == Tracker(1, 1)  # and still committing
    finally:
        host.stop(remove_memory=True)


def test_persist_newest_at_stop_ignores_the_rate_cap(shm: Path, stager: Stager) -> None:
    clock = ManualClock()  # pacing pauses advance it; nothing else here does
    config = SaverConfig(job_id="job", run_id="run", shm_dir=str(shm), persist_bandwidth_mb_s=1e-6)
    saver = Saver(config, InMemoryStorage(), clock=clock)
    saver.start()
    try:
        saver.request_persist(0, 1)  # while training runs, the cap holds
        assert saver.wait_idle(WAIT_S)
        paused = clock.now()
        assert paused > 0
        assert stager.save(2, {"w": torch.ones(64)}).saved
        saver.persist_newest()  # the agent is exiting: training has stopped
        assert saver.wait_idle(WAIT_S)
        assert Committer(saver.storage).tracker() == Tracker(2, 1)
        assert clock.now() == paused  # before the fix: another ~256 s of pauses at 1 B/s
    finally:
        saver.stop(remove_memory=True)


def test_other_runs_are_served_while_an_ended_run_stops(shm: Path, tmp_path: Path, stager: Stager) -> None:
    storage = _GatedStorage()
    host = _host(shm, storage)
    host.start()
    try:
        _, ended = host.ensure(_request(shm, tmp_path, 1))
        assert ended is not None
        ended.request_persist(0, 1)
        assert storage.entered.wait(WAIT_S)
        SaverClient(ended.socket_path, 0, 1).close(shutdown_saver=True)  # the job ended
        assert ended.wait_shutdown(WAIT_S)
        for _ in range(int(WAIT_S / 0.01)):
            if host.saver("job", "run") is None or storage.gate.wait(0.01):
                break
        assert host.saver("job", "run") is None  # the watcher took it and is stopping it
        answered: list[Any] = []
        other = SaverRequest("job", "run2", 1, str(tmp_path / "ckpt"), shm_dir=str(shm))
        again = _request(shm, tmp_path, 1)
        t = threading.Thread(target=lambda: answered.extend([host.ensure(other), host.ensure(again)]))
        t.start()
        t.join(WAIT_S / 2)  # before the fix: blocked behind the ended run's stop
        assert len(answered) == 2, "the host did not answer while an ended run's saver was stopping"
        assert answered[0][0].action is EnsureAction.START
        assert answered[1][0].action is EnsureAction.REFUSE
        assert "is ending" in answered[1][0].reason
    finally:
        storage.gate.set()
        host.stop(remove_memory=True)
