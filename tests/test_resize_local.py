"""Resizing a running job on the local backend: real master, real agents, real training processes.

The local backend's capacity is changed while the job runs (`dlrover-master capacity` and the
`--capacity-file`); the master grows the job into new room, shrinks it when room is lost, and
stops it when it stays below its minimum past the window.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlrover.common import generate_token, write_token_file
from dlrover.master import read_event_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# Exactly-once data from the master's shard service and a model whose final weights do not depend
# on how samples are grouped into steps: w -= sum of each sample's features, float64 integers. The
# data position is saved with the weights in the flash checkpoint (replicated: every rank holds the
# same state) and restored with them, so a restart at any moment loses or repeats no sample: the
# final weights equal those of a run that never resized. Checkpoints are taken at step 1, every
# SAVE_EVERY steps, and whenever the agent asks for one before a planned round or before it stops
# a leaving node (`save_requested`, agreed across ranks); once a save answered the request
# (`round_pending`: the requested one, or a periodic one that began after the request) the workers
# wait to be restarted or stopped, so no step trained after it can be lost to the restart.
TRAIN = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import torch, torch.distributed as dist
    from dlrover.common import load_token
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig
    from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient, ShardClientConfig

    DOC_BYTES = 8192
    SAVE_EVERY = 5
    out, num_samples = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
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
        StagerConfig(job_id="resize", run_id="e2e", rank=rank, world_size=world),
        os.path.join(out, "ckpt"), replicated=True,
    )
    try:
        loaded = ckpt.load()
        weights, step = loaded.state["weights"].clone(), int(loaded.state["step"])
        doc = bytes(loaded.state["data"][: int(loaded.state["data_len"])].tolist()).decode()
        source = loaded.source
        if rank == 0:
            client.restore(doc)  # the data position the weights were trained to
    except NoCheckpointError:
        weights, step, source = torch.zeros(4, dtype=torch.float64), 0, "none"
    dist.barrier()  # nobody fetches before the data position is restored
    with open(os.path.join(out, "resumed.jsonl"), "a") as f:
        f.write(json.dumps({"rank": rank, "world": world, "step": step, "source": source}) + "\\n")

    def pace() -> float:
        try:
            with open(os.path.join(out, "pace")) as f:
                return float(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    data = torch.zeros(DOC_BYTES, dtype=torch.uint8)
    data_len = torch.zeros(1, dtype=torch.int64)
    while True:
        # At the tail fewer shards remain than ranks: a rank that gets none in time (the others
        # hold the last ones) adds nothing to this step and asks again at the next.
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
        flag = torch.tensor([int(ckpt.save_requested())])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        requested = bool(flag.item())
        if rank == 0:  # before the save: once it is sealed the agent may stop us for the round
            with open(os.path.join(out, "progress.log"), "a") as f:
                f.write(f"{step} {world} {int(requested)}\\n")
        if requested or step == 1 or step % SAVE_EVERY == 0:
            if rank == 0:
                raw = client.checkpoint().encode()
                assert len(raw) <= DOC_BYTES, len(raw)
                data.zero_()
                data[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
                data_len[0] = len(raw)
            dist.broadcast(data, 0)
            dist.broadcast(data_len, 0)
            ckpt.save(step, {"weights": weights, "step": step, "data": data, "data_len": data_len})
        if ckpt.round_pending():  # a save answered the agent: it restarts us for the round
            if world == 6:
                # Once saved, workers slow to stop, 3 s more on each node rank: whichever node the
                # shrink lets go, the agent of one node that stays joins the shrunk round 3 s or
                # more after the other's, past the last call, and the planned round waits for it
                # (the master gives a leaving node --node-stop-grace-s=20 for its 6 s at most).
                stop_s = 3.0 * int(os.environ["DLROVER_NODE_RANK"])
                signal.signal(signal.SIGTERM, lambda *_: (time.sleep(stop_s), os._exit(143)))
            held_until = time.monotonic() + 120
            while time.monotonic() < held_until:
                time.sleep(0.1)
    client.close()
    ckpt.close(job_end=rank == 0)
    if rank == 0:
        with open(os.path.join(out, "final.json"), "w") as f:
            json.dump(weights.tolist(), f)
    dist.destroy_process_group()
    """
)

# Steps paced by the same file, and nothing else: for the test of a job that falls below its minimum.
PLAIN_TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist

    out = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    step = 0
    while step < 100000:
        t = torch.ones(1)
        dist.all_reduce(t)
        step += 1
        if rank == 0:
            with open(os.path.join(out, "progress.log"), "a") as f:
                f.write(f"{step} {world} 0\\n")
        time.sleep(0.2)
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


