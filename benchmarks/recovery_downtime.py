"""Recovery downtime: SIGKILL one worker, time until training steps again (issue 9).

Two ranks train a toy job over gloo whose state holds S bytes per rank (a few big float32
tensors and a tiny model). Each step is one small all_reduce plus touching the state, then a
checkpoint of the whole state:

* ``dlrover-run`` + flash: `FlashCheckpointer.save` to shared memory after every step; a
  restarted worker loads the newest step both ranks hold from memory.
* ``torchrun --max-restarts`` + disk: ``torch.save`` of the state to local disk after every
  step (temp file + rename, no fsync; two files kept per rank); a restarted worker agrees with
  its peer on the newest step both hold and ``torch.load`` s it. Saving every step makes both
  sides lose at most one step, so the comparison is about recovery, not about lost work.

Workers append ``event attempt step CLOCK_MONOTONIC`` lines to one file per rank; the monotonic
clock is system-wide on Linux, so the driver's kill time and the workers' step times compare
directly. Measured per repetition:

* downtime: SIGKILL of rank 1 -> both ranks completed their first step after the restart (the
  kill comes once the job is in steady state: a few checkpoints saved and at least ``--settle-s``
  after the first step);
* time lost: over the kill and the first ``--after-steps`` steps after the restart, the time
  beyond what those steps take in steady state, ``t(both ranks completed step N after the
  restart) - t(kill) - N * step``; it also counts what slows the steps right after the restart
  (a persist still running beside them), which the downtime cannot see. For ``torchrun`` + disk
  the steady step is mostly its own ``torch.save``, whose speed swings with the page cache, so
  its time lost is rough (it can even come out negative; no ratio is printed then);
* startup: launcher start -> both ranks completed their first step.

    python benchmarks/recovery_downtime.py              # 256 MB and 1 GB, 3 repetitions
    python benchmarks/recovery_downtime.py --quick      # 64 MB, 1 repetition
    python benchmarks/recovery_downtime.py --sizes 64,256 --runs 5 --also-dlrover-disk

The goal (issue 9): at 256 MB and 1 GB per rank, the downtime of ``dlrover-run`` + flash is at
most 0.3x that of ``torchrun`` + disk. The last line says ``GOAL PASS`` when the run covered both
sizes and met it at each, else ``GOAL MISS`` and why (``--quick`` covers neither size).

Every wait is bounded: a job that does not recover in time is recorded as a hang (a result),
then torn down. Processes, shared memory (the run's ``/dev/shm/dlrover-fc.*`` segments and the
agent's ``/dev/shm/dlrover-node-*`` dir) and temp dirs are removed after every run and checked to
be gone; only what this run's own jobs made is counted, so other runs on the host do not matter.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchkit import fmt, median

from dlrover.common import ProcessIdentity, proc_stat_fields, processes_mentioning

PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SHM_DIR = "/dev/shm"  # where flashckpt keeps its segments
RUN_ID = "r"
KILL_RANK = 1
MB = 1 << 20
NODE_SHM_PREFIX = "dlrover-node-"  # dlrover.launcher.agent.NODE_SHM_PREFIX: an agent's own dir
GOAL_RATIO = 0.3  # issue 9: dlrover-run + flash downtime at most this times torchrun + disk's
GOAL_SIZES_MB = (256, 1024)

WORKER = r"""
import os, sys, time
T_START = time.monotonic()
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist

mode, size_bytes, out, job_id = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
log = open(out / f"rank{rank}.log", "a", buffering=1)
(out / f"rank{rank}.pid").write_text(f"{os.getpid()}\n")


def mark(event, step=-1, t=None):
    log.write(f"{event} {attempt} {step} {time.monotonic() if t is None else t:.6f}\n")


mark("start", t=T_START)
stall = os.environ.get("BENCH_STALL_RANK_ON_RESTART", "")
if stall and int(stall) == rank and attempt == 1:
    # The "restarted worker cannot join" scenario: sleep (no CPU) instead of joining.
    mark("stalling")
    time.sleep(3600)
dist.init_process_group("gloo")
mark("joined")

