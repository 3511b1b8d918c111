"""DLRover's main job: train a small GPT under `dlrover-run`, kill a worker part-way, recover from memory.

    python examples/demo.py            # about 1-3 minutes on two CPU cores
    python examples/demo.py --quick    # fewer steps (what the test runs)

It starts `dlrover-run --standalone --nproc-per-node=2` on `examples/gpt/train.py` (DDP over gloo
on CPU, samples from the master's shard service, a flash checkpoint to shared memory every step),
watches the progress file rank 0 writes, SIGKILLs the worker with RANK=1 about a third of the way
through, waits for the job to restart its workers and finish, and prints a summary. The exit
status is 0 only when the job finished every step after recovering from memory.

Everything of one run goes to a folder under `runs/` (or `--run-dir`): `dlrover-run.log`, the
workers' logs, `progress.jsonl`, the persisted checkpoint and `summary.json`. No process, shared
memory or temporary file outlives the demo, also after Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "gpt" / "train.py"
SHM_DIR = "/dev/shm"  # noqa: S108 (where flashckpt keeps its segments, not a temp file)
RANK_TO_KILL = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short run (60 steps) for tests and smoke checks")
    p.add_argument("--steps", type=int, default=0, help="training steps (default 240, or 60 with --quick)")
    p.add_argument("--kill-at-step", type=int, default=0, help="kill rank 1 once this step is done (default: 1/3)")
    p.add_argument("--run-dir", default="", help="where the run's files go (default: runs/demo-<time>)")
    p.add_argument("--record-samples", action="store_true", help="have every rank record the indices it trained")
    p.add_argument("--timeout-s", type=float, default=900.0, help="give up (and fail) after this long")
    p.add_argument("--verbose", action="store_true", help="echo every line of dlrover-run, not only the main ones")
    args = p.parse_args(argv)
    args.steps = args.steps or (60 if args.quick else 240)
    args.kill_at_step = args.kill_at_step or max(1, args.steps // 3)
    if not 0 < args.kill_at_step < args.steps:
        p.error(f"--kill-at-step must lie in 1..{args.steps - 1}, got {args.kill_at_step}")
    if args.timeout_s <= 0:
        p.error(f"--timeout-s must be positive, got {args.timeout_s}")
    return args


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def banner(message: str) -> None:
    line = "=" * max(60, len(message) + 4)
    print(f"\n{line}\n  {message}\n{line}", flush=True)


# ---------------------------------------------------------------------------------- processes


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) child processes of `pid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def worker_with_rank(launcher_pid: int, run_dir: Path, rank: int) -> int | None:
    """The worker process of `rank` among the launcher's children, or None.

    From the pid file train.py writes at start, not /proc/PID/environ: a worker dlrover-run started
    from a warm standby (the default) got its RANK after the standby started, and /proc shows only
    the environment a process was started with.
    """
    try:
        pid = int((run_dir / f"rank{rank}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if pid in children_of(launcher_pid) else None


def is_saver(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"dlrover.flashckpt.saver_main" in cmdline


# ---------------------------------------------------------------------------------- progress


class ProgressFile:
    """Reads the JSON lines rank 0 appends to `progress.jsonl`, as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = ""

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open(encoding="utf-8") as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset = f.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # a line still being written
        new = [json.loads(line) for line in lines if line.strip()]
        self.events += new
        return new


