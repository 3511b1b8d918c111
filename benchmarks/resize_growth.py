"""Growth of a running job: from "capacity raised" to the first step at the larger size (issue 28).

Two workers per node train a toy job over gloo whose state holds S MB per rank (one big float32
tensor and a tiny model, the same on every rank as under DDP). Each step is one small all_reduce
(which also agrees on the save request and on stopping), a touch of the state and a short sleep
standing in for compute. The job grows from 1 node to N (default 2) in two ways, alternated so
both see the same machine load:

* ``dlrover``: ``dlrover-master --backend=local --nnodes=1:N --capacity=1`` starts one
  ``dlrover-run`` node; the workers save a replicated `FlashCheckpointer` snapshot every step and
  whenever the agent asks (``save_requested()``, agreed across ranks). The driver raises the local
  backend's capacity to N (`MasterClient.set_capacity`, what ``dlrover-master capacity N`` sends)
  and times until rank 0 completed its first step at world size 2N: the master launches the new
  nodes, their agents join the rendezvous, the running agent sees them waiting, has its workers
  save and restarts them for the new round, and every rank loads the newest step from memory (a
  peer's, for the new nodes).
* ``torchrun``: what torchrun users do. ``torchrun --standalone`` runs the job on one node, rank 0
  ``torch.save`` s the state to storage every ``--persist-every`` steps (temp file, fsync, rename).
  Right after a checkpoint is persisted the driver stops the job (SIGTERM to torchrun) and starts
  N ``torchrun --nnodes=N`` (static rendezvous on 127.0.0.1), whose workers ``torch.load`` it;
  timed from the stop request until rank 0 completed its first step at world size 2N.

Workers append ``event world step CLOCK_MONOTONIC`` lines to one file per rank; the monotonic
clock is system-wide, so the driver's times and the workers' compare directly. The breakdown
says when (after the raise or the stop) the new nodes' agents registered (dlrover, from the
master's event log) or the old job had exited (torchrun), the old job's last step ended, the new
workers started running the script (under dlrover-run after their standby interpreter imported
torch; under torchrun before), every rank had joined the process group and loaded the state.

    python benchmarks/resize_growth.py                 # 32 MB/rank, 1 -> 2 nodes, 3 runs each
    python benchmarks/resize_growth.py --quick         # 1 run each
    python benchmarks/resize_growth.py --nodes 3 --state-mb 64 --runs 5

The goal (issue 28): the dlrover growth takes at most 0.3x the torchrun stop-and-restart. The last
lines say ``GOAL PASS`` or ``GOAL MISS`` with the ratio of the medians, for the growth without a
spare and for the one with a warm spare (``dlrover+spare``: the job runs one node beside a registered
spare, ``--spare-nodes=1``, and is scaled to N; the spare takes the new rank at once). Beside them,
the floor of the growth without a spare: a fresh interpreter's import of what a new node's standby
workers import (torch and the checkpointer), timed before the runs. torchrun's restart pays that
import twice in a row (its agent's, then its workers'), so the growth without a spare cannot go much
below 0.5x of torchrun's restart.

Both ways grow a job in steady state: ``--steady-steps`` steps at one node and, under dlrover-run, no
start-up left running: every standby interpreter held in reserve (the running node's standbys for its
next restart, the spare's) has finished importing torch. A node refills its standbys once its workers
train, so seconds after a job starts they still import; a job grown after minutes of training has
them ready. (The new node's own standbys, without a spare, start with it: they are the growth's.)

Every wait is bounded (a growth that does not happen in time is recorded as a hang and torn down);
processes, shared memory and temp dirs of each run are removed and checked to be gone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchkit import fmt, free_port, median

from dlrover.common import generate_token, proc_stat_fields, processes_mentioning, write_token_file

PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SHM_DIR = "/dev/shm"
RUN_ID = "r"
NPROC = 2
MB = 1 << 20
GOAL_RATIO = 0.3  # issue 28: the dlrover growth at most this times the torchrun stop-and-restart

WORKER = r"""
import os, sys, time
T_START = time.monotonic()
from pathlib import Path
import torch
import torch.distributed as dist

mode, size_bytes, out, job_id = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
persist_every, step_sleep = int(sys.argv[5]), float(sys.argv[6])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
log = open(out / f"rank{rank}.log", "a", buffering=1)


def mark(event, step=-1, t=None):
    log.write(f"{event} {world} {step} {time.monotonic() if t is None else t:.6f}\n")


