"""The node's saver writes to object storage too: a `FlashCheckpointer` on an `FsspecStorage`
hands the saver process (detached, or the agent's `SaverHost`) a `StorageLocation` (the URL and
the filesystem's options) and the saver opens the same bucket itself. Tested against moto's S3
server on 127.0.0.1 through s3fs; the credentials never appear on a command line."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from flashckpt_testlib import s3_bucket, s3_storage, same_bits

from dlrover.common import ConfigError
from dlrover.flashckpt import FlashCheckpointer, StagerConfig
from dlrover.flashckpt.commit import Committer, RetentionPolicy, Tracker
from dlrover.flashckpt.errors import FlashCkptError
from dlrover.flashckpt.host import HOST_SOCKET_ENV_VAR, SaverHost, SaverHostConfig, host_socket_path
from dlrover.flashckpt.segment import owner_path
from dlrover.flashckpt.storage import FsspecStorage, InMemoryStorage, PosixStorage
from dlrover.flashckpt.storage.location import StorageLocation
from dlrover.flashckpt.storage_loader import StorageReader

WAIT_S = 60.0

pytestmark = pytest.mark.integration


def _state(step: int) -> dict[str, object]:
    return {"w": torch.full((256,), float(step)), "b": torch.arange(step + 3), "step": step}


@pytest.fixture
def bucket_storage(s3_endpoint: str) -> FsspecStorage:
    return s3_storage(s3_endpoint, s3_bucket(s3_endpoint), prefix="job")


def _save_persist_and_load(ckpt: FlashCheckpointer, storage: FsspecStorage, steps: range) -> None:
    for step in steps:
        ckpt.save(step, _state(step), persist=True)
        outcome = ckpt.wait_persisted(step, WAIT_S)
        assert (outcome.ok, outcome.committed) == (True, True), outcome
    last = steps[-1]
    assert Committer(storage).tracker() == Tracker(last, 1)
    loaded = StorageReader(storage).load(0, 1)
    assert loaded.step == last
    assert same_bits(loaded.state, _state(last))


@pytest.mark.timeout(180)
def test_a_detached_saver_persists_to_the_bucket(bucket_storage: FsspecStorage, shm: Path) -> None:
    job = "s3d" + uuid.uuid4().hex[:8]
    cfg = StagerConfig(job_id=job, run_id="r", shm_dir=str(shm))
    ckpt = FlashCheckpointer(cfg, storage=bucket_storage, idle_exit_s=5, retention=RetentionPolicy(keep_last=2))
    try:
        assert ckpt.client is not None
        saver_pid = json.loads(owner_path(str(shm), job, "r").read_text())["pid"]
        cmdline = Path(f"/proc/{saver_pid}/cmdline").read_bytes()
        assert b"saver_main" in cmdline
        assert b"s3://" in cmdline
        assert b"testing" not in cmdline  # the secret key travels in the environment only
        _save_persist_and_load(ckpt, bucket_storage, range(1, 5))
        # The saver applied the job's retention: the last two committed steps are kept.
        assert Committer(bucket_storage).steps()[0] == [3, 4]
    finally:
        ckpt.close(job_end=True)


@pytest.mark.timeout(180)
def test_the_agents_saver_host_persists_to_the_bucket(
    bucket_storage: FsspecStorage, shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    host = SaverHost(SaverHostConfig(str(host_socket_path(host_dir)), stop_timeout_s=WAIT_S))
    host.start()
    monkeypatch.setenv(HOST_SOCKET_ENV_VAR, str(host.socket_path))
    try:
        cfg = StagerConfig(job_id="s3h" + uuid.uuid4().hex[:8], run_id="r", shm_dir=str(shm))
        ckpt = FlashCheckpointer(cfg, storage=bucket_storage)
        try:
            assert ckpt.client is not None
            _save_persist_and_load(ckpt, bucket_storage, range(1, 3))
        finally:
            ckpt.close(job_end=True)
    finally:
        host.stop(remove_memory=True)


def test_a_storage_no_other_process_can_open_needs_saver_none(tmp_path: Path, shm: Path) -> None:
    cfg = StagerConfig(job_id="s3x" + uuid.uuid4().hex[:8], run_id="r", shm_dir=str(shm))
    with pytest.raises(ConfigError, match="InMemoryStorage cannot be opened by another process"):
        FlashCheckpointer(cfg, storage=InMemoryStorage())
    with pytest.raises(ConfigError, match="name different places"):
        FlashCheckpointer(cfg, str(tmp_path / "a"), storage=PosixStorage(tmp_path / "b"))
    ckpt = FlashCheckpointer(cfg, storage=InMemoryStorage(), saver="none")  # persisted in this process
    ckpt.close(job_end=True)


def test_storage_locations() -> None:
    s3 = StorageLocation("s3://bucket/jobs/j1/", {"key": "k", "secret": "s"})
    assert (s3.protocol, s3.root, s3.is_posix) == ("s3", "bucket/jobs/j1", False)
    assert "secret" not in repr(s3)
    assert StorageLocation.from_message(json.loads(json.dumps(s3.to_message()))) == s3
    posix = StorageLocation("/ckpt")
    assert (posix.protocol, posix.root, posix.is_posix) == ("file", "/ckpt", True)
    for bad, match in [
        (("ckpt",), "must be an absolute path"),
        (("s3://",), "names no bucket"),
        (("/ckpt", {"key": "k"}), r"takes only the options \['direct_buffer_bytes', .*\], got \['key'\]"),
        (("/ckpt", {"direct_io": "yes"}), "storage options of '/ckpt': direct_io must be None, True or False"),
        (("/ckpt", {"direct_buffer_bytes": 100}), "direct_buffer_bytes must be a multiple of 4096 up to"),
        (("s3://b", {"f": float("nan")}), "not JSON-compatible"),
        (("s3://b", {"f": object()}), "not JSON-compatible"),
    ]:
        with pytest.raises(FlashCkptError, match=match):
            StorageLocation(*bad)  # type: ignore[arg-type]
    with pytest.raises(FlashCkptError, match="needs a string 'url'"):
        StorageLocation.from_message({"options": {}})
    with pytest.raises(FlashCkptError, match="cannot open storage 'nosuchprotocol://x'"):
        StorageLocation("nosuchprotocol://x").open()


def test_a_location_opens_the_storage_it_was_taken_from(bucket_storage: FsspecStorage, tmp_path: Path) -> None:
    location = StorageLocation.of(bucket_storage)
    assert location.url == f"s3://{bucket_storage.root}"
    reopened = location.open()
    assert isinstance(reopened, FsspecStorage)
    reopened.write_file("probe", [b"hello"])
    assert bucket_storage.read_bytes("probe") == b"hello"
    posix = StorageLocation.of(PosixStorage(tmp_path / "p"))
    assert posix.url == str(tmp_path / "p")


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a dlrover-run agent unless a test starts its own host."""
    monkeypatch.delenv(HOST_SOCKET_ENV_VAR, raising=False)
