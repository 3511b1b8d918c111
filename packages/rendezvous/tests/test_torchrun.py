"""Stock torchrun with `--rdzv-backend=dlrover`: two real agents on 127.0.0.1 running a gloo all-reduce."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dlrover.common import GrpcServer, ServerConfig, generate_token
from dlrover.rendezvous import RendezvousConfig, RendezvousManager, RendezvousServicer, add_rendezvous_service

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "scripts" / "train_allreduce.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.fixture
def service() -> Iterator[tuple[GrpcServer, RendezvousServicer, str]]:
    token = generate_token()
    manager = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2, last_call_s=0.0, heartbeat_timeout_s=60))
    server = GrpcServer(ServerConfig(), token)
    servicer = add_rendezvous_service(server, manager)
    server.start()
    yield server, servicer, token
    server.stop(0)


def _agents(
    tmp_path: Path, address: str, token: str, extra_args: list[str], max_restarts: int
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    env = {
        **os.environ,
        "DLROVER_JOB_TOKEN": token,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DLROVER_JOB_TOKEN_FILE", None)
    agents = []
    for node in ("node-a", "node-b"):
        log = tmp_path / f"{node}.log"
        cmd = [
            str(TORCHRUN),
            "--rdzv-backend=dlrover",
            f"--rdzv-endpoint={address}",
            "--rdzv-id=job-1",
            f"--rdzv-conf=node_id={node},join_timeout=90,heartbeat_interval=1",
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2",
            "--local-addr=127.0.0.1",
            "--log-dir",
            str(tmp_path / "torchrun-logs" / node),
            str(SCRIPT),
            str(tmp_path),
            *extra_args,
        ]
        with log.open("wb") as out:
            # A session of its own, so the agent and its workers can be killed together.
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        agents.append((proc, log))
    return agents


def _finish(agents: list[tuple[subprocess.Popen[bytes], Path]], timeout_s: float) -> None:
    try:
        for proc, log in agents:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pytest.fail(f"agent did not finish in {timeout_s} s:\n{log.read_text()[-4000:]}")
    finally:
        for proc, _ in agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                # Workers of a finished agent are gone with it; this only reaps stragglers of a failed one.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    for proc, log in agents:
        assert proc.returncode == 0, log.read_text()[-4000:]


def _results(tmp_path: Path) -> list[list[str]]:
    return [(tmp_path / f"rank{r}.txt").read_text().split() for r in range(2)]


@pytest.mark.timeout(110)
def test_two_torchrun_agents_allreduce(tmp_path: Path, service: tuple[GrpcServer, RendezvousServicer, str]) -> None:
    server, servicer, token = service
    _finish(_agents(tmp_path, server.address, token, [], max_restarts=0), timeout_s=95)
    results = _results(tmp_path)
    assert [r[:2] for r in results] == [["3", "2"], ["3", "2"]]
    with servicer.lock:
        assert servicer.manager.round_number == 1


@pytest.mark.timeout(110)
def test_failed_worker_restarts_and_both_agents_rerendezvous(
    tmp_path: Path, service: tuple[GrpcServer, RendezvousServicer, str]
) -> None:
    server, servicer, token = service
    marker = tmp_path / "failed-once"
    _finish(_agents(tmp_path, server.address, token, [str(marker)], max_restarts=1), timeout_s=95)
    assert marker.exists()
    results = _results(tmp_path)
    assert [r[:2] for r in results] == [["3", "2"], ["3", "2"]]
    with servicer.lock:
        # Round 1 started the workers; the failure made both agents join round 2.
        assert servicer.manager.round_number == 2
    assert results[0][2] == "1"
