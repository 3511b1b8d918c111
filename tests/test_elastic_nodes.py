"""Two `dlrover-run` agents as two nodes of one `dlrover-master` job (`--nnodes=1:2`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlrover.common import generate_token, write_token_file
from dlrover.flashckpt.segment import DEFAULT_SHM_DIR, remove_run
from dlrover.launcher.agent import NODE_SHM_PREFIX
from dlrover.launcher.cli import TOKEN_DIR_PREFIX
from dlrover.master import MasterClient, read_event_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist

    out, last_step = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    ckpt = os.path.join(out, "ckpt.pt")
    step = torch.load(ckpt)["step"] if os.path.exists(ckpt) else 0
    dist.barrier()
    while step < last_step:
        t = torch.ones(1)
        dist.all_reduce(t)
        step += 1
        if rank == 0:
            torch.save({"step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
            with open(os.path.join(out, "progress.log"), "a") as f:
                f.write(f"{step} {world} {int(t.item())}\\n")
        time.sleep(0.2)
    dist.destroy_process_group()
    """
)


# DDP with replicated flash checkpoints. The batch depends on the step alone and every rank trains
# on the same one, so the weights after each step are the same at any world size (the average of
# one or two equal gradients is exact) and a test can compute them without a process group.
FLASH_TRAIN = textwrap.dedent(
    """
    import hashlib, json, os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig

    out, last_step = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = FlashCheckpointer(
        StagerConfig(job_id="elastic", run_id="nodes", rank=rank, world_size=world),
        os.path.join(out, "ckpt"),
        replicated=True,
    )
    try:
        loaded = ckpt.load()  # a collective: the newest step any rank's node holds
        model.module.load_state_dict(loaded.state["model"])
        optim.load_state_dict(loaded.state["optim"])
        step, source, detail = int(loaded.state["step"]), loaded.source, loaded.detail
    except NoCheckpointError:
        step, source, detail = 0, "none", ""
    with open(os.path.join(out, "resumed.jsonl"), "a") as f:
        resumed = {"rank": rank, "world": world, "step": step, "source": source, "detail": detail, "pid": os.getpid()}
        f.write(json.dumps(resumed) + "\\n")
    while step < last_step:
        optim.zero_grad()
        model(torch.full((4, 8), float(step % 7))).square().mean().backward()
        optim.step()
        step += 1
        state = {"model": model.module.state_dict(), "optim": optim.state_dict(), "step": step}
        ckpt.save(step, state, persist=step % 50 == 0)
        if rank == 0:
            digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
            with open(os.path.join(out, "progress.log"), "a") as f:
                f.write(f"{step} {world} {digest.hexdigest()[:16]}\\n")
        time.sleep(0.2)
    ckpt.close(job_end=rank == 0)
    del optim, model  # the DDP model first: freed after the group, it can hang with a gloo thread
    dist.destroy_process_group()
    """
)


def _weights(out: Path) -> dict[int, str]:
    """The weights' digest rank 0 logged after each step (a step logged twice must agree)."""
    rows: dict[int, str] = {}
    for line in (out / "progress.log").read_text().splitlines():
        step, _, digest = line.split()
        assert rows.setdefault(int(step), digest) == digest, f"step {step} trained to other weights"
    return rows


def _fault_free_weights(last_step: int) -> dict[int, str]:
    """The digests FLASH_TRAIN logs, computed in one process without faults."""
    import hashlib

    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    digests = {}
    for step in range(last_step):
        optim.zero_grad()
        model(torch.full((4, 8), float(step % 7))).square().mean().backward()
        optim.step()
        raw = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
        digests[step + 1] = hashlib.sha256(raw).hexdigest()[:16]
    return digests