class OutputPump:
    """Copies dlrover-run's output to its log file, echoing the main lines."""

    SHOWN = ("[train]", "dlrover.launcher", "Traceback", "Error", "ERROR")

    def __init__(self, stream: IO[str], log: IO[str], verbose: bool) -> None:
        self._stream, self._log, self._verbose = stream, log, verbose
        self.tail: list[str] = []
        self._thread = threading.Thread(target=self._run, name="dlrover-run-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for line in self._stream:
            self._log.write(line)
            self._log.flush()
            self.tail = [*self.tail[-40:], line]
            if self._verbose or any(mark in line for mark in self.SHOWN):
                print(f"  | {line.rstrip()}", flush=True)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


# ---------------------------------------------------------------------------------- the job


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.run_dir = Path(args.run_dir).resolve() if args.run_dir else ROOT / "runs" / f"demo-{stamp}"
        self.job_id = f"demo-{os.getpid()}-{stamp}"
        self.proc: subprocess.Popen[str] | None = None
        self.log: IO[str] | None = None
        self.tmp_dir: Path | None = None
        self.pump: OutputPump | None = None
        self.progress = ProgressFile(self.run_dir / "progress.jsonl")
        self.kill: dict[str, Any] | None = None
        self.started = time.time()

    def command(self) -> list[str]:
        args = self.args
        return [
            sys.executable, "-m", "dlrover.launcher.cli",
            "--standalone", "--nproc-per-node=2", "--max-restarts=2",
            # train.py turns on deterministic algorithms, whose first call imports torch's compiler
            # stack (torch._inductor.config, about 2 s): the standbys import it ahead of a restart.
            "--prewarm=torch,torch._inductor.config,dlrover.flashckpt.checkpointer",
            f"--log-dir={self.run_dir / 'logs'}", "--tee=3",
            str(TRAIN), "--out", str(self.run_dir), "--steps", str(args.steps), "--job-id", self.job_id,
            "--log-every", str(max(5, args.steps // 12)),
            *(["--record-samples"] if args.record_samples else []),
        ]  # fmt: skip

    def intro(self) -> None:
        a = self.args
        banner("DLRover demo: a worker dies mid-training; the job recovers from memory")
        say(f"1. start `dlrover-run --standalone --nproc-per-node=2` on {TRAIN.relative_to(ROOT)}:")
        say(f"   a small GPT on a generated text corpus, DDP over gloo on CPU, {a.steps} steps,")
        say("   samples from the master's shard service (exactly once), a flash checkpoint")
        say("   to shared memory after every step (persisted to disk every 50 steps)")
        say(f"2. at step {a.kill_at_step} SIGKILL the worker with RANK={RANK_TO_KILL}")
        say("3. dlrover-run restarts the workers; they load the newest step both ranks hold in memory")
        say("4. training finishes; a summary follows")
        say(f"run folder: {self.run_dir}")

    def run(self) -> int:
        self.intro()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # The job's temporary files (dlrover-run's token folder, torch's) go to a folder the
        # demo removes at the end, even when a process had to be killed before cleaning up.
        self.tmp_dir = self.run_dir / "tmp"
        self.tmp_dir.mkdir(exist_ok=True)
        env = {**os.environ, "DLROVER_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1", "TMPDIR": str(self.tmp_dir)}
        for inherited in ("DLROVER_JOB_TOKEN", "DLROVER_JOB_TOKEN_FILE", "DLROVER_MASTER_ADDR"):
            env.pop(inherited, None)  # the standalone master makes its own
        banner("starting dlrover-run")
        self.log = (self.run_dir / "dlrover-run.log").open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its whole tree can be ended with one killpg
        )
        assert self.proc.stdout is not None
        self.pump = OutputPump(self.proc.stdout, self.log, self.args.verbose)
        self.watch()
        self.pump.join(30.0)
        return self.report(self.pump.tail)

    def watch(self) -> None:
        """Follow the progress file until dlrover-run exits; kill rank 1 on the way."""
        assert self.proc is not None
        deadline = self.started + self.args.timeout_s
        last_note = time.time()
        phase = "waiting for the workers to start (importing torch, rendezvous)"
        latest = 0  # the newest step the first workers reported
        while self.proc.poll() is None:
            if time.time() > deadline:
                say(f"TIMEOUT: no result after {self.args.timeout_s:.0f}s; stopping the job")
                return
            for event in self.progress.poll():
                kind = event["event"]
                if kind == "started" and event["attempt"] > 0:
                    phase = f"attempt {event['attempt']}: workers restarted, loading the checkpoint"
                    say(f"{phase}")
                elif kind == "resumed":
                    phase = "training"
                    say(
                        f"attempt {event['attempt']} resumed at step {event['step']} from {event['source']} "
                        f"in {event['load_s']:.2f}s"
                    )
                elif kind == "step":
                    phase = "training"
                    if event["attempt"] == 0:
                        latest = event["step"]
                    elif self.kill is not None and "first_step_after" not in self.kill:
                        self.kill["first_step_after"] = event
                elif kind == "finished":
                    phase = "finishing (persisting the last checkpoint, shutting down)"
            if self.kill is None and latest >= self.args.kill_at_step:
                self.kill_worker(latest)  # the newest step reported, however many came at once
                phase = "waiting for dlrover-run to notice the failure and restart the workers"
            if time.time() - last_note >= 5.0 and phase != "training":
                say(f"... {phase} ({time.time() - self.started:.0f}s elapsed)")
                last_note = time.time()
            elif phase == "training":
                last_note = time.time()
            time.sleep(0.05)
        self.progress.poll()

    def kill_worker(self, step: int) -> None:
        assert self.proc is not None
        pid = None
        deadline = time.time() + 30.0
        while pid is None and time.time() < deadline and self.proc.poll() is None:
            pid = worker_with_rank(self.proc.pid, self.run_dir, RANK_TO_KILL)
            if pid is None:
                time.sleep(0.05)
        if pid is None:
            say(f"could not find the worker with RANK={RANK_TO_KILL}; nothing was killed")
            self.kill = {"pid": None, "step": step, "t": time.time()}
            return
        banner(f"KILLING worker rank {RANK_TO_KILL} (pid {pid}) with SIGKILL at step {step}")
        t = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.kill = {"pid": pid, "step": step, "t": t}

    # ------------------------------------------------------------------------------ summary

    def summary(self, exit_code: int | None) -> dict[str, Any]:
        events = self.progress.events
        attempts = [e for e in events if e["event"] == "started"]
        resumed = [e for e in events if e["event"] == "resumed"]
        finished = next((e for e in events if e["event"] == "finished"), None)
        last_before_kill = max((e["step"] for e in events if e["event"] == "step" and e["attempt"] == 0), default=None)
        first_after = (self.kill or {}).get("first_step_after")
        time_lost = (first_after["t"] - self.kill["t"]) if (self.kill and first_after) else None
        restarted = next((e for e in attempts if e["attempt"] > 0), None)
        breakdown = None
        if self.kill and first_after and restarted and resumed:
            breakdown = {
                "restart_s": restarted["t"] - self.kill["t"],  # noticed, workers started, rendezvous
                "load_s": resumed[0]["t"] - restarted["t"],  # checkpointer attached, state loaded
                "first_step_s": first_after["t"] - resumed[0]["t"],
            }
        return {
            "exit_code": exit_code,
            "steps_planned": self.args.steps,
            "steps_completed": finished["step"] if finished else None,
            # TORCHELASTIC_RESTART_COUNT of the last workers started (a round the launcher
            # replaced before its workers trained can start a second set with the same count).
            "restarts": max((e["attempt"] for e in attempts), default=0),
            "killed": {k: v for k, v in (self.kill or {}).items() if k != "first_step_after"} or None,
            "last_step_reported_before_restart": last_before_kill,
            "resumed_step": resumed[0]["step"] if resumed else None,
            "resumed_source": resumed[0]["source"] if resumed else None,
            "resume_load_s": resumed[0]["load_s"] if resumed else None,
            "time_lost_s": time_lost,
            "time_lost_breakdown_s": breakdown,
            "final_loss": finished["loss"] if finished else None,
            "checkpoint": finished["checkpoint"] if finished else None,
            "wall_s": time.time() - self.started,
            "run_dir": str(self.run_dir),
            "job_id": self.job_id,
            "launcher_pid": self.proc.pid if self.proc is not None else None,
        }

    def report(self, tail: list[str]) -> int:
        assert self.proc is not None
        code = self.proc.poll()
        s = self.summary(code)
        (self.run_dir / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
        problems = []
        if code is None:
            problems.append("dlrover-run did not finish in time")
        elif code != 0:
            problems.append(f"dlrover-run exited with {code}")
        if s["steps_completed"] != self.args.steps:
            problems.append(f"{s['steps_completed']} of {self.args.steps} steps completed")
        if not s["killed"] or s["killed"]["pid"] is None:
            problems.append("no worker was killed")
        elif s["restarts"] < 1 or s["resumed_step"] is None:
            problems.append("the job did not restart and resume")
        elif s["resumed_source"] != "memory":
            problems.append(f"the job resumed from {s['resumed_source']}, not from memory")
        banner("summary" if not problems else "FAILED")
        lost = f"{s['time_lost_s']:.1f}s" if s["time_lost_s"] is not None else "n/a"
        redone = (
            s["last_step_reported_before_restart"] - s["resumed_step"]
            if s["resumed_step"] is not None and s["last_step_reported_before_restart"] is not None
            else None
        )
        rows = [
            ("steps completed", f"{s['steps_completed']} of {self.args.steps}"),
            ("restarts", str(s["restarts"])),
            ("worker killed", f"rank {RANK_TO_KILL} at step {s['killed']['step']}" if s["killed"] else "none"),
            (
                "resumed from",
                f"step {s['resumed_step']} ({s['resumed_source']}, loaded in {s['resume_load_s']:.2f}s)"
                if s["resumed_step"] is not None
                else "n/a",
            ),
            ("steps redone", str(redone) if redone is not None else "n/a"),
            ("time lost to the failure", f"{lost} (from the kill to the next completed step)"),
            *self._breakdown_rows(s["time_lost_breakdown_s"]),
            ("final loss", f"{s['final_loss']:.3f}" if s["final_loss"] is not None else "n/a"),
            ("checkpoint", s["checkpoint"] or "none"),
            ("total time", f"{s['wall_s']:.1f}s"),
            ("logs", str(self.run_dir)),
        ]
        for name, value in rows:
            print(f"  {name:<26} {value}", flush=True)
        if problems:
            for problem in problems:
                print(f"  problem: {problem}", flush=True)
            print("  last lines of dlrover-run:", flush=True)
            for line in tail[-15:]:
                print(f"  | {line.rstrip()}", flush=True)
            return 1
        return 0

    @staticmethod
    def _breakdown_rows(b: dict[str, float] | None) -> list[tuple[str, str]]:
        if b is None:
            return []
        return [
            ("  detect + restart workers", f"{b['restart_s']:.1f}s (until the new workers joined the process group)"),
            ("  reconnect + load state", f"{b['load_s']:.1f}s"),
            ("  first step after", f"{b['first_step_s']:.1f}s"),
        ]

    # ------------------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        """End the job's processes and remove its shared memory, whatever state it is in."""
        if self.proc is not None and self.proc.poll() is None:
            # dlrover-run stops its workers on SIGTERM; the group kill is the backstop.
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.pump is not None:
            self.pump.join(30.0)  # the pipe is at its end once the process group is gone
        if self.log is not None:
            self.log.close()
        self._stop_saver()
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        from dlrover.flashckpt import remove_run
        from dlrover.flashckpt.job_env import run_id_for

        # train.py's checkpointer names its run after where it persists.
        removed = remove_run(SHM_DIR, self.job_id, run_id_for(str(self.run_dir / "checkpoints")))
        if removed:
            say(f"removed {len(removed)} leftover shared-memory file(s) of job {self.job_id}")

    def _stop_saver(self) -> None:
        # Under dlrover-run the checkpoint saver runs inside the agent and ends with it. A detached
        # saver (train.py started some other way) lives in its own session: at a clean end the job
        # tells it to exit, after a failure it would wait for its idle timeout: end it now.
        pid_file = self.run_dir / "saver.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if pid <= 0:
            return
        if self.proc is not None and self.proc.returncode == 0:
            deadline = time.time() + 10.0
            while is_saver(pid) and time.time() < deadline:
                time.sleep(0.1)  # a saver told the job ended exits by itself
        if is_saver(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.time() + 10.0
            while is_saver(pid) and time.time() < deadline:
                time.sleep(0.1)
            if is_saver(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    demo = Demo(parse_args(argv))
    try:
        return demo.run()
    except KeyboardInterrupt:
        print(flush=True)
        say("interrupted: stopping the job")
        return 130
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave processes or memory behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        demo.cleanup()


if __name__ == "__main__":
    sys.exit(main())