def _progress(out: Path) -> list[tuple[int, int]]:
    path = out / "progress.log"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(r[0]), int(r[1])) for r in rows if len(r) == 3]


def _logs(state: Path, master_log: Path) -> str:
    parts = [f"--- master\n{master_log.read_text()[-4000:]}"]
    for log in sorted((state / "logs").glob("node-*.log")) if (state / "logs").exists() else []:
        parts.append(f"--- {log.name}\n{log.read_text()[-2500:]}")
    return "\n".join(parts)


def _rounds(state: Path) -> set[int]:
    """The rendezvous rounds the agents trained or started to train in (from their logs)."""
    return {
        int(m.group(1))
        for log in sorted((state / "logs").glob("node-*.log"))
        for m in re.finditer(r"round (\d+): node rank \d+ of \d+", log.read_text())
    }


def _wait(what: str, condition: Callable[[], bool], dump: Callable[[], str], timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{dump()}")
        time.sleep(0.2)


def _steps_at(out: Path, world: int, after: int = 0) -> int:
    return sum(1 for _, w in _progress(out)[after:] if w == world)


def _events(state: Path) -> list[dict[str, Any]]:
    # read_event_log skips a line the running master is still writing.
    path = state / "events.jsonl"
    return read_event_log(path) if path.exists() else []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlrover.master.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _agent_command(train: Path, nnodes: str, *args: str) -> str:
    return (
        f"{sys.executable} -m dlrover.launcher.cli --nnodes={nnodes} --nproc-per-node=2 --local-addr=127.0.0.1 "
        f"--max-restarts=3 --monitor-interval=0.1 --heartbeat-interval=0.5 {train} {' '.join(args)}"
    )


def test_capacity_grows_and_shrinks_a_running_job_and_the_weights_equal_a_run_that_never_resized(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    (tmp_path / "train.py").write_text(TRAIN)
    (out / "pace").write_text("0.3")
    token_file = write_token_file(tmp_path / "token", generate_token())
    capacity_file = tmp_path / "capacity"
    port = _free_port()
    num_samples = 6000  # 1,500 shards of 4 samples
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=1:3", f"--port={port}",
        f"--token-file={token_file}", f"--state-dir={state}", "--capacity=1", f"--capacity-file={capacity_file}",
        f"--agent-command={_agent_command(tmp_path / 'train.py', '1:3', str(out), str(num_samples))}",
        "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=2", "--node-stop-grace-s=20", "--max-job-failures=40",
    ]  # fmt: skip
    master_log = tmp_path / "master.log"
    master = _start(procs, master_cmd, master_log)
    address = ["--master", f"127.0.0.1:{port}", "--token-file", str(token_file)]

    def dump() -> str:
        return _logs(state, master_log)

    _wait("training on one node (2 workers)", lambda: _steps_at(out, 2) >= 3, dump)
    status = _cli("status", *address)
    assert "target 1 of 3 wanted" in status.stdout, status.stdout + status.stderr

    # Room for three nodes: the master launches two more, admitted at the next round.
    raised = _cli("capacity", "3", *address)
    assert raised.returncode == 0, raised.stderr
    assert "capacity set to 3 slot(s)" in raised.stdout
    grown_at = len(_progress(out))
    _wait("training on three nodes (6 workers)", lambda: _steps_at(out, 6, grown_at) >= 3, dump)

    # One slot goes (through the watched file): the master gives one node back.
    capacity_file.write_text("2\n")
    shrunk_at = len(_progress(out))
    _wait("training on two nodes (4 workers)", lambda: _steps_at(out, 4, shrunk_at) >= 3, dump)

    (out / "pace").write_text("0")
    master.wait(timeout=300)
    assert master.returncode == 0, dump()

    features = [[s, s % 7, s % 3, 1] for s in range(num_samples)]
    expected = [-float(sum(column)) for column in zip(*features, strict=True)]
    assert json.loads((out / "final.json").read_text()) == expected, "a sample was lost or trained twice"
    resumes = [json.loads(line) for line in (out / "resumed.jsonl").read_text().splitlines()]
    assert {r["world"] for r in resumes} >= {2, 4, 6}
    assert all(r["source"] != "none" for r in resumes if r["world"] != 2 or r["step"] > 0), resumes
    # The planned round of the growth redid no step: the agent asked for a flash checkpoint before
    # it, and the new round resumed from the last step the old one trained. The save that answered
    # the request is the requested one, or a periodic save that began after the agent asked (the
    # workers had read the flag for that step before the request came).
    rows = [line.split() for line in (out / "progress.log").read_text().splitlines()]

    def story() -> str:
        # What happened between the rounds, for a failure seen only on a loaded CI machine.
        worlds = [(int(step), int(world)) for step, world, _requested in rows]
        changes = [row for i, row in enumerate(worlds) if i == 0 or worlds[i - 1][1] != row[1]]
        happened = [f"{e['kind']}: {e['message']}" for e in _events(state) if e["kind"] not in ("steps", "progress")]
        return "\n".join([f"resumes {resumes}", f"world changes (step, world) {changes}", *happened, dump()])

    # One round to start, one to grow, one to shrink: the shrink's round waited for the node whose
    # workers were slow to stop (a planned round), rather than form without it and again after.
    assert _rounds(state) == {1, 2, 3}, story()
    before_growth = [int(step) for step, world, _requested in rows if world == "2"]
    first_grown = next(r for r in resumes if r["world"] > 2)
    assert first_grown["step"] == max(before_growth), f"{first_grown} {before_growth[-3:]}\n{story()}"
    last_step, _world, last_requested = rows[len(before_growth) - 1]
    assert last_requested == "1" or int(last_step) % 5 == 0, f"step {last_step}: not saved on request or periodically"
    # The planned round of the shrink redid no step either: the leaving node's agent (stopped with
    # SIGTERM) and the staying ones (told the restart is a planned round's) asked for a flash
    # checkpoint before the leaving workers stopped, and the shrunk round resumed from the last
    # step the three nodes trained.
    before_shrink = [int(step) for step, world, _requested in rows if world == "6"]
    first_shrunk = next(r for r in resumes if r["world"] == 4)
    assert first_shrunk["step"] == max(before_shrink), f"{first_shrunk} {before_shrink[-3:]}\n{story()}"
    last_step, _world, last_requested = rows[len(before_growth) + len(before_shrink) - 1]
    assert int(last_step) == max(before_shrink)
    assert last_requested == "1" or int(last_step) % 5 == 0, f"step {last_step}: not saved on request or periodically"
    events = _events(state)
    resizes = [e for e in events if e["kind"] == "resize"]
    assert [(e["data"]["source"], e["data"]["previous_target"], e["data"]["target"]) for e in resizes] == [
        ("capacity", 1, 3),
        ("capacity", 3, 2),
    ], resizes
    assert resizes[0]["data"]["launched_ranks"] == [1, 2]
    assert len(resizes[1]["data"]["leaving_nodes"]) == 1
    # The planned shrink spent no failure budget: peers that lost their collective restarted for it.
    assert not [e for e in events if e["kind"] == "failure"], story()


def test_a_job_held_below_its_minimum_past_the_window_stops_with_that_reason(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    (tmp_path / "train.py").write_text(PLAIN_TRAIN)
    token_file = write_token_file(tmp_path / "token", generate_token())
    port = _free_port()
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=2:3", f"--port={port}",
        f"--token-file={token_file}", f"--state-dir={state}", "--capacity=2",
        f"--agent-command={_agent_command(tmp_path / 'train.py', '2:3', str(out))}",
        "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=1", "--insufficient-nodes-window-s=8",
        "--node-stop-grace-s=5",
    ]  # fmt: skip
    master_log = tmp_path / "master.log"
    master = _start(procs, master_cmd, master_log)
    address = ["--master", f"127.0.0.1:{port}", "--token-file", str(token_file)]
    _wait("training on two nodes", lambda: _steps_at(out, 4) >= 3, lambda: _logs(state, master_log))

    bad = _cli("capacity", "many", *address)
    assert bad.returncode == 2
    assert "'many' is not a number of slots" in bad.stderr
    below = _cli("scale", "1", *address)
    assert below.returncode == 1
    assert "cannot resize to 1 node(s): the worker group's range is 2..3" in below.stderr
    lowered = _cli("capacity", "1", *address)
    assert lowered.returncode == 0, lowered.stderr
    master.wait(timeout=180)
    assert master.returncode == 1, _logs(state, master_log)
    text = master_log.read_text()
    assert "job failed: insufficient nodes: 1 running < min_nodes 2" in text, text[-3000:]
    resizes = [e for e in _events(state) if e["kind"] == "resize"]
    assert [(e["data"]["source"], e["data"]["target"]) for e in resizes] == [("capacity", 1)]
    assert "below min_nodes 2" in resizes[0]["message"]
