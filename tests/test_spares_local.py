"""Warm spares on the local backend: real master, real agents, real training processes.

A job of two ranked nodes keeps one spare (`dlrover-master --spare-nodes 1`): an agent that is
registered, has its standby workers imported and holds no rank. A worker is killed first (the
in-place restart, for comparison); then one ranked node is killed outright (its agent's process
group and every worker's, SIGKILL). The spare takes the node's rank at the next round, its workers
receive the training state from a peer's flash checkpoint in memory, the job resumes from the step
it had reached with no sample lost or trained twice, and the backend launches a new spare.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlrover.common import generate_token, write_token_file
from dlrover.master import read_event_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# Exactly-once data from the master's shard service and a model whose final weights do not depend on
# how samples are grouped into steps (w -= the sum of each sample's features, float64 integers). Every
# step is saved as a replicated flash checkpoint with the data position, so a restart resumes exactly
# where the newest snapshot every node can see stands: the final weights equal those of a run that
# never failed.
TRAIN = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from dlrover.common import load_token
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig
    from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient, ShardClientConfig

    DOC_BYTES = 8192
    out, num_samples = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node = os.environ["DLROVER_NODE_ID"]
    with open(os.path.join(out, f"pid-node{node}-rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    dist.init_process_group("gloo")
    client = ShardClient(
        os.environ["DLROVER_MASTER_ADDR"], load_token(), "samples", f"rank-{rank}",
        config=ShardClientConfig(prefetch_shards=0),
    )
    client.register(DatasetSpec(
        name="samples", source=IndexSource(num_samples), batch_size=4, batches_per_shard=1,
        shuffle=True, seed=7, delivery=DeliveryMode.EXACTLY_ONCE,
    ))
    ckpt = FlashCheckpointer(
        StagerConfig(job_id="spares", run_id="e2e", rank=rank, world_size=world),
        os.path.join(out, "ckpt"), replicated=True,
    )
    try:
        loaded = ckpt.load()
        weights, step = loaded.state["weights"].clone(), int(loaded.state["step"])
        doc = bytes(loaded.state["data"][: int(loaded.state["data_len"])].tolist()).decode()
        source, detail = loaded.source, loaded.detail
        if rank == 0:
            client.restore(doc)  # the data position the weights were trained to
    except NoCheckpointError:
        weights, step, source, detail = torch.zeros(4, dtype=torch.float64), 0, "none", ""
    dist.barrier()  # nobody fetches before the data position is restored
    with open(os.path.join(out, "resumed.jsonl"), "a") as f:
        row = {"rank": rank, "world": world, "step": step, "source": source, "detail": detail, "node": node,
               "time": time.time()}
        f.write(json.dumps(row) + "\\n")

    def pace() -> float:
        try:
            with open(os.path.join(out, "pace")) as f:
                return float(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    data = torch.zeros(DOC_BYTES, dtype=torch.uint8)
    data_len = torch.zeros(1, dtype=torch.int64)
    while True:
        try:
            shard, waiting = client.next_shard(timeout_s=2.0), 0
        except TimeoutError:
            shard, waiting = None, 1
        busy = torch.tensor([0 if shard is None and not waiting else 1])
        dist.all_reduce(busy, op=dist.ReduceOp.MAX)
        if busy.item() == 0:
            break  # every rank was told the dataset is finished
        samples = [] if shard is None else shard.remaining_samples()
        grad = torch.tensor([[s, s % 7, s % 3, 1] for s in samples] or [[0, 0, 0, 0]], dtype=torch.float64).sum(0)
        dist.all_reduce(grad)
        weights -= grad
        time.sleep(pace())
        if shard is not None:
            client.report_done(shard.shard_id)
        dist.barrier()  # every rank's acknowledgement is in before the data position is taken
        step += 1
        if rank == 0:
            raw = client.checkpoint().encode()
            assert len(raw) <= DOC_BYTES, len(raw)
            data.zero_()
            data[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
            data_len[0] = len(raw)
            with open(os.path.join(out, "progress.log"), "a") as f:
                f.write(f"{step} {world} {time.time()}\\n")
        dist.broadcast(data, 0)
        dist.broadcast(data_len, 0)
        ckpt.save(step, {"weights": weights, "step": step, "data": data, "data_len": data_len})
    client.close()
    ckpt.close(job_end=rank == 0)
    if rank == 0:
        with open(os.path.join(out, "final.json"), "w") as f:
            json.dump(weights.tolist(), f)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(procs: list[subprocess.Popen[str]], cmd: list[str], log: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_JOB_TOKEN", "SLURM_"))}
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            cmd, cwd=log.parent, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    procs.append(proc)
    return proc


def _progress(out: Path) -> list[tuple[int, int, float]]:
    path = out / "progress.log"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(r[0]), int(r[1]), float(r[2])) for r in rows if len(r) == 3]


def _resumes(out: Path) -> list[dict[str, Any]]:
    path = out / "resumed.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _logs(state: Path, master_log: Path) -> str:
    parts = [f"--- master\n{master_log.read_text()[-5000:]}"]
    for log in sorted((state / "logs").glob("node-*.log")) if (state / "logs").exists() else []:
        parts.append(f"--- {log.name}\n{log.read_text()[-2500:]}")
    return "\n".join(parts)


def _wait(what: str, condition: Callable[[], bool], dump: Callable[[], str], timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{dump()}")
        time.sleep(0.2)


def _events(state: Path) -> list[dict[str, Any]]:
    path = state / "events.jsonl"
    return read_event_log(path) if path.exists() else []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlrover.master.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _agent_of(master: subprocess.Popen[str], node_id: int) -> psutil.Process:
    """The agent the local backend started for `node_id` (found by the node id in its environment)."""
    for proc in psutil.Process(master.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "dlrover.launcher.cli" in " ".join(proc.cmdline()) and proc.environ().get("DLROVER_NODE_ID") == str(
                node_id
            ):
                return proc
    raise AssertionError(f"no agent process for node {node_id}")


def _kill_outright(agent: psutil.Process) -> None:
    """SIGKILL the agent's process group and the group of every process under it (workers lead their own)."""
    groups = {os.getpgid(agent.pid)}
    for child in agent.children(recursive=True):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            groups.add(os.getpgid(child.pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def test_a_spare_takes_the_rank_of_a_node_killed_outright_and_a_new_spare_is_launched(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    (tmp_path / "train.py").write_text(TRAIN)
    (out / "pace").write_text("0.3")
    token_file = write_token_file(tmp_path / "token", generate_token())
    port = _free_port()
    num_samples = 6000  # 1,500 shards of 4 samples
    agent = (
        f"{sys.executable} -m dlrover.launcher.cli --nnodes=2 --nproc-per-node=2 --local-addr=127.0.0.1 "
        f"--max-restarts=3 --monitor-interval=0.1 --heartbeat-interval=0.5 {tmp_path / 'train.py'} {out} "
        f"{num_samples}"
    )
    # Three slots: two ranked nodes, then the spare. The killed node's slot goes to the next spare.
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=2", "--spare-nodes=1",
        "--capacity=3", f"--port={port}", f"--token-file={token_file}", f"--state-dir={state}",
        f"--agent-command={agent}", "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=2", "--node-stop-grace-s=5",
        "--max-job-failures=40",
    ]  # fmt: skip
    master_log = tmp_path / "master.log"
    master = _start(procs, master_cmd, master_log)
    address = ["--master", f"127.0.0.1:{port}", "--token-file", str(token_file)]

    def dump() -> str:
        return _logs(state, master_log)

    def running(node_id: int) -> bool:
        return any(
            e["kind"] == "node_state" and e["node_id"] == node_id and e["data"]["to"] == "running"
            for e in _events(state)
        )

    _wait("training on two nodes (4 workers)", lambda: len(_progress(out)) >= 3, dump)
    spare_id = 2  # nodes 0 and 1 take ranks 0 and 1; the spare comes after them
    _wait("the spare registered", lambda: running(spare_id), dump)
    status = _cli("status", *address)
    assert "spares: 1 ready of 1 kept" in status.stdout, status.stdout + status.stderr
    spare_rows = [line.split() for line in status.stdout.splitlines() if line.strip().startswith("spare ")]
    assert [(row[1], row[2]) for row in spare_rows] == [(str(spare_id), "running")], status.stdout

    # Each fault comes once training has settled (the standbys refilled after the last start), so the two
    # times to train again compare like with like on this shared machine.
    settled = len(_progress(out)) + 20
    _wait("training to settle", lambda: len(_progress(out)) >= settled, dump)

    # An in-place restart first (one worker killed; its agent restarts the node's workers), for comparison.
    before = len(_progress(out))
    worker_pid = int(max(out.glob("pid-node0-rank*"), key=lambda p: p.stat().st_mtime).read_text())
    killed_worker_at = time.time()
    os.kill(worker_pid, signal.SIGKILL)
    _wait("training again after the in-place restart", lambda: len(_progress(out)) >= before + 3, dump)
    in_place_s = next(t for _, _, t in _progress(out)[before:] if t > killed_worker_at) - killed_worker_at

    settled = len(_progress(out)) + 20
    _wait("training to settle", lambda: len(_progress(out)) >= settled, dump)

    # Node 1 (logical rank 1) killed outright: its agent and every worker, no report, no goodbye.
    before = len(_progress(out))
    victim = _agent_of(master, 1)
    killed_node_at = time.time()
    _kill_outright(victim)
    _wait("training again with the spare in the killed node's place", lambda: len(_progress(out)) >= before + 3, dump)
    spare_s = next(t for _, _, t in _progress(out)[before:] if t > killed_node_at) - killed_node_at

    def new_spare() -> int | None:
        created = [e["node_id"] for e in _events(state) if e["kind"] == "node_created" and e["data"].get("spare")]
        return next((n for n in created if n > spare_id), None)

    _wait("a new spare launched", lambda: new_spare() is not None, dump)
    _wait("the new spare registered", lambda: running(new_spare() or -1), dump)
    status = _cli("status", *address)
    assert "spares: 1 ready of 1 kept" in status.stdout, status.stdout + status.stderr
    assert f"   1  {spare_id:>5}  running" in status.stdout, status.stdout  # rank 1 is the promoted spare

    (out / "pace").write_text("0")
    master.wait(timeout=300)
    assert master.returncode == 0, dump()
    print(f"\ntime to train again: in-place restart {in_place_s:.1f} s; node killed, spare took over {spare_s:.1f} s")

    features = [[s, s % 7, s % 3, 1] for s in range(num_samples)]
    expected = [-float(sum(column)) for column in zip(*features, strict=True)]
    assert json.loads((out / "final.json").read_text()) == expected, "a sample was lost or trained twice"

    events = _events(state)
    promoted = [e for e in events if e["kind"] == "spare_promoted"]
    assert len(promoted) == 1, [e["message"] for e in promoted]
    data = promoted[0]["data"]
    assert (data["spare"], data["rank"], data["replaces"]) == (spare_id, 1, 1), promoted[0]
    assert "no heartbeat" in data["reason"] or "exited" in data["reason"], data["reason"]
    relaunches = [e for e in events if e["kind"] == "relaunch"]
    assert [(e["node_id"], e["data"]["replacement"], e["data"]["spare"]) for e in relaunches] == [(1, spare_id, True)]
    spares = [e["node_id"] for e in events if e["kind"] == "node_created" and e["data"].get("spare")]
    assert len(spares) == 2, spares
    assert spares[0] == spare_id, spares
    assert spares[1] > spare_id, spares
    # The spare never trained before it took the rank: every round had two nodes (4 workers), and no
    # resize grew the job into it.
    resumes = _resumes(out)
    assert {r["world"] for r in resumes} == {4}, resumes
    assert not [e for e in events if e["kind"] in ("resize", "resize_target")]
    # It resumed from the step the job had reached: its workers received it from a peer's memory.
    after_kill = [r for r in resumes if r["time"] > killed_node_at]
    from_spare = [r for r in after_kill if r["node"] == str(spare_id)]
    assert len(from_spare) == 2, after_kill
    assert all(r["source"] == "memory" and "received from rank" in r["detail"] for r in from_spare), from_spare
    steps_before_kill = [s for s, _, t in _progress(out) if t < killed_node_at]
    assert {r["step"] for r in after_kill} == {after_kill[0]["step"]}, after_kill
    assert after_kill[0]["step"] >= max(steps_before_kill) - 1, (after_kill, steps_before_kill[-3:])
