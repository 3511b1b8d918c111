"""A worker that allocates past its node's memory limit is killed by the kernel, classified host_oom from the
node's memory cgroup, relaunched with 1.5x the memory (700 -> 1050 MiB) by the master's local backend, and finishes.

Runs where this host lets the master create child memory cgroups (as root under its own group, cgroup v1 or
v2); elsewhere it is skipped with the reason the master itself would log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlrover.master import UnavailableMemoryGroups, detect_memory_groups, read_event_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

# First attempt: touch 900 MiB (more than the node's 700 MiB, which also holds the agent: about 310 MiB with torch
# imported); the next attempt needs little memory.
HOG = textwrap.dedent(
    """
    import os, sys, time
    out = sys.argv[1]
    marker = os.path.join(out, "attempted")
    if not os.path.exists(marker):
        open(marker, "w").close()
        hog = bytearray(900 * 1024 * 1024)
        for i in range(0, len(hog), 4096):
            hog[i] = 1
        time.sleep(60)  # never reached: the kernel ends this process first
        sys.exit(3)
    with open(os.path.join(out, "done"), "w") as f:
        f.write(str(os.getpid()))
    """
)


def test_a_node_killed_for_memory_is_relaunched_with_more_and_finishes(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    groups = detect_memory_groups()
    if isinstance(groups, UnavailableMemoryGroups):
        pytest.skip(f"memory cgroups are not usable on this host, so no node memory limit can be enforced: "
                    f"{groups.reason}")  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "hog.py"
    script.write_text(HOG)
    agent = (
        f"{sys.executable} -m dlrover.launcher.cli --nnodes=1 --nproc-per-node=1 --local-addr=127.0.0.1 "
        f"--monitor-interval=0.1 --heartbeat-interval=0.5 --prewarm=none --max-restarts=0 {script} {out}"
    )
    state = tmp_path / "state"
    cmd = [
        sys.executable, "-m", "dlrover.master.cli", "--backend=local", "--nnodes=1", f"--agent-command={agent}",
        f"--state-dir={state}", "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=0", "--node-memory=700Mi",
        "--max-node-memory=2Gi", "--node-stop-grace-s=2",
    ]  # fmt: skip
    log = tmp_path / "master.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_")}
    with open(log, "w") as handle:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    procs.append(proc)
    proc.wait(timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text[-5000:]
    assert (out / "done").exists()

    events = read_event_log(state / "events.jsonl")
    by_kind: dict[str, list[dict[str, object]]] = {}
    for event in events:
        by_kind.setdefault(str(event["kind"]), []).append(event)
    (limits,) = by_kind["memory_limits"]
    assert limits["data"]["enforced"] is True, limits  # type: ignore[index]
    (failure,) = by_kind["failure"]
    evidence = str(failure["data"]["evidence"])  # type: ignore[index]
    # The worker was the OOM killer's choice (the agent raises its workers' OOM score): its agent reported it.
    assert failure["data"]["observed_by_master"] is False, evidence  # type: ignore[index]
    assert "dlrover memory record: the node's memory cgroup counted oom_kill 0 -> 1 (limit 700 MiB" in evidence
    # Decided as host_oom from the master's reading of the node's cgroup, not from a guess at SIGKILL.
    (replaced,) = by_kind["relaunch"]
    assert "host_oom: rule 'host-memory-record' (confidence 0.93) matched \"dlrover memory record: the node's" in str(
        replaced["message"]
    )
    (relaunch,) = by_kind["oom_relaunch"]
    data = relaunch["data"]
    assert (data["memory_mb"], data["new_memory_mb"], data["growth_factor"], data["max_node_memory_mb"]) == (  # type: ignore[index]
        700, 1050, 1.5, 2048,
    )  # fmt: skip
    # Nothing is left behind: every node's group was removed with its node.
    assert not [p.name for p in groups.parent.iterdir() if p.name.startswith(f"dlrover-{proc.pid}-")]
    # The relaunched node asked for, and ran under, 450 MiB: the journal's record says so.
    nodes = json.loads(
        subprocess.run(
            [sys.executable, "-c", _NODES, str(state)], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    assert [n["resources"]["memory_mb"] for n in nodes] == [700, 1050]


_NODES = """
import json, sys
from dlrover.master.journal import SqliteJournal
journal = SqliteJournal(sys.argv[1])
state = journal.load()
journal.close()
print(json.dumps([{"resources": n.resources.to_json()} for n in state.lifecycle.nodes]))
"""