n_big = 4
numel = max(1, size_bytes // 4 // n_big)
model = torch.nn.Linear(16, 16)
state = {f"t{i}": torch.zeros(numel) for i in range(n_big)}
state["model"] = model.state_dict()
state["step"] = 0
mark("allocated")
ckpt_dir = out / "ckpt"
ckpt_dir.mkdir(exist_ok=True)

step = 0
if mode == "flash":
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig, torch_distributed_agree

    ckpt = FlashCheckpointer(
        StagerConfig(job_id=job_id, run_id="r", rank=rank, world_size=world),
        str(ckpt_dir),
        agree=torch_distributed_agree(),
    )
    mark("checkpointer")
    if rank == 0 and ckpt.client is not None:
        (out / "saver.pid").write_text(f"{ckpt.client.saver_pid}\n")
    try:
        loaded = ckpt.load(target=state)
        step = int(loaded.state["step"])
        mark("loaded-" + loaded.source, step)
    except NoCheckpointError:
        mark("fresh")
    # Allocate and pre-fault the slots before training, as the flashckpt README says to: without
    # it the first save into each slot pays its page faults (seconds at 1 GB).
    ckpt.prepare(state)

    def save(step):
        state["step"] = step
        ckpt.save(step, state)
else:
    mine = sorted(int(p.name.split(".")[1][1:]) for p in ckpt_dir.glob(f"rank{rank}.s*.pt"))
    newest = torch.tensor([mine[-1] if mine else -1], dtype=torch.int64)
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)  # the newest step both ranks hold
    agreed = int(newest.item())
    if agreed >= 0:
        loaded = torch.load(ckpt_dir / f"rank{rank}.s{agreed}.pt", weights_only=True)
        for k, v in loaded.items():
            if isinstance(v, torch.Tensor):
                state[k].copy_(v)
        model.load_state_dict(loaded["model"])
        step = int(loaded["step"])
        mark("loaded-disk", step)
    else:
        mark("fresh")

    def save(step):
        state["step"] = step
        tmp = ckpt_dir / f"rank{rank}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, ckpt_dir / f"rank{rank}.s{step}.pt")
        stale = ckpt_dir / f"rank{rank}.s{step - 2}.pt"
        if stale.exists():
            stale.unlink()

stop_file = out / "stop"
while True:
    step += 1
    flags = torch.tensor([1.0, float(stop_file.exists())])
    dist.all_reduce(flags)  # the step's collective; also agrees on stopping
    with torch.no_grad():
        for i in range(n_big):
            state[f"t{i}"][: 1 << 16].add_(1.0)
        model.weight.add_(0.001)
    mark("step", step)
    save(step)
    mark("saved", step)
    if flags[1].item() > 0:
        break
dist.barrier()
if mode == "flash":
    ckpt.close(job_end=rank == 0)  # rank 0 tells the saver the job ended; it removes the memory
