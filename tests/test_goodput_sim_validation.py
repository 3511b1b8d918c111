"""The goodput simulator beside a real job (issue 31, point 4): a `dlrover-run --standalone` job whose worker is
SIGKILLed at a fixed rate, and the simulation of that job (the real master over the same kills, with the costs the
job measured, `tools/goodput_sim/validate.py`), agree on goodput within three points.

The kills come every KILL_EVERY_S seconds from the first step; one that falls while the job recovers waits until a
worker trains again (so does an interruption in the simulation). Each worker logs its steps; rank 0's log gives
the step and save times, the master's event log the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrover.master.eventlog import read_event_log

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from goodput_sim.validate import calibrate, compare, read_jsonl  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

# The fourth kill comes 24 s of wall time after the first step; 300 steps of 0.1 s and more leave it room.
TOTAL_STEPS, SAVE_EVERY, KILLS, KILL_EVERY_S = 300, 1, 4, 6.0
MAX_RESTARTS = KILLS + 2
TOLERANCE = 0.03

# Every step: an all_reduce and 0.1 s of "compute", a step mark, and a flash checkpoint in memory (every SAVE_EVERY
# steps: every step, as DLRover's design has it; with saves further apart the steps a kill undoes hang on where it
# falls between two saves, which a simulation with mean costs cannot place to the step). After its first step of
# each attempt, rank 1 writes its pid: the test's killer may kill it from then on.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from dlrover.diagnosis import StepReporter
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError

    out, ckpt_dir, total, save_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reporter = StepReporter.from_env()
    ckpt = FlashCheckpointer(ckpt_dir)
    state = {"w": torch.zeros(1024), "step": 0}
    try:
        ckpt.load(target=state)
    except NoCheckpointError:
        pass
    log = open(os.path.join(out, f"steps-rank{rank}.jsonl"), "a")
    step = state["step"]
    told = False
    while step < total:
        start = time.time()
        grad = torch.full((1024,), float(rank + 1))
        dist.all_reduce(grad)
        time.sleep(0.1)
        state["w"] += grad
        step += 1
        state["step"] = step
        end = time.time()
        reporter.step(step, samples=8)
        log.write(json.dumps({"step": step, "start": start, "end": end, "attempt": attempt}) + "\\n")
        log.flush()
        if rank == 1 and not told:
            told = True
            with open(os.path.join(out, f".pid-{attempt}.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.replace(os.path.join(out, f".pid-{attempt}.tmp"), os.path.join(out, f"pid-{attempt}"))
        if step % save_every == 0:
            ckpt.save(step, state, persist=step == total)
    assert ckpt.wait_persisted(total, timeout_s=120).ok
    dist.barrier()
    ckpt.close(job_end=rank == 0)
    dist.destroy_process_group()
    """
)


def _kill_at_a_fixed_rate(out: Path, job: subprocess.Popen[str], kills: list[float], errors: list[str]) -> None:
    """SIGKILL rank 1 every KILL_EVERY_S seconds from its first step, KILLS times: at the time when a worker is
    training, else as soon as one is again. Records each kill's wall time; an attempt is killed once at most."""
    due = None
    killed: set[str] = set()
    try:
        while len(kills) < KILLS and job.poll() is None:
            pids = sorted(out.glob("pid-*"), key=lambda p: int(p.name.split("-")[1]))
            newest = pids[-1] if pids else None
            if due is None and newest is not None:
                due = newest.stat().st_mtime + KILL_EVERY_S
            if due is not None and newest is not None and newest.name not in killed and time.time() >= due:
                killed.add(newest.name)
                try:
                    os.kill(int(newest.read_text()), signal.SIGKILL)
                except ProcessLookupError:  # it ended on its own: the next attempt's is the one
                    continue
                kills.append(time.time())
                due += KILL_EVERY_S
            time.sleep(0.02)
    except BaseException as exc:  # the test says it rather than "too few kills"
        errors.append(repr(exc))


def test_a_job_killed_at_a_fixed_rate_and_its_simulation_agree_on_goodput(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(JOB)
    out, ckpt_dir = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    job = dlrover_run(tmp_path, f"--max-restarts={MAX_RESTARTS}", str(script), str(out), str(ckpt_dir),
                      str(TOTAL_STEPS), str(SAVE_EVERY))  # fmt: skip
    kills: list[float] = []
    errors: list[str] = []
    killer = threading.Thread(target=_kill_at_a_fixed_rate, args=(out, job, kills, errors), daemon=True)
    killer.start()
    output, _ = job.communicate(timeout=360)
    killer.join(timeout=10)
    assert not errors, errors
    assert job.returncode == 0, output
    assert len(kills) == KILLS, f"{len(kills)} kills: the job ended too soon for the test's rate"
    (log,) = (tmp_path / "logs").glob("*_events.jsonl")
    events = read_event_log(log)
    assert sum(1 for e in events if e["kind"] == "failure") == KILLS
    assert sum(1 for e in events if e["kind"] == "process_restart") == KILLS, "the real master restarted in place"

    calibration = calibrate(events, read_jsonl(out / "steps-rank0.jsonl"), kills, save_every=SAVE_EVERY, world=2,
                            max_restarts=MAX_RESTARTS)  # fmt: skip
    comparison = compare(calibration)
    print(calibration.measured)
    print(comparison.table())
    # The simulated master decides every kill as the real one did: the processes restarted in place.
    assert comparison.simulated.decisions == {"killed: restart_processes": KILLS}
    assert not comparison.simulated.stopped
    assert abs(comparison.difference) <= TOLERANCE, comparison.table()
    # The tool's command line says the same from the files.
    kills_file = tmp_path / "kills.jsonl"
    kills_file.write_text("".join(json.dumps({"t": t}) + "\n" for t in kills))
    shown = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "goodput_sim"), "validate", "--event-log", str(log),
         "--steps", str(out / "steps-rank0.jsonl"), "--kills", str(kills_file), "--save-every", str(SAVE_EVERY),
         "--max-restarts", str(MAX_RESTARTS)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert f"difference: {100 * comparison.difference:+.1f} points" in shown.stdout
