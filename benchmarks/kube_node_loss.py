"""A node lost, to training again, on the test kubelet with a real master and agents (issue 29).

A real ``dlrover-master --backend kubernetes`` runs an ElasticJob of 2 nodes on the test API server and
its kubelet (``dlrover_testsupport.kube.KubeCluster``; 4 simulated nodes with one pod slot each, so
every pod has a node of its own). Each worker pod runs a real ``dlrover-run`` agent with one worker
that trains a toy job over gloo (a small all_reduce, a touch of S MB of state and a short sleep per
step), saves a replicated `FlashCheckpointer` snapshot every step and, on rank 0, persists the state
to disk (``torch.save``, fsync, rename) every ``--persist-every`` steps. Once training is steady, the
simulated node under rank 1's pod is lost (``Kubelet.lose_node``: its processes SIGKILLed, the pod
Failed with reason NodeLost, then deleted), and the time is measured until every rank completed a step
in a worker process started after the loss. Three ways, alternated so all see the same machine load:

* ``spare``: ``--spare-nodes 1``: a warm spare pod (agent registered, standbys ready) takes rank 1.
* ``no spare``: the master relaunches rank 1 as a new pod on another node (with the anti-affinity).
  In both, the new rank 1 loads the state from rank 0's memory (the replicated snapshot).
* ``whole restart`` (the peer): the same job restarted whole from its persisted checkpoint, as a job
  without elastic recovery is: at the loss the driver stops the master (which deletes every pod),
  waits until every pod and process is gone, and submits a new ElasticJob of the same training
  (another job id, so nothing is in memory) whose workers load the checkpoint from disk. The peer
  gets no detection delay: the restart starts at the moment of the loss.

Goal (issue 29): at most 0.3x the whole restart without a spare, at most 0.1x with one (medians).

What the test kubelet leaves out: a pod here starts as a local process at once (no scheduling latency,
image pull, container creation or volume attach), so a new pod costs only its agent's and worker's
start-up. On a cluster those costs come on top of the whole restart (every pod and the master) and of
the relaunch without a spare (one pod), not of the spare's takeover. The breakdown's ``master acted``
is when the master promoted the spare or launched the new pod (its event log): the loss reaches it
through the pod watch at once, and it acts at its next tick (``--tick-interval-s``, default 1 s).

    python benchmarks/kube_node_loss.py                 # 1 run of each way
    python benchmarks/kube_node_loss.py --runs 2 --state-mb 64
    python benchmarks/kube_node_loss.py --only "no spare" --keep-logs /tmp/nodeloss-logs   # pod and agent logs kept

Every wait is bounded (a recovery that does not come in time is a hang, a result); the cluster is a
context manager (every pod process, cgroup and pod directory gone when it stops); the master, any
process naming the run's temp dir, the flash checkpoints' shared memory and the temp dir are removed
and checked to be gone.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import fmt, free_port, median

try:
    import dlrover_testsupport  # noqa: F401
except ImportError:  # not installed (it is no distribution): the repository's copy
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testsupport" / "src"))

from dlrover_testsupport.kube.cluster import KubeCluster
from dlrover_testsupport.kube.kubelet import SimNode

from dlrover.common import ProcessIdentity, generate_token, processes_mentioning, write_token_file
from dlrover.master.kube import names

PYTHON = sys.executable
NS = "default"
SHM_DIR = "/dev/shm"
NODE_SHM_PREFIX = "dlrover-node-"  # dlrover.launcher.agent.NODE_SHM_PREFIX
MB = 1 << 20
GOALS = {"spare": 0.1, "no spare": 0.3}  # issue 29: at most this times the whole restart

WORKER = textwrap.dedent(
    r"""
    import os, sys, time
    T_START = time.monotonic()
    from pathlib import Path
    import torch
    import torch.distributed as dist

    out, job_id, size_bytes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    persist_every, step_sleep = int(sys.argv[4]), float(sys.argv[5])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log = open(out / f"rank{rank}.log", "a", buffering=1)
    pid = os.getpid()


    def mark(event, step=-1, t=None):
        log.write(f"{event} {pid} {step} {time.monotonic() if t is None else t:.6f}\n")


    mark("start", t=T_START)
    dist.init_process_group("gloo")
    mark("joined")
    model = torch.nn.Linear(16, 16)
    state = {"w": torch.zeros(max(1, size_bytes // 4)), "model": model.state_dict(), "step": 0}
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig

    ckpt = FlashCheckpointer(
        StagerConfig(job_id=job_id, run_id="r", rank=rank, world_size=world), str(out / f"flash-{job_id}"),
        replicated=True,
    )
    step = 0
    try:
        loaded = ckpt.load(target=state)
        step = int(loaded.step)
        mark("loaded-" + loaded.source, step)
    except NoCheckpointError:
        path = out / "ckpt.pt"
        if path.exists():
            saved = torch.load(path, weights_only=True)
            state["w"].copy_(saved["w"])
            model.load_state_dict(saved["model"])
            step = int(saved["step"])
            mark("loaded-disk", step)
        else:
            mark("fresh")
    ckpt.prepare(state)
    stop_file = out / "stop"
    while True:
        step += 1
        flags = torch.tensor([float(stop_file.exists()), float(ckpt.save_requested())])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # the step's collective; agrees on stop and save
        with torch.no_grad():
            state["w"][: 1 << 16].add_(1.0)
            model.weight.add_(0.001)
        time.sleep(step_sleep)
        mark("step", step)
        state["step"] = step
        ckpt.save(step, state)
        if ckpt.round_pending():  # the agent restarts us for a new round: train nothing more
            while True:
                time.sleep(0.05)
        if rank == 0 and step % persist_every == 0:
            tmp = out / "ckpt.tmp"
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, out / "ckpt.pt")
            mark("persisted", step)
        if flags[0].item() > 0:
            break
    dist.barrier()
    ckpt.close(job_end=rank == 0)
    dist.destroy_process_group()
    mark("done", step)
    """
)


def _crd() -> dict[str, Any]:
    version = {
        "name": names.CRD_VERSION,
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    kind = {"plural": names.CRD_PLURAL, "singular": names.CRD_SINGULAR, "kind": names.CRD_KIND}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.CRD_NAME},
        "spec": {"group": names.CRD_GROUP, "scope": "Namespaced", "names": kind, "versions": [version]},
    }


@dataclass
class Trial:
    way: str
    outcome: str = "ok"
    step_s: float | None = None
    recovery_s: float | None = None  # loss -> every rank stepped in a process started after it
    breakdown: dict[str, float] = field(default_factory=dict)
    loaded: str = ""
    resumed: str = ""  # the step resumed from / the last step trained before the loss
    how: str = ""  # what the master did (its event log), or "new job"
    leaks: list[str] = field(default_factory=list)
    tail: str = ""


class Run:
    """One trial's cluster, ElasticJobs, masters and files; `cleanup` removes them all and says what leaked."""

    def __init__(self, args: argparse.Namespace, cluster: KubeCluster, tmp: Path) -> None:
        from kubernetes import client

        self.args, self.cluster, self.tmp = args, cluster, tmp
        self.out = tmp / "out"
        self.out.mkdir()
        self.script = tmp / "node_loss_worker.py"
        self.script.write_text(WORKER)
        self.api = client.ApiClient(client.Configuration(host=cluster.url))
        self.core = client.CoreV1Api(self.api)
        client.ApiextensionsV1Api(self.api).create_custom_resource_definition(_crd())
        self.kubeconfig = cluster.write_kubeconfig(tmp / "kubeconfig")
        self.masters: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.job_ids: list[str] = []
        self.agents: dict[str, ProcessIdentity] = {}  # pod name -> its agent (names its shared-memory dir)

    def submit(self, job: str, *master_flags: str) -> subprocess.Popen[bytes]:
        """Create the job's token Secret and ElasticJob, and start its master."""
        from kubernetes import client

        job_id = f"loss{uuid.uuid4().hex[:10]}"
        self.job_ids.append(job_id)
        agent = [
            PYTHON, "-m", "dlrover.launcher.cli", "--nnodes=2", "--nproc-per-node=1", "--local-addr=127.0.0.1",
            f"--max-restarts={self.args.max_restarts}", f"--log-dir={self.tmp / 'agent-logs' / job}",
            *self.args.agent_flags.split(), str(self.script), str(self.out), job_id, str(self.args.state_mb * MB),
            str(self.args.persist_every), str(self.args.step_sleep_s),
        ]  # fmt: skip
        container = {
            "name": "main",
            "image": "dlrover",
            "command": agent,
            "env": [{"name": "TMPDIR", "value": str(self.tmp)}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        }
        token = generate_token()
        token_file = write_token_file(self.tmp / f"{job}.token", token)
        self.core.create_namespaced_secret(NS, {
            "metadata": {"name": names.token_secret_name(job)},
            "data": {"token": base64.b64encode(token.encode()).decode()},
        })  # fmt: skip
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            names.CRD_GROUP, names.CRD_VERSION, NS, names.CRD_PLURAL, {
                "apiVersion": names.api_version(), "kind": names.CRD_KIND, "metadata": {"name": job},
                "spec": {"replicaSpecs": {"worker": {"template": {"spec": {"containers": [container]}}}}},
            },
        )  # fmt: skip
        port = free_port()
        cmd = [
            PYTHON, "-m", "dlrover.master.cli", "--backend=kubernetes", f"--kube-namespace={NS}",
            f"--kube-job={job}", f"--kubeconfig={self.kubeconfig}", f"--kube-master-address=127.0.0.1:{port}",
            f"--port={port}", f"--token-file={token_file}", "--nnodes=2", f"--state-dir={self.tmp / job}",
            "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=0", "--node-stop-grace-s=2", "--kube-backoff-max-s=1",
            *master_flags, *self.args.master_flags.split(),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_") and k != "KUBECONFIG"}
        env["TMPDIR"] = str(self.tmp)
        with open(self.tmp / f"{job}-master.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.masters.append((job, proc))
        self.address, self.token = f"127.0.0.1:{port}", token
        return proc

    def pods(self, job: str) -> list[dict[str, Any]]:
        selector = names.worker_selector(job)
        return [p.to_dict() for p in self.core.list_namespaced_pod(NS, label_selector=selector).items]

    def note_agents(self) -> None:
        """Remember the agent of every running pod: its shared-memory dir is named after it."""
        for job, _proc in self.masters:
            for pod in self.pods(job):
                name = pod["metadata"]["name"]
                pid = self.cluster.kubelet.pid(name)
                if pid is not None and name not in self.agents:
                    with contextlib.suppress(OSError, ValueError):
                        self.agents[name] = ProcessIdentity.of(pid)

    def events(self) -> dict[int, list[tuple[str, int, int, float]]]:
        """Per rank: (event, pid, step, t) lines the workers wrote (a line being written is skipped)."""
        found: dict[int, list[tuple[str, int, int, float]]] = {}
        for path in self.out.glob("rank*.log"):
            rows = []
            for raw in path.read_text(errors="replace").splitlines():
                parts = raw.split()
                if len(parts) == 4:
                    rows.append((parts[0], int(parts[1]), int(parts[2]), float(parts[3])))
            found[int(path.stem[4:])] = rows
        return found

    def wait_for(self, what: str, pred: Any, timeout_s: float, *, master: subprocess.Popen[bytes] | None) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            if pred():
                return "ok"
            if master is not None and master.poll() is not None:
                return f"{what}: the master exited {master.returncode}"
            if time.monotonic() > deadline:
                return f"{what}: hang"
            time.sleep(0.05)

    def tail(self, n: int = 12) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*-master.log")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(parts)

    def stop_job(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        """`dlrover-master stop`: the master ends its job and deletes every pod still running, then exits."""
        from dlrover.common import DLRoverError
        from dlrover.master.client import MasterClient

        if proc.poll() is None:
            with contextlib.suppress(DLRoverError), MasterClient(self.address, self.token) as c:
                c.stop_job("the job is restarted whole from its persisted checkpoint")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)

    def stop_master(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        """SIGTERM: the master exits and leaves its pods to a successor (the kubelet's stop ends them)."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)

    def cleanup(self) -> list[str]:
        leaks: list[str] = []
        (self.out / "stop").touch()
        for _job, proc in self.masters:
            self.stop_master(proc, 60)
            if proc.poll() is None:
                leaks.append(f"master {proc.pid} did not stop on SIGTERM; killed")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.api.close()
        return leaks


def _stepped_after(ev: dict[int, list[tuple[str, int, int, float]]], t0: float, world: int) -> float | None:
    """When every rank had completed a step in a worker process that started after `t0`, or None."""
    ts = []
    for rank in range(world):
        rows = ev.get(rank, [])
        new_pids = {pid for e, pid, _s, t in rows if e == "start" and t > t0}
        step = next((t for e, pid, _s, t in rows if e == "step" and pid in new_pids), None)
        if step is None:
            return None
        ts.append(step)
    return max(ts)


def _first_after(ev: dict[int, list[tuple[str, int, int, float]]], t0: float, event: str, world: int) -> float | None:
    ts = []
    for rank in range(world):
        hit = next((t for e, _p, _s, t in ev.get(rank, []) if e.startswith(event) and t > t0), None)
        if hit is None:
            return None
        ts.append(hit)
    return max(ts)


def _steps(ev: dict[int, list[tuple[str, int, int, float]]], rank: int) -> list[tuple[int, float]]:
    return [(s, t) for e, _p, s, t in ev.get(rank, []) if e == "step"]


def _spare_running(address: str, token: str, timeout_s: float) -> bool:
    from dlrover.common import DLRoverError
    from dlrover.master.client import MasterClient

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(DLRoverError), MasterClient(address, token) as c:
            if any(n.state.value == "running" for n in c.job_status().spares):
                return True
        time.sleep(0.2)
    return False


def run_trial(way: str, args: argparse.Namespace) -> Trial:
    trial = Trial(way)
    tmp = Path(tempfile.mkdtemp(prefix="dlrover-nodeloss-"))
    nodes = [SimNode(f"node-{i}", pods=1) for i in range(args.sim_nodes)]
    run: Run | None = None
    try:
        with KubeCluster(nodes, root=tmp / "kubelet", restart_backoff_s=0.2, max_restart_backoff_s=2.0) as cluster:
            try:
                run = Run(args, cluster, tmp)
                _trial(run, trial, way, args)
            except Exception as exc:  # a result, not a crash of the whole benchmark
                trial.outcome = f"error: {exc!r}"
            finally:
                if run is not None:
                    with contextlib.suppress(Exception):
                        run.note_agents()
                    if trial.outcome != "ok":
                        trial.tail = run.tail()
                    trial.leaks += run.cleanup()
    finally:
        if args.keep_logs:
            _keep_logs(tmp, Path(args.keep_logs) / f"{way.replace(' ', '-')}-{uuid.uuid4().hex[:6]}")
        trial.leaks += _remove_leftovers(tmp, run)
    return trial


def _keep_logs(tmp: Path, dest: Path) -> None:
    """Copy the trial's text files (pod and agent logs, event logs; no checkpoint) to `dest`."""
    for path in tmp.rglob("*"):
        wanted = path.suffix in (".log", ".jsonl", ".txt") and not path.is_symlink()
        if wanted and path.is_file() and path.stat().st_size <= 16 * MB:
            target = dest / path.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(path, target)
            except OSError as exc:  # a pod's log removed meanwhile: the rest is still worth keeping
                print(f"  could not keep {path}: {exc}", file=sys.stderr)


def _trial(run: Run, trial: Trial, way: str, args: argparse.Namespace) -> None:
    master = run.submit("j", *(["--spare-nodes=1"] if way == "spare" else []))
    ev: dict[int, list[tuple[str, int, int, float]]] = {}

    def steady() -> bool:
        nonlocal ev
        ev = run.events()
        return all(len(_steps(ev, r)) >= args.steady_steps for r in range(2)) and any(
            e[0] == "persisted" for e in ev.get(0, [])
        )

    status = run.wait_for("steady training", steady, args.start_timeout_s, master=master)
    if status == "ok" and way == "spare" and not _spare_running(run.address, run.token, args.start_timeout_s):
        status = "no spare running"
    if status != "ok":
        trial.outcome = status
        return
    time.sleep(args.settle_s)  # the standbys (and the spare's) are up, not importing torch beside the fault
    run.note_agents()
    ev = run.events()
    ts = [t for _s, t in _steps(ev, 0)[-args.steady_steps :]]
    trial.step_s = median(b - a for a, b in itertools.pairwise(ts))
    rank1 = next(p for p in run.pods("j") if p["metadata"]["labels"].get(names.RANK_LABEL) == "1")
    lost = rank1["spec"]["node_name"]
    t0, t0_wall = time.monotonic(), time.time()
    run.cluster.kubelet.lose_node(lost)
    last_before = max((s for s, t in _steps(run.events(), 0) if t <= t0), default=-1)
    if way == "whole restart":
        run.stop_job(master, args.recover_timeout_s)
        gone = run.wait_for("every pod gone", lambda: not run.pods("j"), args.recover_timeout_s, master=None)
        if gone != "ok" or master.poll() is None:
            trial.outcome = gone if gone != "ok" else "the master did not stop"
            return
        trial.breakdown["old job gone"] = time.monotonic() - t0
        master = run.submit("j2")
    status = run.wait_for(
        "training again", lambda: _stepped_after(run.events(), t0, 2) is not None, args.recover_timeout_s,
        master=master,
    )  # fmt: skip
    if status != "ok":
        trial.outcome = status
        return
    ev = run.events()
    back = _stepped_after(ev, t0, 2)
    assert back is not None
    trial.recovery_s = back - t0
    for label, event in (("workers started", "start"), ("group joined", "joined"), ("state loaded", "loaded")):
        t = _first_after(ev, t0, event, 2)
        if t is not None:
            trial.breakdown[label] = t - t0
    trial.loaded = ",".join(sorted({e for r in range(2) for e, _p, _s, t in ev.get(r, []) if t > t0 and (
        e.startswith("loaded") or e == "fresh")}))  # fmt: skip
    resumed = [s for e, _p, s, t in ev.get(0, []) if t > t0 and e.startswith("loaded")]
    trial.resumed = f"{resumed[0] if resumed else '-'}/{last_before}"
    if way == "whole restart":
        trial.how = "new job"
        return
    trial.how, acted = _how(run.tmp / "j" / "events.jsonl", t0_wall)
    if acted is not None:
        trial.breakdown["master acted"] = acted


def _how(event_log: Path, t0_wall: float) -> tuple[str, float | None]:
    """How the master replaced the lost rank, from its event log (the spare promoted or a pod relaunched),
    and how long after the loss (wall clock) it first did."""
    from dlrover.master import read_event_log

    events = read_event_log(event_log) if event_log.exists() else []
    # A failure that waits for its cause is counted once settled (excused or charged), not when reported.
    kinds = Counter(str(e["kind"]) for e in events if (e.get("data") or {}).get("charge") != "awaiting_cause")
    counted = (
        "disruption",
        "spare_promoted",
        "relaunch",
        "failure",
        "failure_charged",
        "consequence_restart",
        "failure_excused",
    )
    parts = [f"{kinds[k]} {k}" for k in counted if kinds[k]]
    acted = [float(e["wall_time"]) - t0_wall for e in events if e["kind"] in ("spare_promoted", "relaunch")]
    return ", ".join(parts) or "-", min(acted) if acted else None


def _remove_leftovers(tmp: Path, run: Run | None) -> list[str]:
    """Processes naming the temp dir, the flash checkpoints' and agents' shared memory, the temp dir."""
    leaks: list[str] = []
    deadline = time.monotonic() + 15.0
    while processes_mentioning(str(tmp)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in processes_mentioning(str(tmp)):
        leaks.append(f"process {pid} still running after the trial; killed")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if run is not None:
        from dlrover.flashckpt import remove_run

        for job_id in run.job_ids:
            # A lost node's processes were SIGKILLed: what they held in memory is left to whoever cleans up.
            remove_run(SHM_DIR, job_id, "r")
        for ident in run.agents.values():
            for path in Path(SHM_DIR).glob(f"{NODE_SHM_PREFIX}{ident.pid}-{ident.start_ticks}-*"):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        for job_id in run.job_ids:
            left = sorted(p.name for p in Path(SHM_DIR).glob(f"dlrover-fc.{job_id}.*"))
            leaks += [f"shared memory {name} could not be removed" for name in left]
    shutil.rmtree(tmp, ignore_errors=True)
    if tmp.exists():
        leaks.append(f"temp dir {tmp} could not be removed")
    return leaks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1, help="losses of each way, alternated")
    p.add_argument("--state-mb", type=int, default=32, help="MB of state per rank")
    p.add_argument("--step-sleep-s", type=float, default=0.1, help="compute stand-in per step")
    p.add_argument("--persist-every", type=int, default=5, help="steps between checkpoints persisted to disk")
    p.add_argument("--steady-steps", type=int, default=10, help="steps before the loss")
    p.add_argument("--settle-s", type=float, default=3.0, help="wait after steady training, before the loss")
    p.add_argument(
        "--max-restarts", type=int, default=3,
        help="dlrover-run --max-restarts: in-place restarts of a node's workers (the survivor's, after the loss)",
    )  # fmt: skip
    p.add_argument("--sim-nodes", type=int, default=4, help="simulated nodes (one pod slot each)")
    p.add_argument("--start-timeout-s", type=float, default=180.0)
    p.add_argument("--recover-timeout-s", type=float, default=180.0)
    p.add_argument("--master-flags", default="", help="extra dlrover-master flags, space-separated")
    p.add_argument("--agent-flags", default="", help="extra dlrover-run flags, space-separated")
    p.add_argument("--only", choices=("spare", "no spare", "whole restart"), default=None)
    p.add_argument("--keep-logs", default="", help="copy each trial's logs and event logs into this folder")
    args = p.parse_args(argv)
    ways = [w for w in ("spare", "no spare", "whole restart") if args.only in (None, w)]
    print(
        f"# kube node loss: 2 nodes x 1 worker on the test kubelet ({args.sim_nodes} simulated nodes, one pod "
        f"each), real dlrover-master --backend kubernetes and dlrover-run agents, {args.state_mb} MB state/rank, "
        f"{args.runs} run(s) each, gloo, {os.cpu_count()} CPUs; master flags [{args.master_flags}], agent "
        f"flags [{args.agent_flags}]"
    )
    results: list[Trial] = []
    for rep in range(args.runs):
        for way in ways:
            t = run_trial(way, args)
            results.append(t)
            bd = " ".join(f"{k}={v:.2f}" for k, v in t.breakdown.items())
            print(
                f"  rep {rep} {way:<13} {t.outcome:<8} step={fmt(t.step_s)} recovery={fmt(t.recovery_s)} [{bd}] "
                f"{t.loaded} resumed/last={t.resumed} ({t.how})",
                flush=True,
            )
            if t.tail:
                print("    tail:\n      " + t.tail[-4000:].replace("\n", "\n      "), flush=True)
            if t.leaks:
                print(f"    leaks: {t.leaks}", flush=True)
    base = median(t.recovery_s for t in results if t.way == "whole restart")
    print("\n| way | recovered | step s | loss -> training s (median) | min..max | workers started | state loaded "
          "| ratio vs whole restart | goal |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for way in ways:
        ts = [t for t in results if t.way == way]
        rs = [t.recovery_s for t in ts if t.recovery_s is not None]
        med = median(rs)
        ratio = f"{med / base:.2f}x" if med is not None and base else "-"
        goal = f"<= {GOALS[way]}x" if way in GOALS else "peer"
        print(
            f"| {way} | {sum(t.outcome == 'ok' for t in ts)}/{len(ts)} | {fmt(median(t.step_s for t in ts))} "
            f"| {fmt(med)} | {f'{min(rs):.2f}..{max(rs):.2f}' if rs else '-'} "
            f"| {fmt(median(t.breakdown.get('workers started') for t in ts))} "
            f"| {fmt(median(t.breakdown.get('state loaded') for t in ts))} | {ratio} | {goal} |"
        )
    print(
        "\ngoal (issue 29): node lost -> training again, against the job restarted whole from its persisted checkpoint"
    )
    for way, goal in GOALS.items():
        ours = median(t.recovery_s for t in results if t.way == way)
        if way not in ways:
            continue
        if ours is None or not base:
            print(f"GOAL MISS ({way}): no ratio ({fmt(ours)} s, whole restart {fmt(base)} s)")
        else:
            verdict = "PASS" if ours <= goal * base else "MISS"
            print(f"GOAL {verdict} ({way}): {ours:.2f} s / {base:.2f} s = {ours / base:.2f}x (goal {goal}x)")
    print(
        "note: on the test kubelet a pod starts at once (no scheduling, image pull or container creation); "
        "on a cluster those add to the whole restart and to the relaunch without a spare"
    )
    leaks = [leak for t in results for leak in t.leaks]
    print(f"leaks: {leaks or 'none'}")
    return 0 if not leaks and all(t.outcome == "ok" for t in results) else 1


if __name__ == "__main__":
    sys.exit(main())
