from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover.flashckpt.config import StagerConfig

# Tests import shared helpers from flashckpt_testlib (pytest's importlib mode adds no path itself).
sys.path.insert(0, str(Path(__file__).parent))

from flashckpt_testlib import our_files


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1 (skips where the ``s3test`` extra is missing)."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    """A shared-memory directory of the test's own (segments, sockets and owner records)."""
    d = tmp_path / "shm"
    d.mkdir()
    return d


@pytest.fixture
def job_id() -> Iterator[str]:
    """A job id unique to the test; the test fails if any of its shared memory is left behind."""
    job = "t" + uuid.uuid4().hex[:12]
    yield job
    left = our_files(job)
    for p in left:
        p.unlink(missing_ok=True)
    assert not left, f"shared memory left behind: {left}"


@pytest.fixture
def config(job_id: str) -> StagerConfig:
    return StagerConfig(job_id=job_id, run_id="r1", copy_threads=2, copy_chunk_bytes=1 << 16, busy_wait_timeout_s=5)
