"""Recovery downtime on a Ray cluster: Ray Train's TorchTrainer, and DLRover's master on Ray (issue 30).

Every trial runs on a fresh real local multi-node Ray cluster (``dlrover_testsupport.ray.RayTestCluster``:
a head with no CPUs and fast node health checks, two worker nodes with 1 CPU each and, for the node
case, a third, spare one). Two CPU workers train the GPT of ``examples/gpt`` (its model, corpus,
data order, batch size and seeds, through ``examples/gpt/train.py``'s own classes), and one of two
faults is injected once training is steady:

* ``worker``: rank 1's training process is SIGKILLed;
* ``node``: the whole node running rank 1 is killed (``RayTestCluster.kill_node``: its raylet, its
  Ray workers and everything they started, SIGKILLed together, as a machine loss).

Downtime is "kill -> first step trained again": from the moment of the kill to the first ``step``
record the job writes after a new attempt ``started`` (rank 0 writes both to ``<run>/progress.jsonl``,
the format of ``examples/gpt/train.py``, with the wall-clock time ``t``; the kill time is taken on
the same host's clock). Steps lost: the last step recorded before the kill minus the step training
resumed from.

The ways (each started by a function that returns a `Job`; kill injection and timing are shared):

* ``ray-train``: ``ray.train.torch.TorchTrainer`` (public API), 2 workers (``num_workers=(1, 2)``,
  elastic, in the node case), ``FailureConfig(max_failures=-1)``. Checkpoints: after every step rank 0
  ``torch.save``s model, optimizer and step into a temporary directory and every rank calls
  ``ray.train.report(metrics, checkpoint=...)`` (rank 0 with the checkpoint; Ray Train persists it
  synchronously to the run's ``storage_path`` on local disk, keeping 2); a restarted worker group
  resumes from ``ray.train.get_checkpoint()``. Ray Train is tuned as far as its settings go:
  ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.5``, ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=10``.
* ``dlrover``: ``dlrover-master --backend ray --ray-address ADDR --nnodes 2 ... -- dlrover-run
  --nnodes=2 --nproc-per-node=1 examples/gpt/train.py`` (flash checkpoint to memory every step).
  Measured only where this checkout's ``dlrover-master`` has the Ray backend; otherwise its rows
  say why and carry no number.

    python benchmarks/ray_recovery.py                  # both ways, both faults, 3 runs each
    python benchmarks/ray_recovery.py --runs 1 --ways ray-train --cases worker

The goal (issue 30): DLRover's downtime at most 0.3x Ray Train's for both faults. Every wait is
bounded (a job that does not recover in time is recorded as a hang); every cluster is shut down and
checked to leave nothing behind (``RayClusterLeakError``), and the run's temporary directory is removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import fmt, free_port, median

ROOT = Path(__file__).resolve().parent.parent
GPT_DIR = ROOT / "examples" / "gpt"
sys.path.insert(0, str(ROOT / "testsupport" / "src"))  # the Ray test cluster (test support, not a product package)

from dlrover_testsupport.ray import RayTestCluster  # noqa: E402

PYTHON = sys.executable
KILL_RANK = 1
GOAL_RATIO = 0.3  # issue 30: DLRover's downtime at most this times Ray Train's
CASES = ("worker", "node")
# Ray Train tuned for fast recovery (PLATFORMS.md): how often the controller polls its workers,
# and how long it waits for a worker group to start before trying again.
RAY_TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}


class WayUnavailable(Exception):
    """A way cannot run in this checkout (the message says why); its rows carry no number."""


# -- the Ray Train way ------------------------------------------------------------------------------


def ray_train_loop(config: dict[str, Any]) -> None:
    """Ray Train's training function: examples/gpt/train.py's model, data and step, with a Ray Train
    checkpoint reported every step. Runs in each Ray Train worker (shipped there by Ray)."""
    import tempfile as tmp
    import time as clock
    from pathlib import Path as P

    import ray.train
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, config["gpt_dir"])
    import train as gpt  # examples/gpt/train.py: its argument defaults, corpus and data order
    from corpus import generate
    from model import CharGPT

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    out = P(config["out"])
    (out / f"rank{rank}.pid.tmp").write_text(f"{os.getpid()}\n")
    os.replace(out / f"rank{rank}.pid.tmp", out / f"rank{rank}.pid")
    args = gpt.parse_args(["--out", str(out), "--steps", str(config["steps"])])
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    progress = gpt.JsonLines(out / "progress.jsonl") if rank == 0 else gpt.NullLines()
    progress.write(event="started", world=world, mode="ray-train", pid=os.getpid(), t=clock.time())
    num_samples = args.steps * args.batch * world
    corpus = gpt.Corpus(generate(num_samples * args.context + 1, args.seed), args.context, num_samples)
    order = gpt.PlainBackend(args, num_samples, rank, world)  # only its seeded data order (take)
    torch.manual_seed(args.seed)
    model = CharGPT(context=args.context, width=args.width, layers=args.layers, heads=args.heads)
    ddp = DistributedDataParallel(model)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step = 0
    restored = ray.train.get_checkpoint()
    if restored is not None:
        t0 = clock.time()
        with restored.as_directory() as d:
            state = torch.load(P(d) / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step = int(state["step"])
        progress.write(event="resumed", step=step, source="ray-train", load_s=clock.time() - t0, t=clock.time())
    while step < args.steps:
        inputs, targets = corpus.batch(order.take(step))
        optim.zero_grad(set_to_none=True)
        _, loss = ddp(inputs, targets)
        loss.backward()
        optim.step()
        step += 1
        loss_sum = loss.detach().clone()
        dist.all_reduce(loss_sum)
        with tmp.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0:
                state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
                torch.save(state, P(d) / "state.pt")
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"step": step, "loss": float(loss_sum) / world}, checkpoint=checkpoint)
        progress.write(event="step", step=step, loss=float(loss_sum) / world, t=clock.time())
    progress.close()


def ray_train_driver(argv: Sequence[str]) -> int:
    """The Ray Train driver (`--driver`): a process of its own, so the benchmark can kill beside it."""
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--elastic", action="store_true")
    args = p.parse_args(argv)
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=args.address, _temp_dir=args.temp_dir, log_to_driver=False)
    trainer = TorchTrainer(
        ray_train_loop,
        train_loop_config={"gpt_dir": str(GPT_DIR), "out": args.out, "steps": args.steps},
        scaling_config=ScalingConfig(
            num_workers=(1, 2) if args.elastic else 2, use_gpu=False, resources_per_worker={"CPU": 1}
        ),
        run_config=RunConfig(
            name="ray-recovery",
            storage_path=str(Path(args.out) / "storage"),
            failure_config=FailureConfig(max_failures=-1),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    trainer.fit()
    ray.shutdown()
    return 0


@dataclass
class Job:
    """A running job of one way: its process (driver or master), its run folder and progress file."""

    way: str
    proc: subprocess.Popen[bytes]
    run_dir: Path
    log: Path
    settings: str

    @property
    def progress(self) -> Path:
        return self.run_dir / "progress.jsonl"

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the job's process group, SIGKILL it after `grace_s`."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)


def start_ray_train(cluster: RayTestCluster, run_dir: Path, case: str, args: argparse.Namespace) -> Job:
    """Ray Train's TorchTrainer on the cluster (the driver in a process of its own)."""
    env = {**os.environ, **cluster.env, **RAY_TRAIN_ENV}
    cmd = [PYTHON, __file__, "--driver", "--address", cluster.address, "--temp-dir", cluster.temp_dir]
    cmd += ["--out", str(run_dir), "--steps", str(args.steps)]
    elastic = case == "node"
    if elastic:
        cmd.append("--elastic")
    workers = "num_workers=(1, 2)" if elastic else "num_workers=2"
    settings = f"{workers}, " + ", ".join(f"{k}={v}" for k, v in RAY_TRAIN_ENV.items())
    return Job("ray-train", _spawn(cmd, env, run_dir / "driver.log"), run_dir, run_dir / "driver.log", settings)


