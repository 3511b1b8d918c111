"""Windowed writeback (files written through the page cache) must not swallow the writeback error
that the final fsync relies on."""

from __future__ import annotations

import ctypes
import errno
from pathlib import Path
from typing import Any

import pytest
import torch

from dlrover.flashckpt.ckpt_format import safetensors_path
from dlrover.flashckpt.commit import Committer, Tracker
from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.payloads import payload_from_state
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.storage import PosixStorage
from dlrover.flashckpt.storage import posix as posix_mod
from dlrover.flashckpt.storage_loader import StorageReader


def _state(step: int) -> dict[str, Any]:
    return {"w": torch.full((64, 1024), float(step))}  # 256 KiB: many 4 KiB windows


def _failing(err: int) -> Any:
    calls: list[int] = []

    def fake(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append(flags)
        ctypes.set_errno(err)
        return -1

    return fake, calls


def test_sync_file_range_error_fails_write_and_nothing_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = PosixStorage(tmp_path, writeback_window_bytes=4096, direct_io=False)
    persist_rank(storage, payload_from_state(1, 0, 1, _state(1)))
    assert Committer(storage).try_commit(1, 1).commit
    fake, calls = _failing(errno.EIO)
    monkeypatch.setattr(posix_mod, "_sync_file_range", fake)
    with pytest.raises(StorageError, match="sync_file_range"):
        persist_rank(storage, payload_from_state(2, 0, 1, _state(2)))
    assert calls
    assert not (tmp_path / safetensors_path(2, 0)).exists()
    assert not list(tmp_path.rglob("*.tmp-*"))
    assert not Committer(storage).try_commit(2, 1).commit
    assert Committer(storage).tracker() == Tracker(1, 1)
    loaded = StorageReader(storage).load(rank=0, world_size=1)
    assert loaded.step == 1
    assert torch.equal(loaded.state["w"], _state(1)["w"])


def test_unsupported_sync_file_range_disables_windowing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = _failing(errno.EINVAL)
    monkeypatch.setattr(posix_mod, "_sync_file_range", fake)
    storage = PosixStorage(tmp_path, writeback_window_bytes=4096, direct_io=False)
    assert storage.write_file("f", [bytes(64 << 10)]) == 64 << 10
    assert calls == [posix_mod._SYNC_START]  # tried once, then windowing is off for the file
    assert (tmp_path / "f").stat().st_size == 64 << 10