def _job_files(tmp_path: Path, script: str) -> tuple[Path, Path, int]:
    """The output folder, the job's token file and a free port for a job running `script`
    (written to ``tmp_path/train.py``)."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "train.py").write_text(script)
    return out, write_token_file(tmp_path / "token", generate_token()), _free_port()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    # What still runs is stopped as a scheduler stops a job, so each agent stops its workers and
    # removes what it owns; SIGKILL only for one that does not exit in time.
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # An agent a test SIGKILLed (a lost node) cannot clean up: the next dlrover-run on the host
    # sweeps what it left (its saver host's socket and owner record, its token dir); so does this,
    # for those agents only, so that what a stopped agent failed to remove still shows as a leak.
    killed = {proc.pid for proc in started if proc.returncode == -signal.SIGKILL}
    _sweep_after(killed)


def _sweep_after(killed: set[int]) -> None:
    """Remove the shared memory runs and temp dirs owned by the `killed` processes."""
    for pid in killed:
        for path in Path(DEFAULT_SHM_DIR).glob(f"{NODE_SHM_PREFIX}{pid}-*"):
            shutil.rmtree(path, ignore_errors=True)
    for record in Path(DEFAULT_SHM_DIR).glob("dlrover-fc.*.owner"):
        try:
            owner = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if owner.get("pid") in killed:
            remove_run(DEFAULT_SHM_DIR, owner["job"], owner["run"])
    for pid in killed:
        for path in Path(tempfile.gettempdir()).glob(f"{TOKEN_DIR_PREFIX}{pid}-*"):
            shutil.rmtree(path, ignore_errors=True)


def _start(
    procs: list[subprocess.Popen[str]], cmd: list[str], log: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_JOB_TOKEN", "SLURM_"))}
    env.update(extra_env or {})
    handle = open(log, "w")  # noqa: SIM115 (closed with the process below)
    # In the test's own directory: an agent without --log-dir keeps its workers' logs in ./dlrover-logs.
    proc = subprocess.Popen(
        cmd, cwd=log.parent, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    handle.close()
    procs.append(proc)
    return proc


def _all_succeed(agents: list[subprocess.Popen[str]], logs: list[Path]) -> None:
    """Wait for every agent to exit 0 (bounded, all together); a failure shows the logs."""
    deadline = time.monotonic() + 240
    for proc, log in zip(agents, logs, strict=True):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError("\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)) from None
        assert proc.returncode == 0, log.read_text()[-4000:]


def _progress(out: Path) -> list[tuple[int, int]]:
    path = out / "progress.log"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(r[0]), int(r[1])) for r in rows if len(r) == 3]


def _wait(what: str, condition: Callable[[], bool], logs: list[Path], timeout_s: float = 150.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            dump = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"timed out waiting for {what}\n{dump}")
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children() if not _gone(c.pid)]


def _resumes(out: Path) -> list[dict[str, Any]]:
    """What each FLASH_TRAIN worker loaded when it started, in start order."""
    return [json.loads(line) for line in (out / "resumed.jsonl").read_text().splitlines()]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_lost_node_shrinks_the_job_from_memory_and_a_new_one_grows_it_back(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out, token_file, port = _job_files(tmp_path, FLASH_TRAIN)
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=external", "--nnodes=1:2", f"--port={port}",
        f"--token-file={token_file}", "--heartbeat-interval-s=0.5", "--heartbeat-timeout-s=10",
        "--rdzv-last-call-s=1", "--rdzv-heartbeat-timeout-s=10", "--node-start-timeout-s=0",
        "--insufficient-nodes-window-s=60",
    ]  # fmt: skip
    logs = [tmp_path / "master.log", tmp_path / "agent_a.log", tmp_path / "agent_b.log", tmp_path / "agent_c.log"]
    master = _start(procs, master_cmd, logs[0])

    def agent(log: Path) -> subprocess.Popen[str]:
        cmd = [
            sys.executable, "-m", "dlrover.launcher.cli", f"--master=127.0.0.1:{port}", f"--token-file={token_file}",
            "--nnodes=1:2", "--nproc-per-node=1", "--local-addr=127.0.0.1", "--max-restarts=3",
            "--monitor-interval=0.1", "--heartbeat-interval=0.5", f"--log-dir={tmp_path / 'logs' / log.stem}",
            str(tmp_path / "train.py"), str(out), "400",
        ]  # fmt: skip
        return _start(procs, cmd, log)

    a = agent(logs[1])
    b = agent(logs[2])
    # The heartbeat timeout (10 s) is far above the interval (0.5 s): on a loaded 2-core machine a
    # live agent's heartbeats can stall for seconds while its peers' standby workers import torch
    # (with 3 s a live node was once declared lost before the test killed anything).
    _wait("training on two nodes", lambda: sum(1 for _, w in _progress(out) if w == 2) >= 5, logs)

    # Node rank 0 is lost: the node hosting the round's store and rank 0's snapshots.
    pids = {r["rank"]: r["pid"] for r in _resumes(out) if r["world"] == 2}
    lost, kept = (a, b) if pids[0] in _children(a.pid) else (b, a)
    assert pids[0] in _children(lost.pid)
    assert pids[1] in _children(kept.pid)
    lost_workers = _children(lost.pid)
    lost.kill()  # SIGKILL to the agent alone: its workers must follow it
    lost.wait()
    _wait("the lost agent's workers to die with it", lambda: all(_gone(w) for w in lost_workers), logs, timeout_s=30)

    shrunk_at = len(_progress(out))
    _wait(
        "training on one node",
        lambda: sum(1 for _, w in _progress(out)[shrunk_at:] if w == 1) >= 5,
        logs,
    )
    # The kept node's workers form a round of one as soon as their collective breaks; the master
    # lets go of the lost node's rank only after its heartbeat timeout. A new agent is started
    # once the rank is open to it (before that, the master refuses it: every rank is taken).
    _wait(
        "the master to open the lost node's rank",
        lambda: "waits for an agent to register in its place" in logs[0].read_text(),
        logs,
    )
    agent(logs[3])
    grown_at = len(_progress(out))
    _wait("training on two nodes again", lambda: sum(1 for _, w in _progress(out)[grown_at:] if w == 2) >= 5, logs)

    # Both resizes resumed from memory: the kept node's worker, renumbered rank 0, from the
    # snapshot it saved as rank 1; node c's new worker from that copy, sent over the process group.
    resumes = _resumes(out)
    first, *later = [r for r in resumes if r["source"] != "none"]
    assert (first["world"], first["rank"], first["source"]) == (1, 0, "memory"), resumes
    assert ".r1.s" in first["detail"], resumes
    grown = [r for r in later if r["world"] == 2]
    assert {r["source"] for r in grown} == {"memory"}, resumes
    assert any(r["rank"] == 1 and r["detail"].endswith("received from rank 0") for r in grown), resumes
    # Every step trained, before and after each resize, holds exactly the weights a fault-free run
    # has after that step: no step lost or trained twice from another state, nothing diverged.
    rows = _weights(out)
    expected = _fault_free_weights(max(rows))
    assert {step: expected[step] for step in rows} == rows
    assert max(rows) > first["step"]
    # Each agent has shared memory of its own, as separate hosts do; the kept node removed what it
    # saved as rank 1 once its renumbered worker had a snapshot of its own.
    kept_log = logs[1] if kept is a else logs[2]
    assert "snapshot files of ranks this node no longer runs" in kept_log.read_text()
    # The kept node's collective broke at the kill, seconds before the master could know why (the lost
    # node's heartbeat timeout): its failure waited for that cause and was charged to nobody.
    master_log = logs[0].read_text()
    assert "no peer's failure explains" not in master_log
    assert "is the consequence of node" in master_log or "in a round that was already over" in master_log
    assert kept.poll() is None
    assert master.poll() is None


def test_a_node_joining_a_running_job_charges_nobody_for_the_collective_errors_of_the_round_it_breaks(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """Node a's agent sees the joining node first and restarts its workers for the new round; node
    b's workers, in a collective with a's, fail before b's agent sees the joining node itself (its
    next heartbeat is due after the test ends, and it does not check between). a said why before
    its workers stopped, so b's report is that restart's consequence: restarted, charged to
    nobody; a job that may take no failure goes on."""
    out, token_file, port = _job_files(tmp_path, TRAIN)
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=external", "--nnodes=2:3", f"--port={port}",
        f"--token-file={token_file}", "--heartbeat-interval-s=0.5", "--heartbeat-timeout-s=600",
        "--rdzv-last-call-s=5", "--rdzv-heartbeat-timeout-s=600", "--node-start-timeout-s=0",
        "--max-job-failures=0", f"--state-dir={tmp_path / 'state'}",
    ]  # fmt: skip
    logs = [tmp_path / "master.log", tmp_path / "agent_a.log", tmp_path / "agent_b.log", tmp_path / "agent_c.log"]
    master = _start(procs, master_cmd, logs[0])

    def agent(log: Path, *flags: str) -> subprocess.Popen[str]:
        cmd = [
            sys.executable, "-m", "dlrover.launcher.cli", f"--master=127.0.0.1:{port}", f"--token-file={token_file}",
            "--nnodes=2:3", "--nproc-per-node=1", "--local-addr=127.0.0.1", "--max-restarts=3",
            "--monitor-interval=0.1", f"--log-dir={tmp_path / 'logs' / log.stem}", *flags,
            str(tmp_path / "train.py"), str(out), "2000",
        ]  # fmt: skip
        return _start(procs, cmd, log)

    agent(logs[1], "--heartbeat-interval=0.5")
    agent(logs[2], "--heartbeat-interval=300", "--waiting-check-interval=0")
    _wait("training on two nodes", lambda: sum(1 for _, w in _progress(out) if w == 2) >= 3, logs)
    agent(logs[3], "--heartbeat-interval=0.5")
    _wait("training on three nodes", lambda: sum(1 for _, w in _progress(out) if w == 3) >= 3, logs)

    events = read_event_log(tmp_path / "state" / "events.jsonl")
    failures = [e["message"] for e in events if e["kind"] == "failure"]
    assert failures == [], failures
    consequences = [e for e in events if e["kind"] == "consequence_restart"]
    assert consequences, [e["kind"] for e in events]  # b's report came, and was taken for the consequence
    for event in consequences:
        assert "its workers stop for a new round: 1 node(s) wait to join" in event["data"]["cause"], event
    assert master.poll() is None


def test_training_goes_on_while_the_master_is_killed_and_restarted(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out, token_file, port = _job_files(tmp_path, TRAIN)
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=external", "--nnodes=1", f"--port={port}",
        f"--token-file={token_file}", f"--state-dir={tmp_path / 'state'}", "--heartbeat-interval-s=0.5",
        "--heartbeat-timeout-s=20", "--rdzv-last-call-s=1", "--rdzv-heartbeat-timeout-s=20",
        "--node-start-timeout-s=0",
    ]  # fmt: skip
    logs = [tmp_path / "master1.log", tmp_path / "agent.log", tmp_path / "master2.log"]
    master = _start(procs, master_cmd, logs[0])
    agent_cmd = [
        sys.executable, "-m", "dlrover.launcher.cli", f"--master=127.0.0.1:{port}", f"--token-file={token_file}",
        "--nnodes=1", "--nproc-per-node=2", "--local-addr=127.0.0.1", "--max-restarts=0",
        "--monitor-interval=0.1", "--heartbeat-interval=0.5", f"--log-dir={tmp_path / 'logs'}",
        str(tmp_path / "train.py"), str(out), "400",
    ]  # fmt: skip
    agent = _start(procs, agent_cmd, logs[1])
    _wait("training", lambda: len(_progress(out)) >= 5, logs)
    workers = sorted(_children(agent.pid))
    assert len(workers) == 2

    master.kill()
    master.wait()
    killed_at = len(_progress(out))
    _wait("training without a master", lambda: len(_progress(out)) >= killed_at + 5, logs)
    _start(procs, master_cmd, logs[2])
    resumed_at = len(_progress(out))
    _wait("training after the master came back", lambda: len(_progress(out)) >= resumed_at + 10, logs)

    # The restarted master hears the same node again: running, heartbeats fresh, no relaunch.
    def heard_again() -> bool:
        with MasterClient(f"127.0.0.1:{port}", token_file.read_text()) as client:
            (node,) = client.job_status().nodes
        return node.state == "running" and node.seconds_since_heartbeat < 2.0 and node.relaunch_count == 0

    time.sleep(3.0)  # longer than the heartbeat interval: stale state would show by now
    _wait("the agent heartbeating the restarted master", heard_again, logs, timeout_s=30)
    # The same worker processes trained throughout: no restart was needed.
    assert sorted(_children(agent.pid)) == workers
    assert agent.poll() is None
    assert "unreachable" in logs[1].read_text()
    assert "restart" not in logs[1].read_text().lower().replace("restart(s)", "")


# Data from the master's shard service, exactly once. The model's gradient does not depend on
# its weights and the data are integers in float64, so the final weights are exact and depend
# only on which samples were trained how often: any sample lost or trained twice changes them.
SHARD_TRAIN = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from dlrover.common import load_token
    from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient, ShardClientConfig

    out, num_samples = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    client = ShardClient(
        os.environ["DLROVER_MASTER_ADDR"], load_token(), "samples", f"rank-{rank}",
        # On demand, as the GPT example: every rank leases one shard a step.
        config=ShardClientConfig(prefetch_shards=0),
    )
    client.register(DatasetSpec(
        name="samples", source=IndexSource(num_samples), batch_size=4, batches_per_shard=1,
        shuffle=True, seed=7, delivery=DeliveryMode.EXACTLY_ONCE,
    ))
    weights = torch.zeros(4, dtype=torch.float64)
    step = 0
    while True:
        shard = client.next_shard()
        have = torch.tensor([0 if shard is None else 1])
        dist.all_reduce(have, op=dist.ReduceOp.MIN)
        if have.item() == 0:
            break
        samples = shard.remaining_samples()
        grad = torch.tensor([[s, s % 7, s % 3, 1] for s in samples], dtype=torch.float64).sum(0)
        dist.all_reduce(grad)
        weights -= grad
        time.sleep(0.2)  # the step's compute: the shard stays leased meanwhile
        client.report_done(shard.shard_id)
        step += 1
        with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "pid": os.getpid(), "samples": samples}) + "\\n")
        if rank == 0:
            with open(os.path.join(out, "progress.log"), "a") as f:
                f.write(f"{step} {world} {os.getpid()}\\n")
    client.close()
    if rank == 0:
        with open(os.path.join(out, "final.json"), "w") as f:
            json.dump(weights.tolist(), f)
    dist.destroy_process_group()
    """
)


