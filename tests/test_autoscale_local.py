"""The autoscaler on the local backend: a real master with `--autoscale on`, real agents and training
processes whose step time follows a known model, so the job's throughput per node count is known:
one worker per node, each step sleeps ``BASE_S * max(1, world / 2)`` and consumes BATCH samples per
worker, so T(1) = BATCH / BASE_S, T(2) = 2 T(1), and T(3) = T(2): a second node pays, a third does not.

Started at one node with the range 1:3, the job grows to two, tries three, gives it back, and stays
at two; the events carry the measurements and the reasons.
"""

from __future__ import annotations

import os
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

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from dlrover.diagnosis import StepReporter

    BASE_S, BATCH = 0.2, 4
    out = sys.argv[1]
    reporter = StepReporter.from_env()
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    t = torch.ones(1)
    step = 0
    while not os.path.exists(os.path.join(out, "stop")):
        dist.all_reduce(t)
        time.sleep(BASE_S * max(1.0, world / 2))
        step += 1
        reporter.step(step, samples=BATCH)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events(state: Path) -> list[dict[str, Any]]:
    # read_event_log skips a line the running master is still writing.
    path = state / "events.jsonl"
    return read_event_log(path) if path.exists() else []


def _wait(what: str, condition: Callable[[], bool], dump: Callable[[], str], timeout_s: float = 400.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{dump()}")
        time.sleep(0.5)


def _resizes(state: Path) -> list[tuple[str, int, int]]:
    return [
        (e["data"]["source"], e["data"]["previous_target"], e["data"]["target"])
        for e in _events(state)
        if e["kind"] == "resize"
    ]


def test_the_autoscaler_grows_while_a_node_pays_and_gives_back_the_one_that_does_not(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    (tmp_path / "train.py").write_text(TRAIN)
    token_file = write_token_file(tmp_path / "token", generate_token())
    agent = (
        f"{sys.executable} -m dlrover.launcher.cli --nnodes=1:3 --nproc-per-node=1 --local-addr=127.0.0.1 "
        f"--max-restarts=3 --monitor-interval=0.1 --heartbeat-interval=0.5 --round-save-timeout=0.5 "
        f"{tmp_path / 'train.py'} {out}"
    )
    master_cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=1:3", f"--port={_free_port()}",
        f"--token-file={token_file}", f"--state-dir={state}", f"--agent-command={agent}",
        "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=1", "--node-stop-grace-s=5",
        "--autoscale=on", "--autoscale-interval-s=1", "--autoscale-min-measure-s=8", "--autoscale-warmup-s=2",
        "--autoscale-cooldown-s=2",
        # The straggler detector runs at its default factor: with the autoscaler on a straggler is
        # replaced with its host avoided, so a false one would stop the job on the local backend's
        # single host (the "no failure" assertion below).
    ]  # fmt: skip
    log = tmp_path / "master.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_JOB_TOKEN", "SLURM_"))}
    with open(log, "w") as handle:
        master = subprocess.Popen(
            master_cmd, cwd=tmp_path, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
    procs.append(master)

    def dump() -> str:
        parts = [f"--- master\n{log.read_text()[-5000:]}"]
        for node_log in sorted((state / "logs").glob("node-*.log")) if (state / "logs").exists() else []:
            parts.append(f"--- {node_log.name}\n{node_log.read_text()[-2000:]}")
        return "\n".join(parts)

    _wait("the third node given back", lambda: ("autoscaler", 3, 2) in _resizes(state), dump)
    # Stays at two: one more plan at two nodes says so, and no resize follows.
    gave_back = len(_events(state))

    def stays() -> bool:
        return any(e["kind"] == "autoscale_plan" and e["data"]["action"] == "stay" for e in _events(state)[gave_back:])

    _wait("a plan to stay at two nodes", stays, dump)
    (out / "stop").write_text("")
    master.wait(timeout=180)
    assert master.returncode == 0, dump()

    events = _events(state)
    assert _resizes(state) == [("autoscaler", 1, 2), ("autoscaler", 2, 3), ("autoscaler", 3, 2)], dump()
    start = next(e for e in events if e["kind"] == "job_start")
    assert (start["data"]["target_nodes"], start["data"]["wanted_nodes"]) == (1, 1)
    applied = [e for e in events if e["kind"] == "autoscale_plan" and e["data"]["applied"]]
    assert [e["data"]["action"] for e in applied] == ["grow", "grow", "shrink"]
    shrink = applied[-1]["data"]
    measured = {int(n): t for n, t in shrink["measured"].items()}
    # The measurements follow the model: two nodes about twice one, three no faster than two.
    assert measured[2] > 1.6 * measured[1], shrink
    assert measured[3] < 1.2 * measured[2], shrink
    step = shrink["walk"][-1]
    assert (step["from"], step["to"], step["pays"]) == (2, 3, False), shrink
    assert shrink["planner"]["workers"] == 2, shrink
    assert "give back 1 node(s), 3 -> 2" in applied[-1]["message"]
    assert not [e for e in events if e["kind"] == "failure"], [e["message"] for e in events if e["kind"] == "failure"]
