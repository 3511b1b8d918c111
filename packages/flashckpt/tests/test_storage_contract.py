"""The storage contract: every backend passes the same tests.

The S3 backend runs against moto's S3-compatible server on 127.0.0.1 through s3fs (integration:
it needs the optional ``s3`` and ``s3test`` extras).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flashckpt_testlib import s3_bucket, s3_storage

from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.storage import InMemoryStorage, PosixStorage, Storage


@pytest.fixture(params=["posix", "posix-direct", "memory", pytest.param("s3", marks=pytest.mark.integration)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "posix":
        yield PosixStorage(tmp_path / "ckpt")
    elif request.param == "posix-direct":  # O_DIRECT from the first full 4 KiB buffer, where taken
        yield PosixStorage(tmp_path / "ckpt", direct_io=None, direct_buffer_bytes=4096)
    elif request.param == "memory":
        yield InMemoryStorage()
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        yield s3_storage(endpoint, s3_bucket(endpoint))


def test_write_read_roundtrip(storage: Storage) -> None:
    n = storage.write_file("1/a.bin", [b"abc", memoryview(b"defg"), bytearray(b"h")])
    assert n == 8
    assert storage.read_bytes("1/a.bin") == b"abcdefgh"
    assert storage.read_bytes("1/a.bin", 2, 3) == b"cde"
    buf = bytearray(4)
    storage.read_into("1/a.bin", 4, memoryview(buf))
    assert buf == b"efgh"
    assert storage.size("1/a.bin") == 8
    assert storage.exists("1/a.bin")
    assert not storage.exists("1/b.bin")
    assert storage.list_dir("") == ["1"]
    assert storage.list_dir("1") == ["a.bin"]
    assert storage.list_dir("nope") == []


def test_each_chunk_is_taken_before_the_next_is_asked_for(storage: Storage) -> None:
    # A persist streams views of shared memory and lets the memory go once the last chunk is
    # handed over (`persist_rank`'s on_streamed): a backend must copy or write each chunk before
    # asking for the next, never keep the view for later.
    buffer = bytearray(b"a" * 1000)

    def chunks() -> Iterator[memoryview]:
        for fill in (b"a", b"b", b"c"):
            buffer[:] = fill * len(buffer)
            with memoryview(buffer) as view:
                yield view
        buffer[:] = b"x" * len(buffer)  # the memory is reused once the last chunk was taken

    assert storage.write_file("s/chunks.bin", chunks()) == 3000
    assert storage.read_bytes("s/chunks.bin") == b"a" * 1000 + b"b" * 1000 + b"c" * 1000


def test_overwrite_is_whole(storage: Storage) -> None:
    storage.write_file("t.json", [b"old content"])
    storage.write_file("t.json", [b"new"])
    assert storage.read_bytes("t.json") == b"new"


def test_failed_write_keeps_previous_and_leaves_nothing(storage: Storage) -> None:
    storage.write_file("d/t.json", [b"old"])

    def broken() -> Iterator[bytes]:
        yield b"partial"
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        storage.write_file("d/t.json", broken())
    assert storage.read_bytes("d/t.json") == b"old"
    assert storage.list_dir("d") == ["t.json"]


def test_truncated_and_missing_reads_raise(storage: Storage) -> None:
    storage.write_file("f", [b"1234"])
    with pytest.raises(StorageError, match="truncated"):
        storage.read_bytes("f", 2, 10)
    with pytest.raises(StorageError, match="truncated"):
        storage.read_into("f", 0, memoryview(bytearray(5)))
    with pytest.raises(StorageError, match="missing"):
        storage.read_bytes("missing")
    with pytest.raises(StorageError, match="missing"):
        storage.size("missing")


def test_remove_tree(storage: Storage) -> None:
    storage.write_file("5/a", [b"x"])
    storage.write_file("5/b", [b"y"])
    storage.write_file("6/a", [b"z"])
    storage.remove_tree("5")
    storage.remove_tree("7")
    assert storage.list_dir("") == ["6"]


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "a//b", "./a"])
def test_bad_paths_are_refused(storage: Storage, bad: str) -> None:
    with pytest.raises(StorageError, match="invalid storage path"):
        storage.write_file(bad, [b"x"])


def test_checkpoint_commit_and_load_on_every_backend(storage: Storage) -> None:
    import torch

    from dlrover.flashckpt.commit import Committer
    from dlrover.flashckpt.payloads import payload_from_state
    from dlrover.flashckpt.persist import persist_rank
    from dlrover.flashckpt.storage_loader import StorageReader

    state = {"w": torch.arange(6.0).reshape(2, 3), "n": 3}
    persist_rank(storage, payload_from_state(4, 0, 1, state))
    assert Committer(storage).try_commit(4, 1).commit
    loaded = StorageReader(storage).load(0, 1)
    assert loaded.step == 4
    assert torch.equal(loaded.state["w"], state["w"])


def test_full_disk_is_a_storage_error(tmp_path: Path) -> None:
    store = InMemoryStorage(capacity_bytes=10)
    store.write_file("a", [b"12345"])
    with pytest.raises(StorageError, match="no space left"):
        store.write_file("b", [b"123456"])
    assert store.list_dir("") == ["a"]