def test_a_master_killed_and_restarted_mid_training_restarts_no_worker_and_loses_no_sample(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """Two external agents train from the shard service; the master is SIGKILLed and started again."""
    out, token_file, port = _job_files(tmp_path, SHARD_TRAIN)
    num_samples = 160  # 40 shards of one batch: 20 steps of two ranks
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=external", "--nnodes=2", f"--port={port}",
        f"--token-file={token_file}", f"--state-dir={tmp_path / 'state'}", "--heartbeat-interval-s=0.5",
        "--heartbeat-timeout-s=30", "--rdzv-last-call-s=1", "--rdzv-heartbeat-timeout-s=30",
        "--node-start-timeout-s=0",
    ]  # fmt: skip
    logs = [tmp_path / "master1.log", tmp_path / "agent_a.log", tmp_path / "agent_b.log", tmp_path / "master2.log"]
    master = _start(procs, master_cmd, logs[0])
    agents = []
    for name, log in (("a", logs[1]), ("b", logs[2])):
        agent_cmd = [
            sys.executable, "-m", "dlrover.launcher.cli", f"--master=127.0.0.1:{port}", f"--token-file={token_file}",
            "--nnodes=2", "--nproc-per-node=1", "--local-addr=127.0.0.1", "--max-restarts=0",
            "--monitor-interval=0.1", "--heartbeat-interval=0.5", f"--log-dir={tmp_path / f'logs_{name}'}",
            str(tmp_path / "train.py"), str(out), str(num_samples),
        ]  # fmt: skip
        agents.append(_start(procs, agent_cmd, log))
    _wait("training", lambda: len(_progress(out)) >= 5, logs)
    master.kill()
    master.wait()
    killed_at = len(_progress(out))
    # Down longer than the default retry policy's 30 s budget of five attempts would have lasted
    # in a retry storm, and long enough for the workers to run into it.
    time.sleep(8.0)
    _start(procs, master_cmd, logs[3])
    _all_succeed(agents, logs[1:3])

    rows = [json.loads(line) for rank in (0, 1) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
    trained = sorted(sample for row in rows for sample in row["samples"])
    assert trained == list(range(num_samples)), "every sample trained exactly once across the master restart"
    for rank in (0, 1):
        pids = {json.loads(line)["pid"] for line in (out / f"rank{rank}.jsonl").read_text().splitlines()}
        assert len(pids) == 1, f"rank {rank} ran in processes {sorted(pids)}: a worker was restarted"
    assert len(_progress(out)) > killed_at, "training went on after the master came back"
    # What a run without the kill ends with: every sample's gradient summed once.
    features = [[s, s % 7, s % 3, 1] for s in range(num_samples)]
    expected = [-float(sum(column)) for column in zip(*features, strict=True)]
    assert json.loads((out / "final.json").read_text()) == expected
    for log in logs[1:3]:
        text = log.read_text()
        assert "unreachable" in text, text[-3000:]
        assert "finished with exit code 0 after 0 restart(s)" in text, text[-3000:]
    # The shard state came back as the journal holds it: a base and the change lines after it, replayed.
    resumed = re.search(r"shard state resumed: 1 dataset\(s\) from base \d+ and (\d+) change\(s\)", logs[3].read_text())
    assert resumed is not None, logs[3].read_text()[-3000:]
    assert int(resumed.group(1)) > 0, resumed.group(0)


def _run_two_local_nodes(
    procs: list[subprocess.Popen[str]], tmp_path: Path, script: str, *script_args: str, agent_flags: str = ""
) -> tuple[Path, Path]:
    """Run `script` (written to ``tmp_path/train.py``, given the output folder and `script_args`) as a job of
    two one-process nodes under `dlrover-master --backend local`, to its successful end; the output folder
    and the master's log."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "train.py").write_text(script)
    agent = (
        f"{sys.executable} -m dlrover.launcher.cli --nnodes=2 --nproc-per-node=1 --local-addr=127.0.0.1 "
        f"--monitor-interval=0.1 --heartbeat-interval=0.5 {agent_flags} {tmp_path / 'train.py'} {out} "
        + " ".join(script_args)
    )
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=2", f"--agent-command={agent}",
        f"--state-dir={tmp_path / 'state'}", "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=1",
    ]  # fmt: skip
    log = tmp_path / "master.log"
    master = _start(procs, master_cmd, log)
    master.wait(timeout=300)
    assert master.returncode == 0, log.read_text()[-4000:]
    return out, log


def test_a_master_with_the_local_backend_runs_dlrover_run_agents_to_the_end(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out, _ = _run_two_local_nodes(procs, tmp_path, TRAIN, "10")
    progress = _progress(out)
    assert progress[-1][0] == 10
    assert {w for _, w in progress} == {2}


# Rank 0 evaluates alone after step 10, in the `eval` phase, for longer than the ranks' hang window; rank 1, on
# the other node, waits at the next barrier in `train`. Each rank writes down the attempts it ran in.
EVALUATES_ALONE = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from dlrover.diagnosis import StepReporter

    out, eval_s = sys.argv[1], float(sys.argv[2])
    reporter = StepReporter.from_env()
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with open(os.path.join(out, f"attempts-{rank}.log"), "a") as f:
        f.write(f"{attempt}\\n")
    dist.init_process_group("gloo")
    t = torch.ones(1)
    for step in range(1, 21):
        dist.all_reduce(t)
        time.sleep(0.1)
        reporter.step(step, samples=1)
        if step == 10:
            if rank == 0:
                reporter.phase("eval")
                time.sleep(eval_s)
                reporter.phase("train")
            dist.barrier()
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_ranks_of_another_node_waiting_for_a_rank_that_evaluates_alone_are_not_hung(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The evaluating rank's node relays its phase through the master: the waiting node's agent, whose own
    ranks are all in `train`, does not call them hung."""
    window_s, eval_s = 4, 14  # the waiting rank is quiet 3.5 x its window
    flags = f"--hang-timeout=0 --hang-step-floor={window_s} --max-restarts=1"
    out, log = _run_two_local_nodes(procs, tmp_path, EVALUATES_ALONE, str(eval_s), agent_flags=flags)
    failures = [e["message"] for e in read_event_log(tmp_path / "state" / "events.jsonl") if e["kind"] == "failure"]
    assert failures == [], failures
    for rank in (0, 1):
        assert (out / f"attempts-{rank}.log").read_text().split() == ["0"], log.read_text()[-4000:]


@pytest.mark.parametrize("form", ["c10d", "static"])
def test_a_torchrun_multi_node_command_line_runs_with_one_agent_serving_the_master(
    tmp_path: Path, procs: list[subprocess.Popen[str]], form: str
) -> None:
    out, token_file, port = _job_files(tmp_path, TRAIN)
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    agents = []
    for node in (0, 1):
        meet = (
            ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=job1"]
            if form == "c10d"
            else ["--master-addr=127.0.0.1", f"--master-port={port}", f"--node-rank={node}"]
        )
        cmd = [
            sys.executable, "-m", "dlrover.launcher.cli", "--nnodes=2", "--nproc-per-node=1", *meet,
            f"--token-file={token_file}", "--local-addr=127.0.0.1", "--monitor-interval=0.1",
            "--heartbeat-interval=0.5", f"--log-dir={tmp_path / 'logs' / str(node)}",
            str(tmp_path / "train.py"), str(out), "10",
        ]  # fmt: skip
        agents.append(_start(procs, cmd, logs[node]))
    _all_succeed(agents, logs)
    progress = _progress(out)
    assert progress[-1][0] == 10
    assert {w for _, w in progress} == {2}
    serving = [log for log in logs if "serving the job's master" in log.read_text()]
    assert len(serving) == 1, [log.read_text()[-2000:] for log in logs]
    if form == "static":
        assert serving == [logs[0]]  # node rank 0 serves it, as it would torchrun's store


def test_srun_with_no_rendezvous_flags_runs_one_job_across_the_steps_nodes(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # What `srun -N2 dlrover-run --nproc-per-node=1 --token-file=... train.py` gives each agent:
    # the step's variables, and nothing on the command line about nodes or where they meet.
    out, token_file, port = _job_files(tmp_path, TRAIN)
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    agents = []
    for node in (0, 1):
        step = {
            "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "3",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_NODEID": str(node),
            "SLURM_STEP_NODELIST": "localhost,localhost",
        }
        cmd = [
            sys.executable, "-m", "dlrover.launcher.cli", "--nproc-per-node=1", f"--master-port={port}",
            f"--token-file={token_file}", "--local-addr=127.0.0.1", "--monitor-interval=0.1",
            "--heartbeat-interval=0.5", f"--log-dir={tmp_path / 'logs' / str(node)}",
            str(tmp_path / "train.py"), str(out), "10",
        ]  # fmt: skip
        agents.append(_start(procs, cmd, logs[node], step))
    _all_succeed(agents, logs)
    progress = _progress(out)
    assert progress[-1][0] == 10
    assert {w for _, w in progress} == {2}  # one job of two nodes, not two single-node jobs
    for node, log in enumerate(logs):
        assert f"srun step 77.3 of 2 nodes: this is node {node}" in log.read_text()
        assert [p.name.split("_")[0] for p in (tmp_path / "logs" / str(node)).iterdir()] == ["77.3"]
    serving = [log for log in logs if "serving the job's master" in log.read_text()]
    assert serving == [logs[0]]  # the step's first node


# Records each worker's torchrun variables and what the process group it formed says.
UNEVEN = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist

    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "ROLE_WORLD_SIZE")
    record = {k: int(os.environ[k]) for k in keys}
    dist.init_process_group("gloo")
    ranks = torch.tensor([float(record["RANK"])])
    dist.all_reduce(ranks)
    record.update(rank_sum=ranks.item(), dist_rank=dist.get_rank(), dist_world=dist.get_world_size())
    dist.destroy_process_group()
    with open(os.path.join(sys.argv[1], f"rank{record['RANK']}.json"), "w") as f:
        json.dump(record, f)
    """
)


def test_nodes_with_different_nproc_per_node_get_torchruns_ranks_and_one_world(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # As torchrun: ranks follow each node's own worker count in node-rank order, WORLD_SIZE is the sum.
    out, token_file, port = _job_files(tmp_path, UNEVEN)
    logs = [tmp_path / "two.log", tmp_path / "one.log"]
    agents = []
    for nproc, log in zip((2, 1), logs, strict=True):
        cmd = [
            sys.executable, "-m", "dlrover.launcher.cli", "--nnodes=2", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=uneven",
            f"--token-file={token_file}", "--local-addr=127.0.0.1", "--monitor-interval=0.1",
            "--heartbeat-interval=0.5", "--prewarm=none", f"--log-dir={tmp_path / 'logs' / log.stem}",
            str(tmp_path / "train.py"), str(out),
        ]  # fmt: skip
        agents.append(_start(procs, cmd, log))
    _all_succeed(agents, logs)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert sorted(r["RANK"] for r in records) == [0, 1, 2], records
    for r in records:
        assert (r["WORLD_SIZE"], r["dist_world"], r["dist_rank"], r["rank_sum"]) == (3, 3, r["RANK"], 3.0), r
        assert (r["ROLE_RANK"], r["ROLE_WORLD_SIZE"]) == (r["RANK"], 3), r
        assert r["GROUP_WORLD_SIZE"] == 2, r
    # Each node's workers hold contiguous ranks after those of the node ranked before it.
    nodes: dict[int, list[dict[str, int]]] = {}
    for r in records:
        nodes.setdefault(r["GROUP_RANK"], []).append(r)
    assert sorted(len(members) for members in nodes.values()) == [1, 2]
    first = 0
    for group_rank in (0, 1):
        members = sorted(nodes[group_rank], key=lambda r: r["LOCAL_RANK"])
        assert [r["RANK"] for r in members] == [first + r["LOCAL_RANK"] for r in members], records
        assert {r["LOCAL_WORLD_SIZE"] for r in members} == {len(members)}, records
        first += len(members)


def test_a_torchrun_multi_node_command_line_without_a_token_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "noop.py"
    script.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_")}
    cmd = [
        sys.executable, "-m", "dlrover.launcher.cli", "--nnodes=2", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}", str(script),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "give every node the same job token" in done.stderr
