"""`dlrover-master --backend ray` on a real local multi-node Ray cluster, training the GPT example.

One cluster for the module: a head with no CPUs (the master's driver attaches there, no agent lands
there) and three one-CPU worker nodes. The master places one agent actor per Ray node; each agent
runs `dlrover-run`, which runs one GPT training process.

- Two nodes train to the end; part-way one training process is SIGKILLed (its agent restarts it in place
  and it resumes from memory, no actor replaced), then the whole Ray node of rank 1 is killed (the master
  sees it lost, relaunches its agent on the third Ray node, and training resumes); nothing outlives it.
- Growth: with one free Ray node a `--nnodes 1:2` job runs on one; a Ray node added is taken at the next
  round and the job finishes with two.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from dlrover_testsupport.ray import RayTestCluster

from dlrover.master import read_event_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "gpt" / "train.py"
RAY_TEST_NODES = [{"num_cpus": 1}, {"num_cpus": 1}, {"num_cpus": 1}]
WAIT_S = 300.0


def wait_for(what: str, predicate: Callable[[], bool], dump: Callable[[], str], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{dump()}")
        time.sleep(0.2)


def training_processes() -> list[psutil.Process]:
    """Every live process running the GPT example (a worker) on this host."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and str(TRAIN) in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


class RayJob:
    """A GPT job run by `dlrover-master --backend ray` on the module's cluster."""

    def __init__(
        self,
        cluster: RayTestCluster,
        tmp_path: Path,
        nnodes: str,
        steps: int,
        *,
        samples: int = 0,
        pause_file: str = "",
    ) -> None:
        self.cluster = cluster
        self.out = tmp_path / "out"
        self.state = tmp_path / "state"
        self.log = tmp_path / "master.log"
        agent = [
            sys.executable, "-m", "dlrover.launcher.cli", f"--nnodes={nnodes}", "--nproc-per-node=1",
            "--max-restarts=3", "--monitor-interval=0.1", "--heartbeat-interval=0.5", "--prewarm=none",
            f"--log-dir={tmp_path / 'worker-logs'}", str(TRAIN), f"--out={self.out}", f"--steps={steps}",
            "--persist-every=10", "--log-every=5", f"--samples={samples}", f"--pause-file={pause_file}",
        ]  # fmt: skip
        self.cmd = [
            sys.executable, "-m", "dlrover.master.cli", "--backend=ray", f"--ray-address={cluster.address}",
            f"--ray-temp-dir={cluster.temp_dir}", f"--nnodes={nnodes}", f"--state-dir={self.state}",
            "--job-name=gpt-ray", "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=1", "--node-stop-grace-s=3",
            "--ray-death-confirm-s=5", "--node-pending-timeout-s=5", "--insufficient-nodes-window-s=600",
            f"--ray-log-dir={self.state / 'logs'}",
            "--agent-command", " ".join(agent),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_", "RAY_ADDRESS"))}
        env.update(cluster.env)
        with open(self.log, "w") as handle:
            self.proc = subprocess.Popen(
                self.cmd, cwd=tmp_path, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            )  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        path = self.out / "progress.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # the last line may be half written
        return out

    def pid_of_rank(self, rank: int) -> int:
        return int((self.out / f"rank{rank}.pid").read_text().strip())

    def last_step(self) -> int:
        return max((int(r["step"]) for r in self.records() if r.get("event") == "step"), default=0)

    def events(self) -> dict[str, list[dict[str, Any]]]:
        path = self.state / "events.jsonl"
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for event in read_event_log(path) if path.exists() else []:
            by_kind.setdefault(str(event["kind"]), []).append(event)
        return by_kind

    def dump(self) -> str:
        parts = [f"--- master\n{self.log.read_text()[-6000:]}", f"--- progress\n{self.records()[-12:]}"]
        logs = self.state / "logs"
        for log in sorted(logs.glob("node-*.log")) if logs.exists() else []:
            parts.append(f"--- {log.name}\n{log.read_text()[-3000:]}")
        return "\n".join(parts)

    def finish(self) -> None:
        try:
            self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the master did not end\n{self.dump()}") from None
        assert self.proc.returncode == 0, self.dump()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


def test_two_ray_nodes_train_gpt_through_a_killed_process_and_a_lost_node(
    ray_cluster: RayTestCluster, tmp_path: Path
) -> None:
    job = RayJob(ray_cluster, tmp_path, nnodes="2", steps=60)
    try:
        wait_for("training to reach step 8", lambda: job.last_step() >= 8, job.dump)
        # A training process SIGKILLed: its agent restarts it in place and it resumes from memory.
        psutil.Process(job.pid_of_rank(1)).kill()
        wait_for(
            "a resume from memory after the process kill",
            lambda: any(r.get("event") == "resumed" and r.get("source") == "memory" for r in job.records()),
            job.dump,
        )
        assert "relaunch" not in job.events()  # restarted in place: no actor replaced
        step_before_loss = job.last_step()
        wait_for("training to go on", lambda: job.last_step() >= step_before_loss + 3, job.dump)
        # The whole Ray node of rank 1's agent dies: the agent is relaunched on the third Ray node.
        victim = ray_cluster.node_running(job.pid_of_rank(1))
        assert victim is not None, job.dump()
        remaining = {node.node_id for node in ray_cluster.nodes} - {victim.node_id}
        resumes_before = sum(1 for r in job.records() if r.get("event") == "resumed")
        ray_cluster.kill_node(victim)
        wait_for("the lost node's relaunch", lambda: "relaunch" in job.events(), job.dump)
        wait_for(
            "training to resume after the node loss",
            lambda: sum(1 for r in job.records() if r.get("event") == "resumed") > resumes_before,
            job.dump,
        )
        moved_to = ray_cluster.node_running(job.pid_of_rank(1))
        job.finish()
    finally:
        job.kill()
    records = job.records()
    assert records[-1]["event"] == "finished", records[-5:]
    assert records[-1]["step"] == 60
    events = job.events()
    (disruption,) = events["disruption"]
    assert "NodeLost" in json.dumps(disruption), disruption
    assert len(events["relaunch"]) == 1, events["relaunch"]
    # Rank 1 trained on, on one of the Ray nodes that stayed.
    assert moved_to is not None, job.dump()
    assert moved_to.node_id in remaining
    assert "ActorDied" not in job.log.read_text()  # the loss was the node's: nothing charged as the agent's
    wait_for("no training process left", lambda: not training_processes(), job.dump, timeout_s=60)
    for node in ray_cluster.nodes:
        assert not [p for p in ray_cluster.processes(node) if str(TRAIN) in p.cmdline], node


def test_a_job_grows_when_a_ray_node_joins_and_goes_on_at_its_minimum_when_one_leaves(
    ray_cluster: RayTestCluster, tmp_path: Path
) -> None:
    # Leave exactly one free Ray node: the job starts at its minimum of one node.
    while len(ray_cluster.alive_node_ids()) > 1:
        ray_cluster.remove_node(ray_cluster.nodes[-1])
    ray_cluster.wait_for_nodes(1)
    # A fixed dataset (the world size changes): it ends when the data is used up.
    pause = tmp_path / "pause"
    job = RayJob(ray_cluster, tmp_path, nnodes="1:2", steps=120, samples=120 * 16, pause_file=str(pause))
    try:
        wait_for(
            "training on one node",
            lambda: any(r.get("event") == "started" and r.get("world") == 1 for r in job.records()),
            job.dump,
        )
        wait_for("a few steps", lambda: job.last_step() >= 5, job.dump)
        # Held until it grew: however slowly the new node starts on a loaded host, the data must not run
        # out first (a CI run under load finished all 120 steps on one node before the second registered).
        pause.touch()
        ray_cluster.add_node(num_cpus=1)
        wait_for(
            "training on two nodes",
            lambda: any(r.get("event") == "started" and r.get("world") == 2 for r in job.records()),
            job.dump,
        )
        pause.unlink()
        grown_at = len(job.records())
        wait_for(
            "steps on two nodes", lambda: any(r.get("event") == "step" for r in job.records()[grown_at:]), job.dump
        )
        # Rank 1's Ray node dies and no other has room: the job goes on with one node, its minimum.
        victim = ray_cluster.node_running(job.pid_of_rank(1))
        assert victim is not None, job.dump()
        ray_cluster.kill_node(victim)
        wait_for(
            "training on one node again",
            lambda: any(r.get("event") == "started" and r.get("world") == 1 for r in job.records()[grown_at:]),
            job.dump,
        )
        job.finish()
    finally:
        job.kill()
    records = job.records()
    assert records[-1]["event"] == "finished", records[-5:]
    resumed = [r for r in records if r.get("event") == "resumed"]
    assert len(resumed) >= 2, records  # each new round resumed from the state in memory
    (disruption,) = job.events()["disruption"]  # the lost node charged nothing
    assert "NodeLost" in json.dumps(disruption), disruption
    assert "ActorDied" not in job.log.read_text()
    wait_for("no training process left", lambda: not training_processes(), job.dump, timeout_s=60)


HELLO = """
import os, sys
out = sys.argv[1]
with open(os.path.join(out, f"hello-{os.environ['RANK']}"), "w") as f:
    f.write(os.environ["WORLD_SIZE"])
"""


def test_a_script_runs_a_job_on_ray_with_the_master_in_its_own_process(
    ray_cluster: RayTestCluster, tmp_path: Path
) -> None:
    from dlrover.master import RayJob, run_on_ray
    from dlrover.master.scheduler.ray import RaySettings

    while len(ray_cluster.alive_node_ids()) < 2:
        ray_cluster.add_node(num_cpus=1)
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    out = tmp_path / "out"
    out.mkdir()
    command = [
        sys.executable, "-m", "dlrover.launcher.cli", "--nnodes=2", "--nproc-per-node=1", "--prewarm=none",
        "--monitor-interval=0.1", "--heartbeat-interval=0.5", f"--log-dir={tmp_path / 'logs'}", str(script), str(out),
    ]  # fmt: skip
    settings = RaySettings(address=ray_cluster.address, temp_dir=ray_cluster.temp_dir)
    summary = run_on_ray(command, nnodes="2", ray=settings, job_name="hello-ray", timeout_s=WAIT_S)
    assert summary.state.value == "succeeded", summary
    assert sorted(p.name for p in out.iterdir()) == ["hello-0", "hello-1"]
    assert (out / "hello-1").read_text() == "2"
    # Stopped by the script before it ends: every agent goes with it.
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(600)\n")
    with RayJob([*command[:-2], str(slow)], nnodes="2", ray=settings, job_name="slow-ray") as job:
        wait_for("both agents to run", lambda: len(_agents_of("slow-ray")) == 2, lambda: str(job.status()))
        with pytest.raises(TimeoutError, match="still runs"):
            job.wait(timeout_s=1.0)
    assert job.status().state.value == "stopped"
    wait_for("the agents to end", lambda: not _agents_of("slow-ray"), lambda: "agents left", timeout_s=60)


def _agents_of(job_name: str) -> list[psutil.Process]:
    """The `dlrover-run` agents of a job on this host (by the job name in their environment)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "dlrover.launcher.cli" in " ".join(proc.info["cmdline"] or []) and (
                proc.environ().get("DLROVER_JOB_NAME") == job_name
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_bad_input_is_refused_before_anything_starts(ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    def master(*flags: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_", "RAY_ADDRESS"))}
        env.update(ray_cluster.env)
        return subprocess.run(
            [sys.executable, "-m", "dlrover.master.cli", "--backend=ray", "--agent-command=dlrover-run x.py", *flags],
            capture_output=True, text=True, timeout=120, check=False, env=env, cwd=tmp_path,
        )  # fmt: skip

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    refused = master(f"--ray-address={nobody}")
    assert refused.returncode == 2
    assert f"no Ray cluster at {nobody}" in refused.stderr
    too_big = master(f"--ray-address={ray_cluster.address}", "--node-cpu=64", "--node-memory=1024")
    assert too_big.returncode == 2, too_big.stdout + too_big.stderr
    assert "CPU 64" in too_big.stderr
    assert "1cpu/" in too_big.stderr  # what the cluster's nodes have
    wrong_flags = master("--ray-address=auto", "--backend=local")
    assert wrong_flags.returncode == 2
    assert "--ray-* flags are for --backend ray" in wrong_flags.stderr


def test_no_process_outlives_its_agent_actor(ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    from dlrover.master import RayJob
    from dlrover.master.scheduler.ray import RaySettings

    if not ray_cluster.alive_node_ids():
        ray_cluster.add_node(num_cpus=1)
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(600)\n")
    command = [
        sys.executable, "-m", "dlrover.launcher.cli", "--nnodes=1", "--nproc-per-node=1", "--prewarm=none",
        "--monitor-interval=0.1", "--heartbeat-interval=0.5", f"--log-dir={tmp_path / 'logs'}", str(slow),
    ]  # fmt: skip
    settings = RaySettings(address=ray_cluster.address, temp_dir=ray_cluster.temp_dir, death_confirm_s=1.0)
    with RayJob(command, nnodes="1", ray=settings, job_name="actor-kill") as job:
        wait_for("the agent and its worker", lambda: _worker_of("actor-kill") is not None, lambda: str(job.status()))
        agent, worker = _worker_of("actor-kill") or (None, None)
        assert agent is not None
        assert worker is not None
        actor = psutil.Process(agent.ppid())
        assert "dlrover.launcher.cli" not in " ".join(actor.cmdline())  # Ray's worker process, the actor
        actor.kill()  # the actor alone, as Ray ends an actor: its node stays alive
        wait_for("the agent and worker to die with it", lambda: not _alive(agent) and not _alive(worker), str)
        wait_for(
            "the node to be relaunched",
            lambda: job.status().total_relaunches >= 1 and _worker_of("actor-kill") is not None,
            lambda: str(job.status()),
        )
    assert job.status().state.value == "stopped"
    wait_for("the relaunched agent to end", lambda: not _agents_of("actor-kill"), str, timeout_s=60)


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _worker_of(job_name: str) -> tuple[psutil.Process, psutil.Process] | None:
    """A live agent of the job and its training process, once both run."""
    for agent in _agents_of(job_name):
        try:
            for child in agent.children(recursive=True):
                if "slow.py" in " ".join(child.cmdline()):
                    return agent, child
        except psutil.Error:
            continue
    return None
