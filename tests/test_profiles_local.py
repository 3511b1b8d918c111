"""Two jobs in a row on the local backend: the first, with explicit resources, records its profile at its end; the
second, given neither `--nnodes` nor `--node-*`, is planned from it and its node is launched with those resources.

Real master, real agent (`dlrover-run`), one training process that reports its steps and persists a flash checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dlrover.master import read_event_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 40

# 40 steps of 0.1 s with 8 samples each, then a flash checkpoint of {"model": Linear(4, 2), "step"} persisted to
# storage (10 parameters), committed by the agent's saver and told to the master before the job ends.
TRAIN = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    from dlrover.diagnosis import StepReporter
    from dlrover.flashckpt import FlashCheckpointer

    ckpt_dir, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    reporter = StepReporter.from_env()
    ckpt = FlashCheckpointer(ckpt_dir)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    t = torch.ones(1)
    for step in range(1, steps + 1):
        dist.all_reduce(t)
        time.sleep(0.1)
        reporter.step(step, samples=8)
    ckpt.save(steps, {"model": model.state_dict(), "step": steps}, persist=True)
    assert ckpt.wait_persisted(steps, timeout_s=120).ok
    ckpt.close(job_end=True)
    dist.destroy_process_group()
    """
)

_NODES = """
import json, sys
from dlrover.master.journal import SqliteJournal
journal = SqliteJournal(sys.argv[1])
state = journal.load()
journal.close()
print(json.dumps([None if n.resources is None else n.resources.to_json() for n in state.lifecycle.nodes]))
"""


def _run_job(tmp_path: Path, name: str, store: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    state = tmp_path / f"state-{name}"
    agent = (
        f"{sys.executable} -m dlrover.launcher.cli --nnodes=1 --nproc-per-node=1 --local-addr=127.0.0.1 "
        f"--monitor-interval=0.1 --heartbeat-interval=0.5 --max-restarts=0 {tmp_path / 'train.py'} "
        f"{tmp_path / f'ckpt-{name}'} {STEPS}"
    )
    cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--job-name=profiled",
        f"--profile-store={store}", f"--state-dir={state}", f"--agent-command={agent}",
        "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=0", "--tick-interval-s=0.2", "--node-stop-grace-s=5",
        *flags,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_", "SLURM_"))}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280, check=False)
    return done, state


def _events(state: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_event_log(state / "events.jsonl") if e["kind"] == kind]


def _node_logs(state: Path) -> str:
    logs = sorted((state / "logs").glob("node-*.log")) if (state / "logs").exists() else []
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)


def test_a_job_with_no_resources_is_planned_from_the_profile_the_job_before_it_recorded(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    store = tmp_path / "profiles.sqlite"

    first, state1 = _run_job(tmp_path, "first", store, "--nnodes=1", "--node-cpu=1", "--node-memory=2Gi")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:] + _node_logs(state1)
    (plan1,) = _events(state1, "initial_plan")
    assert plan1["data"]["source"] == "flags"
    (recorded,) = _events(state1, "profile")
    data = recorded["data"]
    assert recorded["message"] == f"profile 1 recorded in {store}", recorded
    assert data["profile_id"] == 1
    assert data["outcome"] == "succeeded"
    assert data["node_resources"] == {"cpu": 1.0, "memory_mb": 2048, "gpu": 0}
    assert (data["min_nodes"], data["max_nodes"], data["final_nodes"]) == (1, 1, 1)
    # Samples per second measured at one node, peak memory of node 0, sizes from the committed checkpoint.
    ((nodes, rate),) = data["throughput"]
    assert nodes == 1
    assert rate > 0
    ((node, peak_mb),) = data["peak_memory_mb"]
    assert node == 0
    assert peak_mb > 50  # the agent alone imports torch
    assert data["parameter_count"] == 10, data["checkpoint_note"]
    assert data["state_bytes"] == 40  # 10 float32 parameters
    assert data["checkpoint_bytes"] > 40
    assert data["checkpoint_note"].startswith(f"from the checkpoint at {tmp_path / 'ckpt-first'}/{STEPS}")

    second, state2 = _run_job(tmp_path, "second", store)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:] + _node_logs(state2)
    (plan2,) = _events(state2, "initial_plan")
    assert plan2["data"]["source"] == "profile", plan2
    assert plan2["data"]["profile_id"] == 1
    assert plan2["data"]["resources"] == {"cpu": 1.0, "memory_mb": 2048, "gpu": 0}
    assert plan2["message"].startswith(
        "initial plan: from profile 1 of job 'profiled' (same script "
        f"'{tmp_path / 'train.py'}', same name 'profiled'; it succeeded): 1 node(s) (range 1..1"
    ), plan2
    assert "initial plan (profile): from profile 1" in second.stderr + second.stdout
    # Its node was launched with the profile's resources (the journal's record of the node).
    nodes_json = subprocess.run(
        [sys.executable, "-c", _NODES, str(state2)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert json.loads(nodes_json) == [{"cpu": 1.0, "memory_mb": 2048, "gpu": 0}]
    (recorded2,) = _events(state2, "profile")
    assert recorded2["data"]["profile_id"] == 2