# -- the DLRover way ----------------------------------------------------------------------------------


def check_dlrover() -> None:
    """Raises WayUnavailable, saying why, where this checkout's dlrover-master has no Ray backend."""
    try:
        from dlrover.master.cli import BACKENDS
    except ImportError as e:
        raise WayUnavailable(f"dlrover.master cannot be imported: {e}") from e
    if "ray" not in BACKENDS:
        raise WayUnavailable(f"this checkout's dlrover-master has no Ray backend (--backend: {', '.join(BACKENDS)})")


def start_dlrover(cluster: RayTestCluster, run_dir: Path, case: str, args: argparse.Namespace) -> Job:
    """DLRover's master on the cluster (`--backend ray`), one agent actor per node running
    `dlrover-run` with examples/gpt/train.py, which writes the same progress records.

    Raises:
        WayUnavailable: this checkout's dlrover-master has no Ray backend.
    """
    check_dlrover()
    from dlrover.common import generate_token

    token_file = run_dir / "token"
    token_file.write_text(generate_token())
    token_file.chmod(0o600)
    port = free_port()
    # The node case keeps the third Ray node as a warm spare (an agent registered, its workers' imports
    # done), as a DLRover job on a cluster with room would; the worker case restarts in place.
    spares = ["--spare-nodes=1"] if case == "node" else []
    agent = [
        PYTHON, "-m", "dlrover.launcher.cli", "--nnodes=2", "--nproc-per-node=1", "--max-restarts=3",
        "--monitor-interval=0.1", "--heartbeat-interval=0.5", f"--log-dir={run_dir / 'agent-logs'}",
        *args.agent_flags.split(),
        str(GPT_DIR / "train.py"), "--out", str(run_dir), "--steps", str(args.steps), "--persist-every", "50",
    ]  # fmt: skip
    cmd = [
        PYTHON, "-m", "dlrover.master.cli", "--backend=ray", f"--ray-address={cluster.address}",
        f"--ray-temp-dir={cluster.temp_dir}", "--nnodes=2", f"--port={port}", f"--token-file={token_file}",
        f"--state-dir={run_dir / 'master'}", "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=0", *spares,
        *args.master_flags.split(), "--agent-command", shlex.join(agent),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_")}
    env.update(cluster.env)
    flags = " ".join([*spares, args.master_flags, args.agent_flags]).strip()
    settings = "flash checkpoint every step, " + (flags or "defaults")
    return Job("dlrover", _spawn(cmd, env, run_dir / "master.log"), run_dir, run_dir / "master.log", settings)


WAYS: dict[str, Callable[[RayTestCluster, Path, str, argparse.Namespace], Job]] = {
    "ray-train": start_ray_train,
    "dlrover": start_dlrover,
}
# What a way needs that a cluster cannot give (checked before starting one): raise WayUnavailable.
WAY_CHECKS: dict[str, Callable[[], None]] = {"dlrover": check_dlrover}


# -- progress records, kill injection, timing (shared by every way) -----------------------------------


def read_progress(path: Path) -> list[dict[str, Any]]:
    """The records of a progress file written so far (a line being written is left for later)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return records


def wait_steady(job: Job, steps: int, timeout_s: float) -> float:
    """Wait until the job has trained `steps` steps; returns the wall time its first step ended.

    Raises:
        RuntimeError: the job ended, or did not get there within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        done = [r for r in read_progress(job.progress) if r.get("event") == "step"]
        if len(done) >= steps:
            return float(done[0]["t"])
        if job.proc.poll() is not None:
            raise RuntimeError(f"{job.way} ended (exit {job.proc.returncode}) before training:\n{job.tail()}")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{job.way} did not train {steps} steps within {timeout_s} s:\n{job.tail()}")
        time.sleep(0.05)


def rank_pid(run_dir: Path, rank: int) -> int:
    """The training process of `rank` (train.py and the Ray Train loop write `rank<R>.pid`)."""
    return int((run_dir / f"rank{rank}.pid").read_text())


def kill_worker(cluster: RayTestCluster, job: Job, rank: int) -> float:
    """SIGKILL the training process of `rank`; returns the wall time of the kill."""
    pid = rank_pid(job.run_dir, rank)
    t = time.time()
    os.kill(pid, signal.SIGKILL)
    return t


def kill_node_of(cluster: RayTestCluster, job: Job, rank: int) -> float:
    """Kill the whole Ray node that runs `rank`'s training process; returns the wall time of the kill.

    Raises:
        RuntimeError: no node of the cluster runs that process.
    """
    pid = rank_pid(job.run_dir, rank)
    node = cluster.node_running(pid)
    if node is None:
        raise RuntimeError(f"no Ray node runs rank {rank}'s process {pid}")
    t = time.time()
    cluster.kill_node(node)
    return t


KILLS: dict[str, Callable[[RayTestCluster, Job, int], float]] = {"worker": kill_worker, "node": kill_node_of}


@dataclass
class Recovery:
    """What one fault cost: downtime (None: no step within the timeout), the step at the kill and the
    step training resumed from."""

    downtime_s: float | None
    step_at_kill: int | None
    resumed_from: int | None
    note: str = ""


def wait_recovered(job: Job, t_kill: float, timeout_s: float) -> Recovery:
    """Wait for the first step trained by an attempt started after `t_kill`; the downtime runs from the
    kill to that step's record."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_progress(job.progress)
        before = [r for r in records if r.get("event") == "step" and r["t"] <= t_kill]
        step_at_kill = int(before[-1]["step"]) if before else None
        restarted = next((i for i, r in enumerate(records) if r.get("event") == "started" and r["t"] > t_kill), None)
        if restarted is not None:
            later = records[restarted:]
            first = next((r for r in later if r.get("event") == "step"), None)
            if first is not None:
                resumed = next((int(r["step"]) for r in later if r.get("event") == "resumed"), int(first["step"]) - 1)
                return Recovery(float(first["t"]) - t_kill, step_at_kill, resumed)
        if job.proc.poll() is not None:
            return Recovery(None, step_at_kill, None, f"the job ended (exit {job.proc.returncode})")
        if time.monotonic() >= deadline:
            return Recovery(None, step_at_kill, None, f"no step within {timeout_s} s (a hang)")
        time.sleep(0.05)


@dataclass
class Trial:
    way: str
    case: str
    recovery: Recovery | None = None
    settings: str = ""
    error: str = ""
    leaks: list[str] = field(default_factory=list)


def run_trial(way: str, case: str, args: argparse.Namespace) -> Trial:
    """One fault on a fresh cluster: start the way's job, wait until steady, kill, time the recovery."""
    trial = Trial(way, case)
    try:
        WAY_CHECKS.get(way, lambda: None)()
    except WayUnavailable as e:
        trial.error = f"not measured: {e}"
        return trial
    run_dir = Path(tempfile.mkdtemp(prefix="ray-recovery-"))
    job: Job | None = None
    cluster = RayTestCluster(start_timeout_s=args.start_timeout_s)
    try:
        cluster.start()
        cluster.add_nodes(3 if case == "node" else 2, num_cpus=1)  # the third: the spare
        job = WAYS[way](cluster, run_dir, case, args)
        trial.settings = job.settings
        wait_steady(job, args.steady_steps, args.start_timeout_s)
        t_kill = KILLS[case](cluster, job, KILL_RANK)
        trial.recovery = wait_recovered(job, t_kill, args.recover_timeout_s)
    except WayUnavailable as e:
        trial.error = f"not measured: {e}"
    except Exception as e:  # a failed trial is a result: reported, and the next one runs
        trial.error = f"{type(e).__name__}: {e}"
    finally:
        if job is not None:
            job.stop()
        try:
            cluster.shutdown()
        except Exception as e:
            trial.leaks.append(str(e))
        if args.keep:
            print(f"  kept {run_dir}", flush=True)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    return trial


def table(trials: list[Trial], ways: list[str], cases: list[str]) -> list[str]:
    lines = [
        "| way | fault | runs | downtime median (s) | downtime range (s) | steps lost (median) | settings |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        for way in ways:
            mine = [t for t in trials if t.way == way and t.case == case]
            downs = [t.recovery.downtime_s for t in mine if t.recovery and t.recovery.downtime_s is not None]
            lost = [
                float(t.recovery.step_at_kill - t.recovery.resumed_from)
                for t in mine
                if t.recovery and t.recovery.step_at_kill is not None and t.recovery.resumed_from is not None
            ]
            span = f"{fmt(min(downs))}-{fmt(max(downs))}" if downs else "-"
            notes = sorted({t.error or (t.recovery.note if t.recovery else "") for t in mine} - {""})
            settings = next((t.settings for t in mine if t.settings), "")
            cell = "; ".join([settings, *notes]) if settings else "; ".join(notes)
            lines.append(f"| {way} | {case} | {len(downs)}/{len(mine)} | {fmt(median(downs))} | {span} | "
                         f"{fmt(median(lost))} | {cell} |")  # fmt: skip
    return lines


def goal(trials: list[Trial], cases: list[str]) -> str:
    verdicts = []
    for case in cases:
        ours = median(t.recovery.downtime_s for t in trials if t.way == "dlrover" and t.case == case and t.recovery)
        theirs = median(t.recovery.downtime_s for t in trials if t.way == "ray-train" and t.case == case and t.recovery)
        if ours is None or theirs is None:
            return f"GOAL NOT JUDGED: {case}: both ways must be measured"
        verdicts.append((case, ours / theirs))
    text = ", ".join(f"{case} {ratio:.2f}x" for case, ratio in verdicts)
    ok = all(ratio <= GOAL_RATIO for _, ratio in verdicts)
    return f"GOAL {'PASS' if ok else 'MISS'}: DLRover / Ray Train downtime {text} (goal <= {GOAL_RATIO}x)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--driver"]:
        return ray_train_driver(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="faults of each kind per way")
    p.add_argument("--ways", default="ray-train,dlrover", help=f"comma-separated, of {', '.join(WAYS)}")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--steps", type=int, default=400, help="steps of the job (it is stopped once recovered)")
    p.add_argument("--steady-steps", type=int, default=10, help="steps trained before the fault")
    p.add_argument("--start-timeout-s", type=float, default=300.0)
    p.add_argument("--recover-timeout-s", type=float, default=240.0)
    p.add_argument("--master-flags", default="", help="extra dlrover-master flags, space-separated")
    p.add_argument("--agent-flags", default="", help="extra dlrover-run flags, space-separated")
    p.add_argument("--keep", action="store_true", help="keep each trial's run folder (logs, progress)")
    args = p.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: every cluster and run folder is cleaned up on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ways = [w for w in args.ways.split(",") if w]
    cases = [c for c in args.cases.split(",") if c]
    if bad := [w for w in ways if w not in WAYS] + [c for c in cases if c not in CASES]:
        p.error(f"unknown way or fault: {', '.join(bad)}")
    if args.runs <= 0 or args.steady_steps <= 0 or args.steps <= args.steady_steps:
        p.error("--runs and --steady-steps must be positive and --steps larger than --steady-steps")
    print(f"# Recovery downtime on a local Ray cluster (kill -> first step trained again), {args.runs} run(s)")
    print("2 CPU workers on 2 worker nodes (1 CPU each; a spare third node in the node case), head without CPUs, "
          "Ray node health checks every 0.5 s; the GPT of examples/gpt (batch 16 per rank, seed 0).")  # fmt: skip
    print("Ray Train checkpoints: rank 0 torch.save()s model, optimizer and step and ray.train.report()s it after "
          "every step (persisted synchronously to local disk, 2 kept). DLRover: flash checkpoint to shared memory "
          "after every step.\n", flush=True)  # fmt: skip
    trials: list[Trial] = []
    for run in range(args.runs):
        for case in cases:
            for way in ways:  # alternated, so a slower spell of the host hits both ways
                started = time.monotonic()
                trial = run_trial(way, case, args)
                trials.append(trial)
                r = trial.recovery
                what = (
                    trial.error
                    or (r and r.note)
                    or (r and f"downtime {fmt(r.downtime_s)} s, step {r.step_at_kill} -> resumed from {r.resumed_from}")
                )
                print(f"run {run + 1} {way:9s} {case:6s}: {what} ({time.monotonic() - started:.0f} s)", flush=True)
                for leak in trial.leaks:
                    print(f"  LEAK: {leak}", flush=True)
    print()
    print("\n".join(table(trials, ways, cases)))
    print()
    print(goal(trials, cases))
    return 1 if any(t.leaks for t in trials) else 0


if __name__ == "__main__":
    sys.exit(main())