dist.destroy_process_group()
mark("done", step)
"""


# ---------------------------------------------------------------------------------- processes


def descendants(root: int) -> list[int]:
    """Live descendants of `root` (by parent pid), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat_fields(int(entry))
            if fields is not None and fields[0] != "Z":
                parent[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def worker_pid(root: int, out: Path, rank: int) -> int | None:
    """The worker of `rank` (from the pid file it writes at start) if it is among `root`'s descendants.

    Not from /proc/PID/environ: a worker started from a standby (``--prewarm``) got its RANK after
    exec, and /proc shows only the environment a process was exec'ed with.
    """
    text = _read(str(out / f"rank{rank}.pid")).decode().strip()
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if pid in descendants(root) else None


# ---------------------------------------------------------------------------------- one job


@dataclass
class Events:
    """Per rank: (event, attempt, step, t) lines the workers wrote."""

    by_rank: dict[int, list[tuple[str, int, int, float]]] = field(default_factory=dict)

    def first(self, rank: int, event: str, min_attempt: int = 0) -> tuple[str, int, int, float] | None:
        return next((e for e in self.by_rank.get(rank, []) if e[0] == event and e[1] >= min_attempt), None)

    def first_all(self, event: str, ranks: int, min_attempt: int = 0) -> float | None:
        """When every rank had logged `event` (in an attempt >= min_attempt), or None."""
        ts = [self.first(r, event, min_attempt) for r in range(ranks)]
        return max(e[3] for e in ts if e is not None) if all(ts) else None

    def nth_all(self, event: str, ranks: int, n: int, min_attempt: int = 0) -> float | None:
        """When every rank had logged `event` `n` times (in attempts >= min_attempt), or None."""
        ts = []
        for r in range(ranks):
            hits = [e[3] for e in self.by_rank.get(r, []) if e[0] == event and e[1] >= min_attempt]
            if len(hits) < n:
                return None
            ts.append(hits[n - 1])
        return max(ts)

    def last(self, rank: int) -> tuple[str, int, int, float] | None:
        lines = self.by_rank.get(rank, [])
        return lines[-1] if lines else None


class Job:
    """One launcher run of the worker script, from start to a verified clean-up."""

    def __init__(self, launcher: str, mode: str, size_bytes: int, max_restarts: int, extra: list[str] | None = None):
        self.launcher, self.mode, self.size_bytes = launcher, mode, size_bytes
        self.job_id = f"bench{uuid.uuid4().hex[:10]}"
        self.tmp = Path(tempfile.mkdtemp(prefix="dlrover-recovery-"))
        self.out = self.tmp / "out"
        self.out.mkdir()
        self.script = self.tmp / "recovery_worker.py"
        self.script.write_text(WORKER)
        self.max_restarts = max_restarts
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.launcher_id: ProcessIdentity | None = None
        self.t_launch = 0.0

    def command(self) -> list[str]:
        common = [
            "--standalone",
            "--nproc-per-node=2",
            f"--max-restarts={self.max_restarts}",
            f"--log-dir={self.tmp / 'logs'}",
            *self.extra,
        ]
        args = [str(self.script), self.mode, str(self.size_bytes), str(self.out), self.job_id]
        if self.launcher == "dlrover-run":
            return [PYTHON, "-m", "dlrover.launcher.cli", *common, *args]
        return [TORCHRUN, *common, *args]

    def start(self, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1", **(env or {})}
        self.launcher_log = open(self.tmp / "launcher.log", "wb")  # noqa: SIM115 (closed in cleanup)
        self.t_launch = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self.launcher_log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,  # one killpg ends the launcher and its workers
        )
        # dlrover-run's agent runs in the launcher process and names its shared-memory dir after it.
        self.launcher_id = ProcessIdentity.of(self.proc.pid)

    def shm_globs(self) -> list[str]:
        """Patterns, relative to /dev/shm, of every shared-memory file this job may have made."""
        globs = [f"dlrover-fc.{self.job_id}.*"]
        if self.launcher_id is not None:
            globs.append(f"{NODE_SHM_PREFIX}{self.launcher_id.pid}-{self.launcher_id.start_ticks}-*")
        return globs

    def events(self) -> Events:
        ev = Events()
        for rank in range(2):
            lines = []
            for raw in _read(str(self.out / f"rank{rank}.log")).decode(errors="replace").splitlines():
                parts = raw.split()
                if len(parts) == 4:  # a line being written is skipped until complete
                    lines.append((parts[0], int(parts[1]), int(parts[2]), float(parts[3])))
            ev.by_rank[rank] = lines
        return ev

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_for(self, pred: Callable[[Events], bool], timeout_s: float) -> tuple[Events, str]:
        """Poll the logs until `pred(events)` is true: ("ok"), the launcher exits, or time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            ev = self.events()
            if pred(ev):
                return ev, "ok"
            rc = self.exited()
            if rc is not None:
                return self.events(), f"failed (launcher exited {rc})"
            if time.monotonic() > deadline:
                return ev, "hang"
            time.sleep(0.02)

    def kill_rank(self, rank: int) -> tuple[int | None, float]:
        assert self.proc is not None
        pid = worker_pid(self.proc.pid, self.out, rank)
        t = time.monotonic()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid, t

    def stop(self, timeout_s: float) -> str:
        """Ask the workers to stop at the next step; wait for the launcher to exit."""
        (self.out / "stop").touch()
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return "hang at stop"
        return "ok" if rc == 0 else f"exit {rc}"

    def tail(self, n: int = 12) -> str:
        """The launcher's last lines, after the distinct error lines of its workers."""
        lines = _read(str(self.tmp / "launcher.log")).decode(errors="replace").splitlines()
        errors = list(dict.fromkeys(ln for ln in lines if "Error" in ln and "Traceback" not in ln))[-6:]
        return "\n".join([*errors, "...", *lines[-n:]])

    def cleanup(self) -> list[str]:
        """End everything of this run; return what was still there (should be nothing)."""
        leaks: list[str] = []
        if self.proc is not None:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.launcher_log.close()
        # The detached saver lives in its own session; at a clean end it exits by itself.
        deadline = time.monotonic() + 10.0
        while processes_mentioning(str(self.tmp)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in processes_mentioning(str(self.tmp)):
            cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")[:120]
            leaks.append(f"process {pid} ({cmd}) still running after the job; killed")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        from dlrover.flashckpt import remove_run

        for path in remove_run(SHM_DIR, self.job_id, RUN_ID):
            leaks.append(f"shared memory {path} left behind; removed")
        # The launcher has exited (killed above at the latest), so its agent's dir is ownerless.
        for name in shm_leftovers(self.shm_globs()):
            leaks.append(f"shared memory {name} left behind; removed")
            full = Path(SHM_DIR) / name
            if full.is_dir() and not full.is_symlink():
                shutil.rmtree(full, ignore_errors=True)
            else:
                full.unlink(missing_ok=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.tmp.exists():
            leaks.append(f"temp dir {self.tmp} could not be removed")
        return leaks


# ---------------------------------------------------------------------------------- one trial


@dataclass
class Trial:
    """What one launch-kill-recover run measured."""

    launcher: str
    mode: str
    size_mb: int
    label: str = ""  # launcher + checkpoint mode + extra flags
    outcome: str = "ok"  # ok | hang | failed (...) | no worker to kill
    startup_s: float | None = None
    step_s: float | None = None  # steady step time before the kill, checkpoint included
    downtime_s: float | None = None
    lost_s: float | None = None  # kill -> N steps after the restart, minus N steady steps
    breakdown: dict[str, float] = field(default_factory=dict)
    stuck_at: str = ""  # where each rank's log stopped, when it did not recover
    loaded: str = ""  # how the restarted ranks got their state: loaded-memory, loaded-disk, fresh
    leaks: list[str] = field(default_factory=list)
    shm_globs: list[str] = field(default_factory=list)  # what the job's shared memory is named like
    tail: str = ""
    events: Events | None = None  # the workers' logs once recovered, hung or failed after the kill


def run_trial(
    launcher: str,
    mode: str,
    size_mb: int,
    *,
    steady_steps: int = 3,
    after_steps: int = 5,
    settle_s: float = 10.0,
    start_timeout_s: float = 180.0,
    recover_timeout_s: float = 180.0,
    stop_timeout_s: float = 60.0,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Trial:
    """Launch, wait for steady state, SIGKILL rank 1, wait for both ranks to step again, stop."""
    trial = Trial(launcher, mode, size_mb, label=_label(launcher, mode, extra or []))
    job = Job(launcher, mode, size_mb * MB, max_restarts=3, extra=extra)
    try:
        job.start(env)
        trial.shm_globs = job.shm_globs()
        ev, status = job.wait_for(lambda e: e.first_all("step", 2) is not None, start_timeout_s)
        if status != "ok":
            trial.outcome, trial.stuck_at = f"no first step: {status}", _stage(ev)
            return trial
        t_first = ev.first_all("step", 2)
        assert t_first is not None
        trial.startup_s = t_first - job.t_launch
        first_step = min(e[2] for e in ev.by_rank[0] if e[0] == "step")
        target = first_step + steady_steps

        def steady(e: Events) -> bool:
            return all(any(x[0] == "saved" and x[2] >= target for x in e.by_rank[r]) for r in range(2))

        ev, status = job.wait_for(steady, start_timeout_s)
        if status != "ok":
            trial.outcome, trial.stuck_at = f"no steady state: {status}", _stage(ev)
            return trial
        # A job in steady state, not one still starting: the kill comes `settle_s` after the
        # first step at the earliest (with standbys, the default, those for the restart are started
        # once the workers are training, and need about as long as a worker's imports).
        time.sleep(max(0.0, t_first + settle_s - time.monotonic()))
        ev = job.events()
        saved = [x[3] for x in ev.by_rank[0] if x[0] == "saved"]
        trial.step_s = statistics.median(b - a for a, b in itertools.pairwise(saved))
        pid, t_kill = job.kill_rank(KILL_RANK)
        if pid is None:
            trial.outcome = "no worker to kill"
            return trial
        ev, status = job.wait_for(lambda e: e.first_all("step", 2, min_attempt=1) is not None, recover_timeout_s)
        trial.events = ev
        if status != "ok":
            trial.outcome, trial.stuck_at = status, _stage(ev)
            return trial
        t_back = ev.first_all("step", 2, min_attempt=1)
        assert t_back is not None
        trial.downtime_s = t_back - t_kill
        for label, event in (
            ("workers started", "start"),
            ("process group joined", "joined"),
            ("state allocated", "allocated"),
            ("checkpointer ready", "checkpointer"),
        ):
            t = ev.first_all(event, 2, min_attempt=1)
            if t is not None:
                trial.breakdown[label] = t - t_kill
        loads = [
            next((x for x in ev.by_rank[r] if x[1] >= 1 and x[0].startswith(("loaded", "fresh"))), None)
            for r in range(2)
        ]
        if all(loads):
            trial.breakdown["state loaded"] = max(x[3] for x in loads if x is not None) - t_kill
            trial.loaded = ",".join(sorted({x[0] for x in loads if x is not None}))
        ev, status = job.wait_for(
            lambda e: e.nth_all("step", 2, after_steps, min_attempt=1) is not None, recover_timeout_s
        )
        t_after = ev.nth_all("step", 2, after_steps, min_attempt=1)
        if t_after is not None and trial.step_s is not None:
            trial.lost_s = t_after - t_kill - after_steps * trial.step_s
        status = job.stop(stop_timeout_s)
        if status != "ok":
            trial.outcome = f"recovered, then {status}"
    finally:
        if trial.outcome != "ok":
            trial.tail = job.tail()
        trial.leaks = job.cleanup()
    return trial


def _stage(ev: Events) -> str:
    """Where each rank's log stopped: e.g. ``rank0=start/a1 rank1=stalling/a1``."""
    parts = []
    for r in range(2):
        last = ev.last(r)
        parts.append(f"rank{r}={last[0]}/a{last[1]}" if last else f"rank{r}=-")
    return " ".join(parts)


def shm_leftovers(globs: Iterable[str]) -> list[str]:
    """The names in /dev/shm that match `globs` (`Job.shm_globs` of this run's jobs).

    Only this run's own: other benchmarks and other runs on the host share /dev/shm.
    """
    return sorted({p.name for g in set(globs) for p in Path(SHM_DIR).glob(g)})


def downtime_goal(results: list[Trial], sizes: list[int], label: str) -> list[str]:
    """The goal's verdict: per size run, the ratio of `label`'s median downtime to torchrun's; then
    one ``GOAL PASS`` or ``GOAL MISS`` line (a pass needs the goal's sizes covered)."""
    lines = [f"goal (issue 9): {label} downtime <= {GOAL_RATIO}x torchrun + disk's at {sizes_text(GOAL_SIZES_MB)}"]
    met: dict[int, bool] = {}
    for size in sizes:
        ours = median([t.downtime_s for t in results if t.size_mb == size and t.label == label])
        base = median([t.downtime_s for t in results if t.size_mb == size and t.launcher == "torchrun"])
        if ours is None or not base:
            met[size] = False
            lines.append(f"  {size} MB: no ratio ({label}: {fmt(ours)} s, torchrun: {fmt(base)} s)  MISS")
            continue
        met[size] = ours <= GOAL_RATIO * base
        verdict = "PASS" if met[size] else "MISS"
        lines.append(f"  {size} MB: {ours:.2f} s / {base:.2f} s = {ours / base:.2f}x  {verdict}")
    missing = [s for s in GOAL_SIZES_MB if s not in sizes]
    failed = [s for s, ok in met.items() if not ok]
    if failed:
        lines.append(f"GOAL MISS: over {GOAL_RATIO}x (or no ratio) at {sizes_text(failed)}")
    elif missing:
        lines.append(f"GOAL MISS: not measured at {sizes_text(missing)} (met at {sizes_text(sizes)})")
    else:
        lines.append(f"GOAL PASS: at most {GOAL_RATIO}x at {sizes_text(sizes)}")
    return lines


def sizes_text(sizes: Iterable[int]) -> str:
    """State sizes for a report line, e.g. ``256 MB and 1024 MB``."""
    return " and ".join(f"{s} MB" for s in sizes)


# ---------------------------------------------------------------------------------- report


def _label(launcher: str, mode: str, extra: list[str]) -> str:
    return " + ".join([launcher, mode, *extra])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="64 MB, 1 repetition")
    p.add_argument("--sizes", default="256,1024", help="MB of state per rank, comma-separated")
    p.add_argument("--runs", type=int, default=3, help="repetitions per launcher and size")
    p.add_argument("--also-dlrover-disk", action="store_true", help="add dlrover-run with torch.save to disk")
    p.add_argument(
        "--also-hold",
        action="store_true",
        help="add --failure-persist-hold=30 (the failure persist after the restore)",
    )
    p.add_argument("--after-steps", type=int, default=5, help="steps after the restart that time lost covers")
    p.add_argument("--settle-s", type=float, default=10.0, help="least time from the first step to the kill")
    p.add_argument("--only", default="", help="run only the launchers whose label contains this text")
    p.add_argument("--recover-timeout-s", type=float, default=60.0, help="bound on one recovery; past it: a hang")
    args = p.parse_args(argv)
    sizes = [64] if args.quick else [int(s) for s in args.sizes.split(",")]
    runs = 1 if args.quick else args.runs
    # dlrover-run's default: workers (first start and restarts) come from standby interpreters
    # that already imported torch (dlrover.launcher.StandbyPool); --prewarm=none starts them fresh.
    configs: list[tuple[str, str, list[str]]] = [
        ("dlrover-run", "flash", []),
        ("dlrover-run", "flash", ["--prewarm=none"]),
        ("torchrun", "disk", []),
    ]
    if args.also_hold:
        configs.insert(2, ("dlrover-run", "flash", ["--failure-persist-hold=30"]))
    if args.also_dlrover_disk:
        configs.append(("dlrover-run", "disk", []))
    if args.only:
        configs = [c for c in configs if args.only in _label(*c)]
    print(f"# recovery downtime: sizes {sizes} MB/rank, {runs} run(s), 2 ranks, gloo, {os.cpu_count()} CPUs")
    results: list[Trial] = []
    leaks: list[str] = []
    for size in sizes:
        for rep in range(runs):
            for launcher, mode, extra in configs:  # interleaved so all see the same machine load
                t = run_trial(
                    launcher,
                    mode,
                    size,
                    recover_timeout_s=args.recover_timeout_s,
                    settle_s=args.settle_s,
                    after_steps=args.after_steps,
                    extra=extra,
                )
                results.append(t)
                leaks += t.leaks
                bd = " ".join(f"{k}={v:.2f}" for k, v in t.breakdown.items())
                print(
                    f"  {size:>5} MB rep {rep} {_label(launcher, mode, extra):<34} {t.outcome:<10} "
                    f"startup={fmt(t.startup_s)} step={fmt(t.step_s)} downtime={fmt(t.downtime_s)} "
                    f"lost={fmt(t.lost_s)} "
                    f"[{bd}] {t.loaded}{t.stuck_at}",
                    flush=True,
                )
                if t.tail:
                    print("    launcher tail:\n      " + t.tail.replace("\n", "\n      "), flush=True)
    print(
        "\n| state/rank | launcher + checkpoint | recovered | startup s (median) | step s | downtime s (median) "
        "| downtime min..max | ratio vs torchrun | time lost s (median) | lost vs torchrun |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        base = median([t.downtime_s for t in results if t.size_mb == size and t.launcher == "torchrun"])
        lost_base = median([t.lost_s for t in results if t.size_mb == size and t.launcher == "torchrun"])
        for launcher, mode, extra in configs:
            ts = [t for t in results if t.size_mb == size and t.label == _label(launcher, mode, extra)]
            dts = [t.downtime_s for t in ts if t.downtime_s is not None]
            med = median(list(dts))
            ratio = f"{med / base:.2f}x" if med is not None and base else "-"
            rng = f"{min(dts):.2f}..{max(dts):.2f}" if dts else "-"
            ok = sum(t.outcome == "ok" for t in ts)
            label = _label(launcher, mode, extra)
            lost = median([t.lost_s for t in ts])
            # torchrun's steady step is mostly its own torch.save, whose speed swings with the page
            # cache: its "time lost" can come out negative, and then no ratio means anything.
            lost_ratio = f"{lost / lost_base:.2f}x" if lost is not None and lost_base and lost_base > 0 else "-"
            print(
                f"| {size} MB | {label} | {ok}/{len(ts)} | {fmt(median([t.startup_s for t in ts]))} "
                f"| {fmt(median([t.step_s for t in ts]))} | {fmt(med)} | {rng} | {ratio} | {fmt(lost)} "
                f"| {lost_ratio} |"
            )
    left = shm_leftovers(g for t in results for g in t.shm_globs)
    print(f"\nleaks during runs: {leaks or 'none'}; this run's shared memory now: {left or 'none'}")
    print("\n" + "\n".join(downtime_goal(results, sizes, _label("dlrover-run", "flash", []))))
    return 0 if not leaks and not left and all(t.outcome == "ok" for t in results) else 1


if __name__ == "__main__":
    sys.exit(main())