mark("start", t=T_START)
(out / f"worker-{os.getpid()}").touch()  # the driver tells workers from the standbys still kept in reserve
dist.init_process_group("gloo")
mark("joined")
model = torch.nn.Linear(16, 16)
state = {"w": torch.zeros(max(1, size_bytes // 4)), "model": model.state_dict(), "step": 0}
step = 0
ckpt = None
if mode == "flash":
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig

    ckpt = FlashCheckpointer(
        StagerConfig(job_id=job_id, run_id="r", rank=rank, world_size=world), str(out / "ckpt"), replicated=True
    )
    try:
        loaded = ckpt.load(target=state)
        step = int(loaded.step)
        mark("loaded-" + loaded.source, step)
    except NoCheckpointError:
        mark("fresh")
    ckpt.prepare(state)  # pre-fault the slots: the first save does not pay the page faults
else:
    path = out / "ckpt.pt"
    if path.exists():
        loaded = torch.load(path, weights_only=True)
        state["w"].copy_(loaded["w"])
        model.load_state_dict(loaded["model"])
        step = int(loaded["step"])
        mark("loaded-disk", step)
    else:
        mark("fresh")
stop_file = out / "stop"
while True:
    step += 1
    requested = ckpt is not None and ckpt.save_requested()
    flags = torch.tensor([float(stop_file.exists()), float(requested)])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # the step's collective; agrees on stop and save
    with torch.no_grad():
        state["w"][: 1 << 16].add_(1.0)
        model.weight.add_(0.001)
    time.sleep(step_sleep)
    mark("step", step)
    state["step"] = step
    if ckpt is not None:
        ckpt.save(step, state)  # every step, in memory (and whenever the agent asks)
        if ckpt.round_pending():  # the agent restarts us for the new round: train nothing more
            while True:
                time.sleep(0.05)
    elif rank == 0 and step % persist_every == 0:
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
if ckpt is not None:
    ckpt.close(job_end=rank == 0)
dist.destroy_process_group()
mark("done", step)
"""


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@dataclass
class Events:
    """Per rank: (event, world, step, t) lines the workers wrote."""

    lines: dict[int, list[tuple[str, int, int, float]]] = field(default_factory=dict)

    def first_all(self, event: str, world: int) -> float | None:
        """When every rank of a world of `world` had logged `event` (its first), or None."""
        ts = []
        for rank in range(world):
            hit = next((e[3] for e in self.lines.get(rank, []) if e[0].startswith(event) and e[1] == world), None)
            if hit is None:
                return None
            ts.append(hit)
        return max(ts)

    def first(self, rank: int, event: str, world: int) -> float | None:
        return next((e[3] for e in self.lines.get(rank, []) if e[0] == event and e[1] == world), None)

    def last(self, rank: int, event: str, world: int) -> tuple[int, float] | None:
        hits = [(e[2], e[3]) for e in self.lines.get(rank, []) if e[0] == event and e[1] == world]
        return hits[-1] if hits else None

    def loaded(self, world: int) -> str:
        return ",".join(
            sorted(
                {
                    e[0]
                    for r in range(world)
                    for e in self.lines.get(r, [])
                    if e[1] == world and (e[0].startswith("loaded") or e[0] == "fresh")
                }
            )
        )


@dataclass
class Trial:
    """What one growth measured."""

    way: str  # dlrover | torchrun
    outcome: str = "ok"
    step_s: float | None = None  # steady step time before the growth
    growth_s: float | None = None  # raise (or stop request) -> rank 0's first step at the larger size
    breakdown: dict[str, float] = field(default_factory=dict)
    loaded: str = ""
    resumed_from: str = ""  # the step the larger world resumed from, against the last one trained
    leaks: list[str] = field(default_factory=list)
    tail: str = ""


class Run:
    """The processes and files of one trial; `cleanup` ends and removes them all."""

    def __init__(self, way: str, args: argparse.Namespace) -> None:
        self.way, self.args = way, args
        self.job_id = f"grow{uuid.uuid4().hex[:10]}"
        self.tmp = Path(tempfile.mkdtemp(prefix="dlrover-growth-"))
        self.out = self.tmp / "out"
        self.out.mkdir()
        self.script = self.tmp / "growth_worker.py"
        self.script.write_text(WORKER)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[object] = []
        self.env = {**os.environ, "TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1"}
        self.env = {k: v for k, v in self.env.items() if not k.startswith(("DLROVER_JOB_TOKEN", "SLURM_"))}

    def worker_args(self, mode: str) -> list[str]:
        a = self.args
        size = str(a.state_mb * MB)
        return [str(self.script), mode, size, str(self.out), self.job_id, str(a.persist_every), str(a.step_sleep_s)]

    def start(self, cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed in cleanup)
        self.logs.append(log)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def events(self) -> Events:
        ev = Events()
        for path in self.out.glob("rank*.log"):
            rank = int(path.stem[4:])
            rows = []
            for raw in _read(path).splitlines():
                parts = raw.split()
                if len(parts) == 4:  # a line being written is skipped until complete
                    rows.append((parts[0], int(parts[1]), int(parts[2]), float(parts[3])))
            ev.lines[rank] = rows
        return ev

    def wait_for(
        self, pred: Callable[[Events], bool], timeout_s: float, *, alive: list[subprocess.Popen[bytes]]
    ) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            if pred(self.events()):
                return "ok"
            for proc in alive:
                if proc.poll() is not None:
                    return f"failed ({proc.args[2] if len(proc.args) > 2 else proc.args[0]} exited {proc.returncode})"
            if time.monotonic() > deadline:
                return "hang"
            time.sleep(0.01)

    def tail(self, n: int = 10) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.log")):
            lines = _read(path).splitlines()
            parts.append(f"--- {path.name}\n" + "\n".join(lines[-n:]))
        for path in (
            sorted((self.tmp / "state" / "logs").glob("*.log")) if (self.tmp / "state" / "logs").exists() else []
        ):
            parts.append(f"--- {path.name}\n" + "\n".join(_read(path).splitlines()[-n:]))
        return "\n".join(parts)

    def cleanup(self) -> list[str]:
        leaks: list[str] = []
        (self.out / "stop").touch()
        deadline = time.monotonic() + 60
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.poll() is None:
                leaks.append(f"{proc.args[:3]} did not end after the stop file; terminated")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=20)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for log in self.logs:
            log.close()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10.0
        while processes_mentioning(str(self.tmp)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in processes_mentioning(str(self.tmp)):
            leaks.append(f"process {pid} still running after the job; killed")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.args.keep_logs:  # where the time went: the master's, agents' and workers' logs
            dest = Path(self.args.keep_logs) / f"{self.way}-{self.job_id}"
            shutil.copytree(self.tmp, dest, ignore=shutil.ignore_patterns("*.pt", "*.tmp", "ckpt"))
        from dlrover.flashckpt import remove_run

        for path in remove_run(SHM_DIR, self.job_id, RUN_ID):
            leaks.append(f"shared memory {path} left behind; removed")
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.tmp.exists():
            leaks.append(f"temp dir {self.tmp} could not be removed")
        return leaks


def _steady(
    run: Run, trial: Trial, world: int, steps: int, *, timeout_s: float, alive: list[subprocess.Popen[bytes]]
) -> bool:
    """Wait for `steps` steps at `world`; record the steady step time."""
    status = run.wait_for(
        lambda e: len([x for x in e.lines.get(0, []) if x[0] == "step" and x[1] == world]) >= steps,
        timeout_s,
        alive=alive,
    )
    if status != "ok":
        trial.outcome = f"no steady state: {status}"
        return False
    ts = [x[3] for x in run.events().lines[0] if x[0] == "step" and x[1] == world]
    trial.step_s = statistics.median(b - a for a, b in zip(ts[-steps + 1 : -1], ts[-steps + 2 :], strict=False))
    return True


def _after(
    run: Run,
    trial: Trial,
    t0: float,
    *,
    old: int,
    new: int,
    timeout_s: float,
    alive: Callable[[], list[subprocess.Popen[bytes]]],
) -> None:
    """Wait for rank 0's first step at world `new`; record the growth time and its breakdown."""
    status = run.wait_for(lambda e: e.first(0, "step", new) is not None, timeout_s, alive=alive())
    if status != "ok":
        trial.outcome = status
        return
    ev = run.events()
    first = ev.first(0, "step", new)
    assert first is not None
    trial.growth_s = first - t0
    last_old = ev.last(0, "step", old)
    if last_old is not None and last_old[1] > t0:
        trial.breakdown["old last step"] = last_old[1] - t0
    for label, event in (("workers started", "start"), ("group joined", "joined"), ("state loaded", "loaded")):
        t = ev.first_all(event, new)
        if t is not None:
            trial.breakdown[label] = t - t0
    trial.loaded = ev.loaded(new)
    resumed = [e[2] for e in ev.lines.get(0, []) if e[1] == new and e[0].startswith("loaded")]
    trained = [s for s, _t in [(e[2], e[3]) for e in ev.lines.get(0, []) if e[0] == "step" and e[1] == old]]
    if resumed and trained:
        trial.resumed_from = f"{resumed[0]}/{max(trained)}"


def _new_nodes_registered(event_log: Path) -> float | None:
    """When (wall clock) the last node launched by the growth registered, from the master's event log."""
    from dlrover.master import read_event_log

    if not event_log.exists():
        return None
    running = [
        e["wall_time"]
        for e in read_event_log(event_log)
        if e["kind"] == "node_state" and e["data"].get("to") == "running" and e["node_id"] != 0
    ]
    return max(running) if running else None


def dlrover_trial(args: argparse.Namespace) -> Trial:
    return _dlrover_growth(args, spare=False)


def dlrover_spare_trial(args: argparse.Namespace) -> Trial:
    return _dlrover_growth(args, spare=True)


def _dlrover_growth(args: argparse.Namespace, *, spare: bool) -> Trial:
    """Without a spare: the capacity is raised from 1 node to N and the master launches the new
    nodes. With one (``--spare-nodes=1``): the job is scaled to 1 node with room for a warm spare,
    and once the spare is registered, scaled to N (`MasterClient.resize`, what ``dlrover-master
    scale N`` sends): the spare takes the new rank at once, the backend launches the rest."""
    way = "dlrover+spare" if spare else "dlrover"
    trial, run = Trial(way), Run(way, args)
    old, new = NPROC, NPROC * args.nodes
    try:
        token = write_token_file(run.tmp / "token", generate_token())
        port = free_port()
        agent = " ".join(
            [
                PYTHON,
                "-m",
                "dlrover.launcher.cli",
                f"--nnodes=1:{args.nodes}",
                f"--nproc-per-node={NPROC}",
                "--local-addr=127.0.0.1",
                f"--log-dir={run.tmp / 'agent-logs'}",
                *args.agent_flags.split(),
                *run.worker_args("flash"),
            ]
        )
        room = ["--capacity=1"] if not spare else [f"--capacity={args.nodes + 1}", "--spare-nodes=1"]
        master_cmd = [
            PYTHON, "-m", "dlrover.master.cli", "--backend=local", f"--nnodes=1:{args.nodes}", f"--port={port}",
            f"--token-file={token}", f"--state-dir={run.tmp / 'state'}", *room, f"--agent-command={agent}",
            *args.master_flags.split(),
        ]  # fmt: skip
        master = run.start(master_cmd, "master")
        from dlrover.common import RetryPolicy
        from dlrover.master.client import MasterClient

        address, secret = f"127.0.0.1:{port}", token.read_text().strip()
        if spare and not _scaled_to_one(address, secret, timeout_s=args.start_timeout_s):
            trial.outcome = "the master never answered the scale to one node"
            return trial
        if not _steady(run, trial, old, args.steady_steps, timeout_s=args.start_timeout_s, alive=[master]):
            return trial
        if spare and not _spare_running(address, secret, timeout_s=args.start_timeout_s):
            trial.outcome = "no spare running"
            return trial
        if not _standbys_warm(run, timeout_s=args.start_timeout_s):
            trial.outcome = "standby interpreters still importing"
            return trial
        with MasterClient(address, secret, policy=RetryPolicy(max_attempts=1)) as c:
            t0, t0_wall = time.monotonic(), time.time()
            if spare:
                c.resize(args.nodes, "benchmark: grow")
            else:
                c.set_capacity(args.nodes)
        _after(run, trial, t0, old=old, new=new, timeout_s=args.grow_timeout_s, alive=lambda: [master])
        registered = _new_nodes_registered(run.tmp / "state" / "events.jsonl")
        if registered is not None:
            trial.breakdown["new agents registered"] = registered - t0_wall
    except Exception as exc:  # a result, not a crash of the whole benchmark
        trial.outcome = f"error: {exc!r}"
    finally:
        if trial.outcome != "ok":
            trial.tail = run.tail()
        trial.leaks = run.cleanup()
    return trial


def _scaled_to_one(address: str, token: str, *, timeout_s: float) -> bool:
    """Scale the job to one node as soon as its master answers (it may still be starting)."""
    from dlrover.common import DLRoverError, RetryPolicy
    from dlrover.master.client import MasterClient

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with MasterClient(address, token, policy=RetryPolicy(max_attempts=1)) as c:
                c.resize(1, "benchmark: start at one node beside a warm spare")
            return True
        except DLRoverError:
            time.sleep(0.2)
    return False


def _standbys_warm(run: Run, *, timeout_s: float, sample_s: float = 0.5) -> bool:
    """Wait until the run's start-up is over: every standby interpreter kept in reserve (a node's
    standbys for its next restart, a spare's for its first workers) has finished importing, so it
    blocks on its pipe and takes no CPU. A node refills its standbys once its workers train, so a
    job that started seconds ago still imports torch in them, which a job that grows after minutes
    of training does not."""

    def reserve_cpu_ticks() -> dict[int, int]:
        workers = {int(p.name.split("-", 1)[1]) for p in run.out.glob("worker-*")}
        ticks = {}
        for pid in processes_mentioning(str(run.script)):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            fields = proc_stat_fields(pid)
            if b"dlrover.launcher._standby" in cmdline and pid not in workers and fields is not None:
                ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime (proc(5) fields 14, 15)
        return ticks

    deadline = time.monotonic() + timeout_s
    before = reserve_cpu_ticks()
    while time.monotonic() < deadline:
        time.sleep(sample_s)
        after = reserve_cpu_ticks()
        if all(pid in before and after[pid] - before[pid] <= 1 for pid in after):  # a new one counts as busy
            return True
        before = after
    return False


def _spare_running(address: str, token: str, *, timeout_s: float) -> bool:
    """Wait until the job's warm spare is registered and running."""
    from dlrover.master.client import MasterClient

    deadline = time.monotonic() + timeout_s
    with MasterClient(address, token) as c:
        while time.monotonic() < deadline:
            if any(n.state.value == "running" for n in c.job_status().spares):
                return True
            time.sleep(0.2)
    return False


def torchrun_trial(args: argparse.Namespace) -> Trial:
    trial, run = Trial("torchrun"), Run("torchrun", args)
    old, new = NPROC, NPROC * args.nodes
    try:
        one = run.start([TORCHRUN, "--standalone", f"--nproc-per-node={NPROC}", *run.worker_args("disk")], "torchrun-1")
        if not _steady(run, trial, old, args.steady_steps, timeout_s=args.start_timeout_s, alive=[one]):
            return trial
        # Stop right after a checkpoint reached storage: nothing trained is lost to the stop.
        persisted = len([e for e in run.events().lines.get(0, []) if e[0] == "persisted"])
        status = run.wait_for(
            lambda e: len([x for x in e.lines.get(0, []) if x[0] == "persisted"]) > persisted,
            args.start_timeout_s,
            alive=[one],
        )
        if status != "ok":
            trial.outcome = f"no checkpoint persisted: {status}"
            return trial
        t0 = time.monotonic()
        one.send_signal(signal.SIGTERM)
        one.wait(timeout=120)
        trial.breakdown["old job exited"] = time.monotonic() - t0
        port = free_port()
        nodes = [
            run.start([
                TORCHRUN, f"--nnodes={args.nodes}", f"--node-rank={i}", f"--nproc-per-node={NPROC}",
                "--master-addr=127.0.0.1", f"--master-port={port}", *run.worker_args("disk"),
            ], f"torchrun-{args.nodes}-{i}")
            for i in range(args.nodes)
        ]  # fmt: skip
        _after(run, trial, t0, old=old, new=new, timeout_s=args.grow_timeout_s, alive=lambda: nodes)
    except Exception as exc:
        trial.outcome = f"error: {exc!r}"
    finally:
        if trial.outcome != "ok":
            trial.tail = run.tail()
        trial.leaks = run.cleanup()
    return trial


FLOOR_MODULES = ("torch", "dlrover.flashckpt.checkpointer")  # what dlrover-run's standbys import


def import_floor_s(runs: int = 3) -> float:
    """Seconds a fresh interpreter takes to import what a new node's standby workers import (the
    median of `runs`, the machine idle): the least a growth that launches a node can take."""
    code = f"import {', '.join(FLOOR_MODULES)}"
    times = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run([PYTHON, "-c", code], check=True, timeout=300)
        times.append(time.monotonic() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 run of each")
    p.add_argument("--runs", type=int, default=3, help="growths of each way, alternated")
    p.add_argument("--nodes", type=int, default=2, help="nodes after the growth (from 1)")
    p.add_argument("--state-mb", type=int, default=32, help="MB of state per rank")
    p.add_argument("--step-sleep-s", type=float, default=0.1, help="compute stand-in per step")
    p.add_argument("--persist-every", type=int, default=10, help="torchrun: steps between persisted checkpoints")
    p.add_argument("--steady-steps", type=int, default=8, help="steps at 1 node before the growth")
    p.add_argument("--start-timeout-s", type=float, default=180.0)
    p.add_argument("--grow-timeout-s", type=float, default=180.0)
    p.add_argument("--master-flags", default="", help="extra dlrover-master flags, space-separated")
    p.add_argument("--agent-flags", default="", help="extra dlrover-run flags, space-separated")
    p.add_argument("--only", choices=("dlrover", "dlrover+spare", "torchrun"), default=None)
    p.add_argument("--keep-logs", default="", help="copy each run's logs (not its checkpoints) under this folder")
    args = p.parse_args(argv)
    runs = 1 if args.quick else args.runs
    ways = [("dlrover", dlrover_trial), ("dlrover+spare", dlrover_spare_trial), ("torchrun", torchrun_trial)]
    if args.only:
        ways = [w for w in ways if w[0] == args.only]
    print(
        f"# resize growth: 1 -> {args.nodes} nodes x {NPROC} workers, {args.state_mb} MB state/rank, "
        f"{runs} run(s) each, gloo, {os.cpu_count()} CPUs; master flags [{args.master_flags}], "
        f"agent flags [{args.agent_flags}]"
    )
    floor = import_floor_s()
    results: list[Trial] = []
    for rep in range(runs):
        for name, trial_fn in ways:  # alternated so both see the same machine load
            t = trial_fn(args)
            results.append(t)
            bd = " ".join(f"{k}={v:.2f}" for k, v in t.breakdown.items())
            print(
                f"  rep {rep} {name:<13} {t.outcome:<8} step={fmt(t.step_s)} growth={fmt(t.growth_s)} "
                f"[{bd}] {t.loaded} resumed/last={t.resumed_from}",
                flush=True,
            )
            if t.tail:
                print("    tail:\n      " + t.tail[-4000:].replace("\n", "\n      "), flush=True)
            if t.leaks:
                print(f"    leaks: {t.leaks}", flush=True)
    base = median([t.growth_s for t in results if t.way == "torchrun"])
    print(
        "\n| way | grown | step s | growth s (median) | min..max | new agents registered | old last step "
        "| workers started | group joined | state loaded | ratio vs torchrun |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, _fn in ways:
        ts = [t for t in results if t.way == name]
        gs = [t.growth_s for t in ts if t.growth_s is not None]
        med = median(list(gs))
        parts = [
            fmt(median([t.breakdown.get(k) for t in ts]))
            for k in ("new agents registered", "old last step", "workers started", "group joined", "state loaded")
        ]
        ratio = f"{med / base:.2f}x" if med is not None and base else "-"
        rng = f"{min(gs):.2f}..{max(gs):.2f}" if gs else "-"
        print(
            f"| {name} | {sum(t.outcome == 'ok' for t in ts)}/{len(ts)} | {fmt(median([t.step_s for t in ts]))} "
            f"| {fmt(med)} | {rng} | {' | '.join(parts)} | {ratio} |"
        )
    print(f"\ngoal (issue 28): dlrover growth <= {GOAL_RATIO}x torchrun's stop and restart from storage")
    for way in ("dlrover", "dlrover+spare"):
        ours = median([t.growth_s for t in results if t.way == way])
        if not any(t.way == way for t in results):
            continue
        if ours is None or not base:
            print(f"GOAL MISS ({way}): no ratio ({fmt(ours)} s, torchrun {fmt(base)} s)")
        else:
            verdict = "PASS" if ours <= GOAL_RATIO * base else "MISS"
            print(f"GOAL {verdict} ({way}): {ours:.2f} s / {base:.2f} s = {ours / base:.2f}x")
    ours = median([t.growth_s for t in results if t.way == "dlrover"])
    if ours is not None:
        # A node the master launches cannot train before a fresh interpreter imported torch (its standbys
        # do, beside its agent's start); torchrun's restart imports it twice in a row (its agent's, then
        # its workers'). So this way's floor is about one import, whatever else gets faster.
        print(
            f"floor (dlrover): a fresh interpreter's import of {', '.join(FLOOR_MODULES)} took {floor:.2f} s "
            f"(idle, median of 3): the growth took {ours / floor:.2f}x that, {ours - floor:.2f} s beyond it"
        )
    leaks = [leak for t in results for leak in t.leaks]
    print(f"leaks: {leaks or 'none'}")
    return 0 if not leaks and all(t.outcome == "ok" for t in results) else 1


if __name__ == "__main__":
    sys.exit(main())
