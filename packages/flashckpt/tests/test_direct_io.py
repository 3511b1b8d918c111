"""Direct writes: the same bytes as a buffered write whatever the chunking, past the page cache,
and a filesystem that refuses ``O_DIRECT`` (setting the flag, or at a write) still gets every byte,
through the page cache with windowed writeback, unless ``direct_io=True`` asked for a failure."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flashckpt_testlib import resident_pages
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError
from dlrover.flashckpt import FlashCheckpointer, StagerConfig
from dlrover.flashckpt.ckpt_format import safetensors_path
from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.host import HOST_SOCKET_ENV_VAR
from dlrover.flashckpt.storage import PosixStorage
from dlrover.flashckpt.storage import direct_io as direct_mod
from dlrover.flashckpt.storage import posix as posix_mod
from dlrover.flashckpt.storage.direct_io import ALIGN, DIRECT_FLAG, write_direct
from dlrover.flashckpt.storage.location import StorageLocation


def _bypasses_the_page_cache(directory: Path) -> bool:
    """Whether a direct write to `directory` leaves the page cache alone (not on tmpfs, whose
    files are their pages, and which accepts the flag since Linux 6.6)."""
    probe = directory / ".direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | DIRECT_FLAG, 0o600)
    except OSError:
        probe.unlink(missing_ok=True)
        return False
    try:
        block = np.zeros(2 * ALIGN, dtype=np.uint8)
        aligned = block[-block.ctypes.data % ALIGN :][:ALIGN]
        os.write(fd, aligned.data)
        os.fsync(fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    try:
        return resident_pages(probe) == 0
    finally:
        probe.unlink(missing_ok=True)


@pytest.fixture
def direct_dir(tmp_path: Path) -> Path:
    if not DIRECT_FLAG or not _bypasses_the_page_cache(tmp_path):
        pytest.skip(f"direct writes to {tmp_path} do not bypass the page cache here")
    return tmp_path


chunk_lists = st.lists(
    st.one_of(
        st.binary(max_size=64),
        st.integers(0, 3 * ALIGN + 17).map(lambda n: bytes((i * 7 + n) % 251 for i in range(n))),
    ),
    max_size=12,
)


@given(chunks=chunk_lists, buffer_blocks=st.integers(1, 3))
def test_a_direct_write_holds_exactly_the_stream(
    tmp_path_factory: Any, chunks: list[bytes], buffer_blocks: int
) -> None:
    path = tmp_path_factory.mktemp("direct") / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        # memoryviews and bytearrays too, as persist hands slices of a slot over
        shaped = [memoryview(c) if i % 3 == 1 else bytearray(c) if i % 3 == 2 else c for i, c in enumerate(chunks)]
        done = write_direct(fd, shaped, buffer_blocks * ALIGN)
        assert done.written == sum(map(len, chunks))
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(chunks)


def test_a_direct_file_leaves_the_page_cache_alone(direct_dir: Path) -> None:
    data = os.urandom(1 << 20) * 4 + b"tail"  # 4 MiB and a tail that is written buffered
    direct = PosixStorage(direct_dir / "d", direct_io=None, direct_buffer_bytes=1 << 20)
    assert direct.write_file("f", [data]) == len(data)
    buffered = PosixStorage(direct_dir / "b", writeback_window_bytes=0, direct_io=False)
    buffered.write_file("f", [data])
    assert resident_pages(direct_dir / "b" / "f") > len(data) // mmap.PAGESIZE // 2  # the probe sees pages
    assert resident_pages(direct_dir / "d" / "f") <= 1  # the tail's page at most
    assert (direct_dir / "d" / "f").read_bytes() == data


def _refusing_flag(tried: list[int]) -> Any:
    """``fcntl`` of a filesystem that refuses ``O_DIRECT`` (EINVAL), as some FUSE filesystems do."""
    real = fcntl.fcntl

    def fake(fd: int, cmd: int, arg: int = 0) -> Any:
        if cmd == fcntl.F_SETFL and arg & DIRECT_FLAG:
            tried.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, cmd, arg)

    return fake


@pytest.mark.skipif(not DIRECT_FLAG, reason="no O_DIRECT on this platform")
def test_a_refused_flag_falls_back_once_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tried: list[int] = []
    monkeypatch.setattr(direct_mod, "_set_flags", _refusing_flag(tried))
    windows: list[int] = []
    monkeypatch.setattr(posix_mod._Writeback, "wrote", lambda self, total: windows.append(total))
    storage = PosixStorage(tmp_path, direct_io=None, direct_buffer_bytes=2 * ALIGN)
    data = os.urandom(5 * ALIGN + 3)
    with caplog.at_level(logging.WARNING, logger=posix_mod.__name__):
        assert storage.write_file("a", [data]) == len(data)
        assert storage.write_file("b", [data]) == len(data)
    assert len(tried) == 1  # the second file did not try again
    assert windows  # the refused file's rest went through windowed writeback
    assert [r.message for r in caplog.records if "O_DIRECT" in r.message] == [
        f"{tmp_path} refuses O_DIRECT (setting O_DIRECT: [Errno 22] Invalid argument): "
        "checkpoints are written through the page cache"
    ]
    assert (tmp_path / "a").read_bytes() == data
    assert (tmp_path / "b").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary file left


@pytest.mark.skipif(not DIRECT_FLAG, reason="no O_DIRECT on this platform")
def test_direct_io_required_fails_the_write_on_a_filesystem_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct_mod, "_set_flags", _refusing_flag([]))
    storage = PosixStorage(tmp_path, direct_io=True, direct_buffer_bytes=ALIGN)
    (tmp_path / "a").write_bytes(b"old")
    with pytest.raises(StorageError, match="does not support O_DIRECT"):
        storage.write_file("a", [b"new" * ALIGN])
    assert (tmp_path / "a").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


def test_a_file_smaller_than_the_buffer_never_sets_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[int] = []
    monkeypatch.setattr(direct_mod, "_set_flags", _refusing_flag(tried))
    storage = PosixStorage(tmp_path, direct_io=None)  # 8 MiB buffer
    assert storage.write_file("manifest.json", [b"{}" * 1000]) == 2000
    assert tried == []


def test_a_refused_direct_write_finishes_the_file_buffered(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    refused: list[int] = []

    def refuse_the_second_direct_write(fd: int, data: Any) -> int:  # a refusal at a write, not at fcntl
        if fcntl_direct(fd) and real_writes and not refused:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        real_writes.append(len(data))
        return real(fd, data)

    real_writes: list[int] = []
    monkeypatch.setattr(direct_mod, "_write", refuse_the_second_direct_write)
    data = os.urandom(5 * ALIGN + 100)
    storage = PosixStorage(direct_dir, direct_io=None, direct_buffer_bytes=2 * ALIGN)
    assert storage.write_file("f", [data[:3000], data[3000:]]) == len(data)
    assert refused == [2 * ALIGN]
    assert (direct_dir / "f").read_bytes() == data


def test_a_short_direct_write_finishes_the_file_buffered(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    flags_seen: list[bool] = []

    def short_once(fd: int, data: Any) -> int:
        flags_seen.append(fcntl_direct(fd))
        if len(flags_seen) == 1:
            return real(fd, memoryview(data)[:ALIGN])  # the disk took one block of two
        return real(fd, data)

    monkeypatch.setattr(direct_mod, "_write", short_once)
    data = os.urandom(4 * ALIGN + 1)
    storage = PosixStorage(direct_dir, direct_io=None, direct_buffer_bytes=2 * ALIGN)
    assert storage.write_file("f", [data]) == len(data)
    assert flags_seen[0] is True
    assert not any(flags_seen[1:])  # everything after the short write went through the page cache
    assert storage._direct  # a short write is no refusal: the next file tries again
    assert (direct_dir / "f").read_bytes() == data


def fcntl_direct(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & DIRECT_FLAG)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"direct_io": "yes"}, "direct_io"),
        ({"direct_buffer_bytes": 1000}, "multiple of 4096"),
        ({"direct_buffer_bytes": 0}, "multiple of 4096"),
        ({"direct_buffer_bytes": 2 << 30}, "multiple of 4096 up to"),
        ({"direct_buffer_bytes": True}, "must be an int"),
    ],
)
def test_bad_direct_settings_are_refused(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        PosixStorage(tmp_path, **kwargs)


def test_write_direct_refuses_an_unaligned_buffer() -> None:
    with pytest.raises(ValueError, match="multiple of 4096"):
        write_direct(-1, iter([]), 100)


def test_write_settings_travel_in_the_storage_location(tmp_path: Path) -> None:
    assert StorageLocation.of(PosixStorage(tmp_path)).options == {}  # defaults: the message is as before
    storage = PosixStorage(tmp_path, writeback_window_bytes=0, direct_io=None)
    location = StorageLocation.from_message(json.loads(json.dumps(StorageLocation.of(storage).to_message())))
    assert location.options == {"writeback_window_bytes": 0, "direct_io": None}
    reopened = location.open()
    assert isinstance(reopened, PosixStorage)
    assert (reopened.writeback_window_bytes, reopened.direct_io) == (0, None)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_detached_saver_writes_with_the_trainers_settings(
    direct_dir: Path, job_id: str, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The saver, another process, opens the storage with the settings the trainer gave it: here
    with O_DIRECT, past the page cache, where its default would write through it and keep the
    pages (no writeback window)."""
    monkeypatch.delenv(HOST_SOCKET_ENV_VAR, raising=False)
    cfg = StagerConfig(job_id=job_id, run_id="r1", shm_dir=str(shm))
    storage = PosixStorage(direct_dir / "ckpt", writeback_window_bytes=0, direct_io=None)
    ckpt = FlashCheckpointer(cfg, storage=storage, saver="auto", idle_exit_s=30)
    try:
        ckpt.save(1, {"w": torch.ones(4 << 20)}, persist=True)  # 16 MiB: past the first buffer
        assert ckpt.wait_persisted(1, timeout_s=60).committed
    finally:
        ckpt.close(job_end=True)
    data = direct_dir / "ckpt" / safetensors_path(1, 0)
    assert data.stat().st_size > 16 << 20
    assert resident_pages(data) <= 1  # the tail's page at most
