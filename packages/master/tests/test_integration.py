"""End to end with real processes and real gRPC on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dlrover.common import RetryPolicy, RpcError, load_token
from dlrover.master.client import MasterClient
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.eventlog import read_event_log
from dlrover.master.factory import create_master
from dlrover.master.scheduler.local import LocalScheduler
from dlrover.master.states import NodeState
from dlrover.rendezvous import RendezvousClient

pytestmark = pytest.mark.integration

SIM_AGENT = str(Path(__file__).with_name("sim_agent.py"))
STORE_KEY = "dlrover/launcher/round/1/store_addr"  # where the launcher publishes the torch store address


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(110)
def test_silent_agent_is_failed_stopped_and_relaunched_by_the_local_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = MasterConfig(
        job_name="it",
        lifecycle=LifecycleConfig(
            nodes=NodeRange(1, 2), heartbeat_timeout_s=3.0, node_start_timeout_s=60.0, max_relaunches=5
        ),
        heartbeat_interval_s=0.2,
        tick_interval_s=0.1,
        node_stop_grace_s=1.0,
        state_dir=str(tmp_path / "state"),
        backend="local",
        agent_command=(sys.executable, SIM_AGENT),
    )
    monkeypatch.setenv("SIM_SILENT_RANK", "0")  # agents inherit the master's environment
    runtime = create_master(cfg)
    runtime.start()
    scheduler = runtime.scheduler
    assert isinstance(scheduler, LocalScheduler)
    try:
        master = runtime.master
        silent_pid = scheduler.pid(0)  # launched by start()
        assert silent_pid is not None

        def reached(node_id: int, state: NodeState) -> bool:
            # Judged from the history, so a later transition cannot hide that the state was reached.
            return any(t.to_state is state for t in master.node(node_id).history)

        wait_for(lambda: reached(0, NodeState.RUNNING), what="node 0 registered")
        wait_for(lambda: reached(0, NodeState.RELAUNCHING), what="node 0 failed for silence")
        assert master.node(0).last_failure.startswith("preemption: no heartbeat")
        replacement = master.node(0).replaced_by
        assert replacement is not None
        assert master.node(replacement).rank == 0
        wait_for(lambda: reached(replacement, NodeState.RUNNING), what="replacement registered")
        wait_for(lambda: not alive(silent_pid), what="the silent agent stopped")
        assert scheduler.pid(replacement) != silent_pid
        events = read_event_log(tmp_path / "state" / "events.jsonl")
        assert any(e["kind"] == "relaunch" and e["node_id"] == 0 for e in events)
    finally:
        pids = [p for p in (scheduler.pid(i) for i in runtime.master.nodes()) if p is not None]
        runtime.stop()
    assert not any(alive(p) for p in pids), "an agent outlived the master"


EXTERNAL = ["--backend", "external", "--nnodes", "1:2", "--heartbeat-timeout-s", "30", "--heartbeat-interval-s", "1",
            "--node-start-timeout-s", "0"]  # fmt: skip


def start_master_process(
    state_dir: Path,
    log: Path,
    port: int = 0,
    extra: list[str] = EXTERNAL,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """`dlrover-master` as a real process; returns it and the address it printed."""
    start = log.stat().st_size if log.exists() else 0  # only this run's output counts
    out = open(log, "ab")  # noqa: SIM115 - the child owns it; closed after it exits
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrover.master.cli", "--state-dir", str(state_dir), "--port", str(port),
         "--log-level", "WARNING", *extra],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )  # fmt: skip
    out.close()
    found: list[str] = []

    def listening() -> bool:
        text = log.read_text(errors="replace") if log.exists() else ""
        matches = re.findall(r"listening on (\S+)", text[start:])
        if matches:
            found.append(matches[-1])
        assert proc.poll() is None, f"the master exited early: {text}"
        return bool(found)

    wait_for(listening, what="the master listening")
    return proc, found[-1]


@pytest.mark.timeout(110)
def test_master_sigkill_and_restart_keeps_state_and_ranks(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = tmp_path / "master.log"
    policy = RetryPolicy(call_timeout_s=20.0, total_timeout_s=60.0, max_attempts=20)
    proc, address = start_master_process(state, log)
    port = int(address.rsplit(":", 1)[1])
    procs = [proc]
    try:
        token = load_token(token_file=state / "token")
        a = MasterClient(address, token, policy=policy)
        b = MasterClient(address, token, policy=policy)
        ra = a.register("agent-a", "host-a")
        rb = b.register("agent-b", "host-b")
        a.heartbeat(step=10)
        b.heartbeat(step=10)
        a.report_checkpoint_steps(2, {0: [10]})
        b.report_checkpoint_steps(2, {1: [10]})
        a.commit_checkpoint(10, "/ck/10")
        before = a.job_status()
        a.close()
        b.close()

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc2, address2 = start_master_process(state, log, port=port)
        procs.append(proc2)
        assert address2 == address

        # The agents reconnect with the identities they had: no re-registration, same ranks.
        a2 = MasterClient(address2, token, policy=policy)
        b2 = MasterClient(address2, token, policy=policy)
        a2.set_identity(ra.node_id, ra.node_credential)
        b2.set_identity(rb.node_id, rb.node_credential)
        assert a2.heartbeat(step=11).job_state == "running"
        assert b2.heartbeat(step=11).job_state == "running"
        after = a2.job_status()
        assert [(n.node_id, n.rank, n.state) for n in after.nodes] == [
            (n.node_id, n.rank, n.state) for n in before.nodes
        ]
        assert after.committed_step == 10
        assert after.job_failures == 0
        assert "master_restart" in [e.kind for e in a2.list_events(limit=1000)]
        # A stranger still cannot take a slot that is held.
        with MasterClient(address2, token, policy=RetryPolicy(max_attempts=1)) as c, pytest.raises(RpcError) as info:
            c.register("agent-a", "host-a", node_id=ra.node_id)
        assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
        a2.stop_job("test over")
        a2.close()
        b2.close()
        assert proc2.wait(timeout=60) == 3  # stopped on request
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


@pytest.mark.timeout(110)
def test_master_sigkill_with_local_agents_keeps_them_training(tmp_path: Path) -> None:
    """The local backend's agents outlive a SIGKILLed master and carry on with the restarted one."""
    state, log, pid_dir = tmp_path / "state", tmp_path / "master.log", tmp_path / "pids"
    pid_dir.mkdir()
    extra = ["--backend", "local", "--nnodes", "2", "--agent-command", f"{sys.executable} {SIM_AGENT}",
             "--heartbeat-timeout-s", "20", "--heartbeat-interval-s", "0.2", "--node-start-timeout-s", "60",
             "--tick-interval-s", "0.2"]  # fmt: skip
    env = {**os.environ, "SIM_PID_DIR": str(pid_dir)}
    proc, address = start_master_process(state, log, extra=extra, env=env)
    port = int(address.rsplit(":", 1)[1])
    procs = [proc]
    agent_pids: list[int] = []
    try:
        token = load_token(token_file=state / "token")
        client = MasterClient(
            address, token, policy=RetryPolicy(call_timeout_s=20, total_timeout_s=90, max_attempts=50)
        )

        def all_running() -> bool:
            return all(n.state == "running" and n.step > 0 for n in client.job_status().nodes)

        wait_for(all_running, what="both agents running")
        before = client.job_status()
        agent_pids = [int((pid_dir / str(n.node_id)).read_text()) for n in before.nodes]

        os.kill(proc.pid, signal.SIGKILL)  # the master only: agents run in their own sessions
        proc.wait(timeout=30)
        assert all(alive(p) for p in agent_pids), "agents must survive their master"
        proc2, address2 = start_master_process(state, log, port=port, extra=extra, env=env)
        procs.append(proc2)
        assert address2 == address

        def resumed_and_progressing() -> bool:
            status = client.job_status()
            steps_before = {n.node_id: n.step for n in before.nodes}
            return all(n.state == "running" and n.step > steps_before.get(n.node_id, 0) for n in status.nodes)

        wait_for(resumed_and_progressing, what="agents heartbeating to the restarted master")
        after = client.job_status()
        assert [(n.node_id, n.rank) for n in after.nodes] == [(n.node_id, n.rank) for n in before.nodes]
        assert after.job_failures == 0
        assert after.total_relaunches == 0
        assert "master_restart" in [e.kind for e in client.list_events(limit=1000)]

        client.stop_job("test over")
        client.close()
        assert proc2.wait(timeout=60) == 3
        # Told to stop on their next heartbeat, the agents exit by themselves.
        wait_for(lambda: not any(alive(p) for p in agent_pids), what="agents exited after the job stopped")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        for pid in agent_pids:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


