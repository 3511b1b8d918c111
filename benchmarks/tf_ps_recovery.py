"""Recovery of a TensorFlow parameter-server job from a lost parameter server: DLRover beside a whole-job restart.

The job is `examples/tf_ps/train.py` (a chief, two parameter servers, two workers, on this host) under
`dlrover-master ps-job`. Training is held at step HOLD (`--pause-file`, `--pause-at`; the newest checkpoint is at
step 20), parameter server 1 is SIGKILLed, and the hold is released at once. Then:

* ``dlrover``: the master relaunches the parameter server at its address and restarts the chief, which restores
  the checkpoint from memory (flash checkpoints); the other parameter server and the workers keep running. The
  relaunched server and the restarted chief are the standbys the master keeps warm (TensorFlow imported; the
  kill waits until they are ready, as they are seconds after a job's start).
* ``whole-job``: what Kubeflow's tf-operator does with a failed parameter server in a job that restarts on failure
  (every replica is restarted): the job is killed with its master at the same moment, and a fresh job starts on
  the same checkpoint directory in storage (both save there: `--flash-root off`); its chief restores the same
  checkpoint and the same data position. The time a
  real operator takes to notice the failure is not counted (in its favour).

Downtime is "kill -> training again": from the SIGKILL to the first group of steps the restarted chief committed
(the ledger's wall-clock time; the first join of `--join-every` 5 steps). Both restore the checkpoint at step 20
and redo the same 10 steps, so the difference is the restart itself. Needs TensorFlow and tf_keras (the
`tests-tensorflow` session's venv); without them it says so and measures nothing.

    python benchmarks/tf_ps_recovery.py            # both ways, 3 runs each
    python benchmarks/tf_ps_recovery.py --runs 1

The goal (issue 32): DLRover's downtime at most 0.5x the whole-job restart's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from benchkit import fmt, median

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tf_ps" / "train.py"
HOLD, SAMPLES = 30, 12800
TIMEOUT_S = 240.0


def _master(work: Path, out: Path, pause: Path | None, *flags: str) -> subprocess.Popen[bytes]:
    hold = ["--pause-file", str(pause), "--pause-at", str(HOLD)] if pause is not None else []
    # Both jobs of a whole-job restart save to and restore from the same checkpoint directory.
    command = [sys.executable, "-m", "dlrover.master.cli", "ps-job", "--ps", "2", "--workers", "2",
               "--work-dir", str(work), "--checkpoint-dir", str(work.parent / "checkpoints"), "--stop-grace", "2",
               *flags, "--",
               sys.executable, str(EXAMPLE), "--out", str(out), "--samples", str(SAMPLES), *hold]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    log = (work.parent / f"{work.name}.log").open("wb")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _task_pid(master: subprocess.Popen[bytes], task: str) -> int:
    for proc in psutil.Process(master.pid).children(recursive=True):
        try:
            if proc.environ().get("DLROVER_PS_TASK") == task:
                return int(proc.pid)
        except psutil.Error:
            continue
    raise RuntimeError(f"no process of {task} under the master")


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.02)


def _end(master: subprocess.Popen[bytes]) -> None:
    if master.poll() is None:
        os.killpg(master.pid, signal.SIGKILL)
    master.wait(timeout=30)


def trial(way: str, run_dir: Path) -> tuple[float, int]:
    """(downtime in seconds, steps redone) of one kill."""
    out, pause = run_dir / "out", run_dir / "pause"
    run_dir.mkdir(parents=True)
    pause.touch()
    # A Kubeflow-style job saves its checkpoints to storage and restores from there; DLRover's to memory.
    storage_only = ("--flash-root", "off") if way == "whole-job" else ()
    first = _master(run_dir / "job", out, pause, *storage_only)
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait(lambda: (out / f"at-step-{HOLD}").exists() or first.poll() is not None, "the hold")
        if way == "dlrover":
            # A job's standby chief is warm long before its first failure (seconds after the start).
            standby = run_dir / "job" / "standby"
            _wait(lambda: all(list(standby.glob(f"{role}-*.ready")) for role in ("chief", "ps")), "the standbys")
        victim = _task_pid(first, "ps:1")
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        if way == "whole-job":
            _end(first)
            pause.unlink()
            # (No standby: its TensorFlow import would compete with the restarted job's on these two cores.)
            second = _master(run_dir / "job2", out, None, "--no-standby-tasks", *storage_only)
        else:
            pause.unlink()
        job = second or first
        _wait(lambda: job.poll() is not None, "the end of the job")
        if job.returncode != 0:
            raise RuntimeError(f"the job failed (exit status {job.returncode}); see {run_dir}")
    finally:
        _end(first)
        if second is not None:
            _end(second)
    entries = [json.loads(line) for line in (out / "committed.jsonl").read_text().splitlines()]
    after = [e for e in entries if e["t"] > killed_at]
    summary = json.loads((out / "summary.json").read_text())
    return after[0]["t"] - killed_at, HOLD - int(summary["restored_step"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    missing = [m for m in ("tensorflow", "tf_keras") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"tf_ps_recovery: not measured: {', '.join(missing)} not installed here (use the venv of "
              "`nox -s tests-tensorflow`)")  # fmt: skip
        return 0
    results: dict[str, list[float]] = {"dlrover": [], "whole-job": []}
    redone: dict[str, set[int]] = {"dlrover": set(), "whole-job": set()}
    with tempfile.TemporaryDirectory(prefix="dlrover-tfps-bench-") as tmp:
        for run in range(args.runs):
            for way, downtimes in results.items():  # interleaved: a slower moment of the host favours neither
                downtime, steps = trial(way, Path(tmp) / f"{way}-{run}")
                downtimes.append(downtime)
                redone[way].add(steps)
                print(f"  run {run + 1} {way:9s} downtime {downtime:6.2f} s, steps redone {steps}", flush=True)
    ours, theirs = median(results["dlrover"]), median(results["whole-job"])
    print("\nTensorFlow PS job, parameter server SIGKILLed (kill -> training again, median of "
          f"{args.runs} runs; the goal is at most 0.5x)")  # fmt: skip
    print("| way | downtime s | steps redone | ratio |")
    print("|---|---|---|---|")
    for way, value in (("dlrover", ours), ("whole-job", theirs)):
        ratio = None if value is None or theirs is None else value / theirs
        print(f"| {way} | {fmt(value)} | {sorted(redone[way])} | {fmt(ratio)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
