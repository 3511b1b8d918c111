"""The commit lock: two writers of one tracker never move it back, across threads and processes."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from dlrover.common import ConfigError
from dlrover.flashckpt.ckpt_format import TRACKER_PATH
from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.storage import (
    COMMIT_LOCK_NAME,
    CommitLocking,
    FsspecStorage,
    InMemoryStorage,
    PosixStorage,
    Storage,
)

# A child that takes the POSIX commit lock, says so, then waits to be killed or stopped.
_HOLDER = r"""
import sys, time
from dlrover.flashckpt.storage import PosixStorage
with PosixStorage(sys.argv[1]).commit_lock():
    print("held", flush=True)
    time.sleep(600)
"""


class _PausingStorage:
    """Delegates to `inner`; a write of the tracker first calls `pause` (the commit's window)."""

    def __init__(self, inner: Any, pause: Any) -> None:
        self._inner = inner
        self._pause = pause

    def write_file(self, path: str, chunks: Any) -> int:
        if path == TRACKER_PATH:
            self._pause()
        return int(self._inner.write_file(path, chunks))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture(params=["posix", "memory"])
def locking(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return PosixStorage(tmp_path / "ckpt") if request.param == "posix" else InMemoryStorage()


def _tracker_step(storage: Storage) -> int:
    return int(json.loads(storage.read_bytes(TRACKER_PATH))["step"])


@pytest.mark.timeout(60)
def test_a_commit_in_its_window_keeps_a_newer_one_waiting(locking: Storage) -> None:
    # Writer A (step 3) has re-read the tracker and is about to write it when writer B (step 5)
    # commits. Unlocked, B writes 5 and A then writes 3 over it: the tracker moves back. Locked, B
    # waits for A, re-reads 3 and writes 5.
    assert isinstance(locking, CommitLocking)
    a_in_window = threading.Event()
    b_returned = threading.Event()

    def a_pauses() -> None:
        a_in_window.set()
        # Locked, B cannot return before A writes: this bound runs out (no assertion on it).
        b_returned.wait(1.0)

    a = Committer(_PausingStorage(locking, a_pauses))
    b = Committer(locking)
    outcome: dict[str, int | None] = {}
    thread_a = threading.Thread(target=lambda: outcome.__setitem__("a", a.move_tracker(3, 2)))
    thread_a.start()

    assert a_in_window.wait(30)
    outcome["b"] = b.move_tracker(5, 2)
    b_returned.set()
    thread_a.join(30)
    assert not thread_a.is_alive()
    assert outcome == {"a": None, "b": None}  # A wrote 3, then B wrote 5 over it
    assert _tracker_step(locking) == 5
    # And an older step offered afterwards leaves the tracker alone, naming the newer one.
    assert b.move_tracker(4, 2) == 5
    assert _tracker_step(locking) == 5


def test_the_lock_file_stays_out_of_the_steps(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path / "ckpt")
    committer = Committer(storage)
    assert committer.move_tracker(7, 1) is None
    assert (tmp_path / "ckpt" / COMMIT_LOCK_NAME).is_file()
    assert committer.steps() == ([], [])
    assert storage.list_dir("") == [COMMIT_LOCK_NAME, TRACKER_PATH]


def test_object_stores_have_no_lock_and_still_commit() -> None:
    # FsspecStorage declares no lock; the committer then relies on the re-read alone.
    fsspec = pytest.importorskip("fsspec")
    storage = FsspecStorage(fsspec.filesystem("memory", skip_instance_cache=True), f"bucket/{uuid.uuid4().hex}")
    assert not isinstance(storage, CommitLocking)
    assert isinstance(InMemoryStorage(), CommitLocking)
    committer = Committer(storage)
    assert committer.move_tracker(3, 1) is None
    assert committer.move_tracker(2, 1) == 3  # never back
    assert _tracker_step(storage) == 3


def test_a_filesystem_without_flock_commits_unlocked_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    storage = PosixStorage(tmp_path / "ckpt")
    committer = Committer(storage)
    with caplog.at_level(logging.WARNING):
        assert committer.move_tracker(1, 1) is None
        assert committer.move_tracker(2, 1) is None
    assert _tracker_step(storage) == 2
    assert [r.getMessage() for r in caplog.records if "supports no flock" in r.getMessage()] != []
    assert len([r for r in caplog.records if "supports no flock" in r.getMessage()]) == 1


@pytest.mark.timeout(60)
def test_a_child_forked_while_the_lock_is_held_does_not_keep_it(tmp_path: Path) -> None:
    # A data loader worker forked while a background persist commits inherits the lock's open
    # file; were it kept, no commit could take the lock again while the worker lives.
    storage = PosixStorage(tmp_path / "ckpt", commit_lock_timeout_s=0.0)
    release_r, release_w = os.pipe()
    started_r, started_w = os.pipe()
    with storage.commit_lock():
        pid = os.fork()
        if pid == 0:  # the child (its fork handlers have run): says so, waits to be released
            os.close(release_w)
            os.write(started_w, b"x")
            os.read(release_r, 1)
            os._exit(0)
    os.close(release_r)
    os.close(started_w)
    try:
        assert os.read(started_r, 1) == b"x"
        # The child still runs; with a timeout of 0 the lock must be free at once.
        assert Committer(storage).move_tracker(1, 1) is None
    finally:
        os.close(release_w)  # the child's read returns: it exits
        os.close(started_r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_lock_timeout_is_refused(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ConfigError, match="commit_lock_timeout_s"):
        PosixStorage(tmp_path / "ckpt", commit_lock_timeout_s=bad)


def _start_holder(root: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"
    return proc


@pytest.mark.timeout(60)
def test_a_stopped_holder_makes_the_commit_fail_and_leaves_the_tracker(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    storage = PosixStorage(root, commit_lock_timeout_s=0.2)
    assert Committer(storage).move_tracker(2, 1) is None
    holder = _start_holder(root)
    try:
        holder.send_signal(signal.SIGSTOP)
        with pytest.raises(StorageError, match=r"\.commit\.lock stayed locked"):
            Committer(storage).move_tracker(3, 1)
        assert _tracker_step(storage) == 2
    finally:
        holder.kill()
        holder.wait(30)
        assert holder.stdout is not None
        holder.stdout.close()


@pytest.mark.timeout(60)
def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    holder = _start_holder(root)
    holder.kill()
    holder.wait(30)
    assert holder.stdout is not None
    holder.stdout.close()
    storage = PosixStorage(root, commit_lock_timeout_s=0.0)  # not a moment's wait: it must be free
    assert Committer(storage).move_tracker(4, 1) is None
    assert _tracker_step(storage) == 4


def test_the_memory_lock_times_out_for_a_second_holder() -> None:
    storage = InMemoryStorage(commit_lock_timeout_s=0.05)
    with storage.commit_lock(), pytest.raises(StorageError, match="commit lock stayed held"):
        Committer(storage).move_tracker(1, 1)
    assert not storage.exists(TRACKER_PATH)
    assert Committer(storage).move_tracker(1, 1) is None