def journaled_blob(state_dir: Path, name: str) -> dict[str, object] | None:
    """A blob as the journal holds it now, read without disturbing the master that writes it."""
    db = sqlite3.connect(f"file:{state_dir / 'master.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT data FROM blobs WHERE name=?", (name,)).fetchone()
    finally:
        db.close()
    return None if row is None else dict(json.loads(row[0]))


@pytest.mark.timeout(110)
def test_a_restarted_master_adopts_the_local_agents_observes_and_stops_them(tmp_path: Path) -> None:
    """After a SIGKILL, the new master treats the old one's agents as its own: no duplicates,
    an agent that dies is noticed at once (not after a heartbeat timeout) and replaced, and at the
    job's end an agent that never heartbeats (so never hears the stop) is stopped by signal."""
    state, log, pid_dir = tmp_path / "state", tmp_path / "master.log", tmp_path / "pids"
    pid_dir.mkdir()
    extra = ["--backend", "local", "--nnodes", "2", "--agent-command", f"{sys.executable} {SIM_AGENT}",
             "--heartbeat-timeout-s", "300", "--heartbeat-interval-s", "0.2", "--node-start-timeout-s", "0",
             "--tick-interval-s", "0.2", "--node-stop-grace-s", "2"]  # fmt: skip
    # Rank 1's first agent registers, then hangs silently (it would sleep 600 s).
    env = {**os.environ, "SIM_PID_DIR": str(pid_dir), "SIM_SILENT_RANK": "1"}
    proc, address = start_master_process(state, log, extra=extra, env=env)
    port = int(address.rsplit(":", 1)[1])
    procs = [proc]
    pids: dict[int, int] = {}
    try:
        token = load_token(token_file=state / "token")
        client = MasterClient(
            address, token, policy=RetryPolicy(call_timeout_s=20, total_timeout_s=90, max_attempts=50)
        )
        wait_for(lambda: all(n.state == "running" for n in client.job_status().nodes), what="both agents registered")
        wait_for(lambda: len(list(pid_dir.iterdir())) == 2, what="both pid files")
        pids = {int(p.name): int(p.read_text()) for p in pid_dir.iterdir()}
        launched = journaled_blob(state, "local_scheduler")
        assert launched is not None
        assert sorted(launched["nodes"]) == ["0", "1"]  # type: ignore[call-overload]

        os.kill(proc.pid, signal.SIGKILL)  # the master only: agents run in their own sessions
        proc.wait(timeout=30)
        proc2, _ = start_master_process(state, log, port=port, extra=extra, env=env)
        procs.append(proc2)
        wait_for(lambda: client.job_status().nodes[0].step > 0, what="rank 0 heartbeating to the new master")
        assert sorted(int(p.name) for p in pid_dir.iterdir()) == [0, 1]  # nothing launched twice

        os.kill(pids[0], signal.SIGKILL)  # rank 0's agent dies; only its adopted pid tells the new master

        def replaced() -> bool:
            node = client.job_status().nodes[0]
            return node.node_id == 2 and node.state == "running"

        wait_for(replaced, what="rank 0 replaced after its adopted agent died")
        pids.update({int(p.name): int(p.read_text()) for p in pid_dir.iterdir()})
        assert alive(pids[1])

        client.stop_job("test over")
        client.close()
        assert proc2.wait(timeout=60) == 3
        # The silent agent never heard the stop: the new master signalled the process it adopted.
        wait_for(lambda: not alive(pids[1]), what="the adopted silent agent stopped")
        wait_for(lambda: not any(alive(p) for p in pids.values()), what="every agent gone")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        for pid in pids.values():
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.timeout(110)
def test_a_restarted_master_serves_the_key_value_store_it_journaled(tmp_path: Path) -> None:
    state, log = tmp_path / "state", tmp_path / "master.log"
    extra = [*EXTERNAL, "--state-export-interval-s", "0.2", "--tick-interval-s", "0.1"]
    proc, address = start_master_process(state, log, extra=extra)
    procs = [proc]
    try:
        token = load_token(token_file=state / "token")
        policy = RetryPolicy(call_timeout_s=20.0, total_timeout_s=60.0, max_attempts=20)
        with RendezvousClient(address, token, policy=policy) as rdzv:
            rdzv.kv_set([STORE_KEY], [b"10.0.0.7:29500"])

            def journaled() -> bool:
                blob = journaled_blob(state, "rendezvous_kv")
                return blob is not None and STORE_KEY in blob["items"]  # type: ignore[operator]

            wait_for(journaled, what="the store journaled on the export cadence")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            proc2, _ = start_master_process(state, log, port=int(address.rsplit(":", 1)[1]), extra=extra)
            procs.append(proc2)
            assert rdzv.kv_get([STORE_KEY]) == [b"10.0.0.7:29500"]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
