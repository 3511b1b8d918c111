"""Node health probes: the pure assessment, and a real two-process gloo probe."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from dlrover.common import ConfigError
from dlrover.diagnosis import ProbeConfig, ProbeError, ProbeResult, run_paired_probe


def test_probe_config_validation() -> None:
    with pytest.raises(ConfigError, match="matmul_size"):
        ProbeConfig(matmul_size=0)
    with pytest.raises(ConfigError, match="backend"):
        ProbeConfig(backend="mpi")
    with pytest.raises(ProbeError, match="rank must be"):
        run_paired_probe(2, 2, "127.0.0.1", 1234)
    with pytest.raises(ProbeError, match="store_port"):
        run_paired_probe(0, 2, "127.0.0.1", 0)


def _spawn(rank: int, port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dlrover.diagnosis.probe_main", "--rank", str(rank), "--store-port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_two_gloo_ranks_probe_each_other() -> None:
    dist = pytest.importorskip("torch.distributed")
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60))
    procs = [_spawn(r, store.port, "--node-id", f"node-{r}", "--backend", "gloo", "--timeout-s", "60") for r in (0, 1)]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-2000:]
        results.append(ProbeResult(**json.loads(out.strip().splitlines()[-1])))
    assert [r.rank for r in results] == [0, 1]
    assert all(r.ok and r.backend == "gloo" and r.world_size == 2 for r in results)
    assert all(r.matmul_s > 0 and r.allreduce_s > 0 and r.allgather_s > 0 for r in results)
    assert all(r.ok for r in results)


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_one_rank_can_host_the_pairs_store() -> None:
    pytest.importorskip("torch.distributed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    procs = [_spawn(0, port, "--store-master", "--backend", "gloo", "--timeout-s", "60")]
    procs.append(_spawn(1, port, "--backend", "gloo", "--timeout-s", "60"))
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-2000:]
    assert all(ProbeResult(**json.loads(out.strip().splitlines()[-1])).ok for out, _err in outputs)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_probe_without_a_peer_fails_with_a_reason_not_a_hang() -> None:
    dist = pytest.importorskip("torch.distributed")
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60))
    proc = _spawn(0, store.port, "--backend", "gloo", "--timeout-s", "3")
    try:
        out, err = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-2000:]
    result = ProbeResult(**json.loads(out.strip().splitlines()[-1]))
    assert not result.ok
    assert result.error
