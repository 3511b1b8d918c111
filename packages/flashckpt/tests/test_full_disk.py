"""A disk that really fills up during a persist: a 2 MiB tmpfs mounted for the test (root only).

The node's saver (a detached one, as outside ``dlrover-run``) persists into it; a step too large
for what is left fails with the kernel's ENOSPC, and then: training goes on (the next save works),
the failure is reported to the rank (``persist_failed`` with the OS error), the previous committed
checkpoint stays loadable, and no partial file of the failed step is left in its place.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dlrover.flashckpt import FlashCheckpointer, StagerConfig
from dlrover.flashckpt.commit import Committer, Tracker
from dlrover.flashckpt.host import HOST_SOCKET_ENV_VAR
from dlrover.flashckpt.storage import PosixStorage
from dlrover.flashckpt.storage_loader import StorageReader

pytestmark = pytest.mark.integration

WAIT_S = 60.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB filesystem of its own; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI and the project's machines run tests as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)], check=False)
    if done.returncode != 0:
        pytest.skip("this container may not mount a tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.mark.timeout(120)
def test_a_full_disk_fails_the_persist_and_changes_nothing_else(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(HOST_SOCKET_ENV_VAR, raising=False)
    shm = tmp_path / "shm"
    shm.mkdir()
    storage_dir = small_disk / "ckpt"
    cfg = StagerConfig(job_id="fd" + uuid.uuid4().hex[:8], run_id="r", shm_dir=str(shm))
    ckpt = FlashCheckpointer(cfg, str(storage_dir), idle_exit_s=5)
    small = {"w": torch.full((16_384,), 1.0), "step": 1}  # 64 KiB
    big = {"w": torch.full((1_048_576,), 2.0), "step": 2}  # 4 MiB: more than the disk holds
    try:
        ckpt.save(1, small, persist=True)
        first = ckpt.wait_persisted(1, WAIT_S)
        assert (first.ok, first.committed) == (True, True), first
        ckpt.save(2, big, persist=True)
        failed = ckpt.wait_persisted(2, WAIT_S)
        assert not failed.ok
        assert "No space left on device" in failed.reason, failed.reason
        # Training goes on: the next snapshot is taken and stays in memory.
        assert ckpt.save(3, big).saved
        assert Committer(PosixStorage(storage_dir)).tracker() == Tracker(1, 1)
        loaded = StorageReader(PosixStorage(storage_dir)).load(0, 1)
        assert loaded.step == 1
        assert torch.equal(loaded.state["w"], small["w"])
        # Nothing of the failed step is left, not even a temporary file taking the space.
        assert not (storage_dir / "2").exists() or list((storage_dir / "2").iterdir()) == []
    finally:
        ckpt.close(job_end=True)
