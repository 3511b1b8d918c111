"""A job whose master serves TLS, end to end: the master, its `dlrover-run` agents and their training
processes' shard clients all dial it with TLS, and the training runs to the end.

Two ways the TLS settings reach the clients, both through the ``DLROVER_MASTER_TLS_*`` variables
(`dlrover.common.master_tls`): the master's local backend hands them to the agents it starts (a
self-signed certificate is its own CA), and a person gives `dlrover-run --master-tls-*` flags
(mutual TLS: the agent and its workers present a client certificate). In both the agent passes
them on to its workers, whose `ShardClient` is built with no channel configuration.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from dlrover_testsupport.tls import mutual_tls_files, self_signed

from dlrover.common import ChannelConfig, RetryPolicy, RpcError, TLSConfig, generate_token, write_token_file
from dlrover.master import MasterClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NUM_SAMPLES = 240  # 60 shards of 4 samples

# Each rank leases shards until the dataset is finished and writes the samples it trained on. The
# client is built as a user's script builds it, with no channel configuration: TLS comes from the
# environment the agent gave.
TRAIN = textwrap.dedent(
    """
    import json, os, sys, time
    from dlrover.common import load_token
    from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient, ShardClientConfig

    out, num_samples = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["RANK"])
    held_until = time.monotonic() + 200
    while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < held_until:
        time.sleep(0.1)  # the test's go-ahead
    seen = []
    with ShardClient(
        os.environ["DLROVER_MASTER_ADDR"], load_token(), "samples", f"rank-{rank}",
        config=ShardClientConfig(prefetch_shards=0),
    ) as client:
        client.register(DatasetSpec(
            name="samples", source=IndexSource(num_samples), batch_size=4, batches_per_shard=1,
            delivery=DeliveryMode.EXACTLY_ONCE,
        ))
        while True:
            shard = client.next_shard(timeout_s=120)
            if shard is None:
                break
            seen.extend(shard.remaining_samples())
            client.report_done(shard.shard_id)
    tls = {k: v for k, v in os.environ.items() if k.startswith("DLROVER_MASTER_TLS_")}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"samples": seen, "tls": tls}, f)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    """This process's environment without job settings a test did not choose (tokens, TLS, addresses)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_", "SLURM_", "PET_"))}


def _start(procs: list[subprocess.Popen[str]], cmd: list[str], log: Path) -> subprocess.Popen[str]:
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            cmd,
            cwd=log.parent,
            env=_clean_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    procs.append(proc)
    return proc


def _wait_for(what: str, condition: Callable[[], bool], dump: Callable[[], str], timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{dump()}")
        time.sleep(0.2)


def _trained(out: Path, ranks: int) -> list[dict[str, object]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _every_sample_once(results: list[dict[str, object]]) -> None:
    samples = [s for r in results for s in r["samples"]]  # type: ignore[attr-defined]
    assert sorted(samples) == list(range(NUM_SAMPLES))


def _job_name_over(address: str, token: str, tls: TLSConfig | None) -> str:
    once = RetryPolicy(call_timeout_s=10, total_timeout_s=10, max_attempts=1)
    with MasterClient(address, token, channel_config=ChannelConfig(tls=tls), policy=once) as client:
        return client.job_status().job_name


def test_a_local_backend_job_trains_to_the_end_over_tls_and_plaintext_is_refused(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    pair = self_signed(tmp_path)  # for localhost and 127.0.0.1: its own CA (the master's default rule)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "train.py").write_text(TRAIN)
    token = generate_token()
    token_file = write_token_file(tmp_path / "token", token)
    port = _free_port()
    # The workers wait for a go-ahead file until the plaintext refusal is checked, so the job
    # cannot end first.
    agent = (
        f"{sys.executable} -m dlrover.launcher.cli --nnodes=1 --nproc-per-node=2 --local-addr=127.0.0.1 "
        f"--monitor-interval=0.1 --heartbeat-interval=0.5 --max-restarts=0 --prewarm=none "
        f"{tmp_path / 'train.py'} {out} {NUM_SAMPLES}"
    )
    master_log = tmp_path / "master.log"
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=1", f"--port={port}",
        f"--token-file={token_file}", f"--state-dir={tmp_path / 'state'}", f"--agent-command={agent}",
        f"--tls-cert={pair.cert}", f"--tls-key={pair.key}", "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=0",
    ]  # fmt: skip
    master = _start(procs, master_cmd, master_log)

    def dump() -> str:
        logs = [master_log, *sorted((tmp_path / "state" / "logs").glob("*.log"))]
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in logs if p.exists())

    address = f"127.0.0.1:{port}"
    _wait_for("the master to listen", lambda: _listening(address), dump)
    # A plaintext client is refused by the TLS master; a TLS one that trusts its cert is answered
    # right after, so the master was up all along (the workers wait for the go-ahead).
    with pytest.raises(RpcError) as refused:
        _job_name_over(address, token, None)
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    assert _job_name_over(address, token, TLSConfig(ca_file=pair.cert)) == "dlrover-job"
    (out / "go").write_text("")

    master.wait(timeout=240)
    assert master.returncode == 0, dump()
    results = _trained(out, 2)
    _every_sample_once(results)
    # The workers were told to dial TLS (the master's cert as the CA, as its rule says for a
    # self-signed one); the master serves nothing else, so every shard came over TLS.
    for result in results:
        assert result["tls"] == {
            "DLROVER_MASTER_TLS_CA": str(Path(pair.cert).resolve()),
            "DLROVER_MASTER_TLS_SERVER_NAME": "",
            "DLROVER_MASTER_TLS_CERT": "",
            "DLROVER_MASTER_TLS_KEY": "",
        }


def test_a_user_started_agent_joins_a_mutual_tls_master_with_its_flags(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    files = mutual_tls_files(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "go").write_text("")
    (tmp_path / "train.py").write_text(TRAIN)
    token = generate_token()
    token_file = write_token_file(tmp_path / "token", token)
    port = _free_port()
    master_log, agent_log = tmp_path / "master.log", tmp_path / "agent.log"
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=external", "--nnodes=1", f"--port={port}",
        f"--token-file={token_file}", f"--tls-cert={files.server.cert}", f"--tls-key={files.server.key}",
        f"--tls-ca={files.ca}", "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=0",
    ]  # fmt: skip
    master = _start(procs, master_cmd, master_log)
    agent_cmd = [
        sys.executable, "-m", "dlrover.launcher.cli", f"--master=127.0.0.1:{port}", f"--token-file={token_file}",
        f"--master-tls-ca={files.ca}", f"--master-tls-cert={files.client.cert}",
        f"--master-tls-key={files.client.key}", "--master-tls-server-name=localhost",
        "--nnodes=1", "--nproc-per-node=2", "--local-addr=127.0.0.1", "--max-restarts=0", "--prewarm=none",
        "--monitor-interval=0.1", "--heartbeat-interval=0.5", str(tmp_path / "train.py"), str(out),
        str(NUM_SAMPLES),
    ]  # fmt: skip
    agent = _start(procs, agent_cmd, agent_log)

    def dump() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in (master_log, agent_log) if p.exists())

    agent.wait(timeout=240)
    assert agent.returncode == 0, dump()
    master.wait(timeout=60)
    assert master.returncode == 0, dump()
    results = _trained(out, 2)
    _every_sample_once(results)
    for result in results:
        assert result["tls"] == {
            "DLROVER_MASTER_TLS_CA": files.ca,
            "DLROVER_MASTER_TLS_SERVER_NAME": "localhost",
            "DLROVER_MASTER_TLS_CERT": files.client.cert,
            "DLROVER_MASTER_TLS_KEY": files.client.key,
        }


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_dlrover_run_refuses_a_bad_tls_variable_naming_it(tmp_path: Path) -> None:
    token_file = write_token_file(tmp_path / "token", generate_token())
    env = {**_clean_env(), "DLROVER_MASTER_TLS_CA": str(tmp_path / "missing-ca.pem")}
    cmd = [
        sys.executable, "-m", "dlrover.launcher.cli", f"--master=127.0.0.1:{_free_port()}",
        f"--token-file={token_file}", "--nnodes=1", "--nproc-per-node=1", "--prewarm=none", "train.py",
    ]  # fmt: skip
    done = subprocess.run(
        cmd,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "DLROVER_MASTER_TLS_CA=" in done.stderr, done.stderr
    assert "missing-ca.pem" in done.stderr, done.stderr


def test_a_mutual_tls_master_with_local_agents_needs_a_client_certificate_for_them(tmp_path: Path) -> None:
    files = mutual_tls_files(tmp_path)
    cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=1", "--port=0",
        "--agent-command=true", f"--tls-cert={files.server.cert}", f"--tls-key={files.server.key}",
        f"--tls-ca={files.ca}",
    ]  # fmt: skip
    done = subprocess.run(
        cmd,
        env=_clean_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--agent-tls-cert and --agent-tls-key" in done.stderr
