"""Step reports under `dlrover-run --standalone`: a collective hang found by its step reports,
dumped and restarted; a rank slowed at runtime reported as a straggler, in a job whose ranks step
on their own and in a synchronous DDP job; a user error still stops."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Rank 1 sleeps before an all_reduce in its first attempt: rank 0 blocks inside the collective.
COLLECTIVE_HANG = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from dlrover.diagnosis import StepReporter

    out = sys.argv[1]
    reporter = StepReporter.from_env()
    assert reporter is not None, "dlrover-run sets up the step slots"
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    t = torch.ones(4)

    def sleep_before_all_reduce():
        time.sleep(100000)

    for step in range(1, 31):
        if attempt == 0 and rank == 1 and step == 15:
            sleep_before_all_reduce()
        dist.all_reduce(t)
        time.sleep(0.05)
        reporter.step(step, samples=4)
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"attempt": attempt, "steps": step}, f)
    dist.destroy_process_group()
    """
)

# Each rank steps on its own (no collective per step, so a slow rank does not slow the other);
# rank 1 becomes 3x slower after 20 steps. Runs until the test creates out/stop.
RUNTIME_SLOWDOWN = textwrap.dedent(
    """
    import os, sys, time
    from dlrover.diagnosis import StepReporter

    out = sys.argv[1]
    reporter = StepReporter.from_env()
    rank = int(os.environ["RANK"])
    deadline = time.monotonic() + 200
    step = 0
    while not os.path.exists(os.path.join(out, "stop")) and time.monotonic() < deadline:
        step += 1
        time.sleep(0.3 if rank == 1 and step > 20 else 0.1)
        reporter.step(step, samples=1)
    """
)

# A synchronous DDP job (gloo): every step takes the slowest rank's time, since the other waits for
# it in the gradient all-reduce. Rank 1's own work becomes 3x longer after 20 steps. The model marks
# its first gradient bucket of each step (report_gradient_sync). Runs until out/stop exists.
SYNCHRONOUS_SLOWDOWN = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from dlrover.diagnosis import StepReporter, report_gradient_sync

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reporter = StepReporter.from_env()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    assert report_gradient_sync(model, reporter), "dlrover-run sets up the step slots"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + 200
    step = 0
    while True:
        stop = torch.tensor([int(os.path.exists(os.path.join(out, "stop")) or time.monotonic() > deadline)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # both ranks leave at the same step
        if stop.item():
            break
        step += 1
        time.sleep(0.3 if rank == 1 and step > 20 else 0.1)  # this rank's own work: its forward pass
        optimizer.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        optimizer.step()
        reporter.step(step, samples=4)
    # The DDP model (its reducer holds the process group and the comm hook) goes first, the order
    # torch's own DDP examples keep. CI saw a rank abort at exit ("terminate called without an
    # active exception", status 134) twice: a gloo worker thread released a finished all-reduce's
    # tensors while the interpreter finalized (gdb: ~AsyncWork -> decref -> take_gil ->
    # pthread_exit). The standby runner dlrover-run starts this script from collects the cycles
    # that keep the group alive before the teardown (see dlrover.launcher._standby).
    del optimizer, model
    dist.destroy_process_group()
    """
)

# Both ranks train 12 steps, then hold for 15 s (three times the 5 s floor that is the hang window
# of their 0.05 s steps), in the phase the test names, in their first attempt only; then train 5 more.
HOLD = textwrap.dedent(
    """
    import json, os, sys, time
    from dlrover.diagnosis import StepReporter

    out, hold_phase = sys.argv[1], sys.argv[2]
    reporter = StepReporter.from_env()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    for step in range(1, 18):
        if step == 13 and attempt == 0:
            reporter.phase(hold_phase)
            time.sleep(15.0)
            reporter.phase("train")
        time.sleep(0.05)
        reporter.step(step)
    if os.environ["RANK"] == "0":
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"attempt": attempt}, f)
    """
)

# Both ranks train 12 steps; then rank 0 evaluates without marking a phase until the test creates
# out/eval-done (busy in Python, one half-second stretch of wall time per line, 120 lines, so its
# frames change with the clock whenever it runs at all) while rank 1 waits for it at a barrier;
# then 5 more steps.
UNMARKED_EVALUATION = textwrap.dedent(
    """
    import json, os, sys, time
    import torch.distributed as dist
    from dlrover.diagnosis import StepReporter

    out = sys.argv[1]
    done = os.path.join(out, "eval-done")
    reporter = StepReporter.from_env()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    def busy(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end and not os.path.exists(done):
            pass

    def evaluate():
"""
    + "        busy(0.5)\n" * 120
    + """
    for step in range(1, 18):
        if step == 13 and rank == 0:
            evaluate()
        if step == 13:
            dist.barrier()
        time.sleep(0.05)
        reporter.step(step)
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"attempt": attempt}, f)
    dist.destroy_process_group()
    """
)

USER_ERROR = textwrap.dedent(
    """
    from dlrover.diagnosis import StepReporter
    reporter = StepReporter.from_env()
    for step in range(1, 4):
        reporter.step(step)
    import this_module_does_not_exist_anywhere
    """
)


_HANG = re.compile(
    r"no step progress from rank\(s\) (?P<ranks>[\d, ]+); rank (?P<rank>\d+) has been stalled for "
    r"(?P<stalled>[\d.]+) s, longer than its window of (?P<window>[\d.]+) s \((?P<why>[^\n]*)\)"
)


def test_a_rank_blocked_in_a_collective_is_found_dumped_and_restarted(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "train.py").write_text(COLLECTIVE_HANG)
    (tmp_path / "out").mkdir()
    floor_s = 3.0
    proc = dlrover_run(
        tmp_path, "--max-restarts=2", "--hang-timeout=0", "--hang-step-factor=5",
        f"--hang-step-floor={floor_s}", "--hang-first-steps=120", "--stack-dump-timeout=20",
        str(tmp_path / "train.py"), str(tmp_path / "out"),
    )  # fmt: skip
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    # Restarted once, and the second attempt trained to the end.
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == {"attempt": 1, "steps": 30}
    summary = [line for line in output.splitlines() if "finished with exit code 0" in line]
    assert summary, output
    assert "after 1 restart(s)" in summary[-1], output
    # Found by the step reports (the CPU watch is off), within max(5 x median step, floor).
    found = _HANG.search(output)
    assert found is not None, output
    window = float(found["window"])
    assert float(found["stalled"]) >= window
    median = re.search(
        r"k x median training time between step marks = ([\d.e-]+) s is shorter"
        r"|5 x the median training time between step marks of ([\d.e-]+) s",
        found["why"],
    )
    assert median is not None, found["why"]
    median_s = float(median[1] or median[2])
    assert window == pytest.approx(max(5 * median_s, floor_s), rel=0.01)
    # Every rank's stack is in the evidence: rank 1 where it sleeps, rank 0 inside the all_reduce.
    dumps = output[found.start() :]
    assert "--- stack of local rank 0 (rank 0" in dumps, output
    assert "--- stack of local rank 1 (rank 1" in dumps, output
    rank1 = dumps.split("--- stack of local rank 1")[1]
    assert "sleep_before_all_reduce" in rank1, output
    rank0 = dumps.split("--- stack of local rank 0")[1].split("--- stack of local rank 1")[0]
    assert "all_reduce" in rank0, output


def test_a_rank_slowed_at_runtime_is_reported_as_a_straggler(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "train.py").write_text(RUNTIME_SLOWDOWN)
    out = tmp_path / "out"
    out.mkdir()
    proc = dlrover_run(tmp_path, "--hang-timeout=0", str(tmp_path / "train.py"), str(out))
    first, output = _first_straggler_event(tmp_path, proc, out)
    data = first["data"]
    assert isinstance(data, dict)
    assert data["ranks"] == [1], first
    times = {int(r): t for r, t in data["step_time_s"].items()}
    assert times[1] > 2 * times[0], first
    assert "straggler(s) rank 1" in output


def _first_straggler_event(tmp_path: Path, proc: subprocess.Popen[str], out: Path) -> tuple[dict[str, object], str]:
    """Wait for the first straggler event of the job run by `proc`, then stop it; the event and the
    job's output."""
    events: list[dict[str, object]] = []
    try:
        while not events:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
            for log in (tmp_path / "logs").glob("*_events.jsonl"):
                lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
                events = [e for e in lines if e["kind"] == "straggler"]
    finally:
        (out / "stop").touch()
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    return events[0], output


def test_a_rank_slowed_at_runtime_in_a_synchronous_ddp_job_is_reported_by_its_lead_time(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "train.py").write_text(SYNCHRONOUS_SLOWDOWN)
    out = tmp_path / "out"
    out.mkdir()
    proc = dlrover_run(tmp_path, "--hang-timeout=0", str(tmp_path / "train.py"), str(out))
    first, output = _first_straggler_event(tmp_path, proc, out)
    data = first["data"]
    assert isinstance(data, dict)
    assert data["ranks"] == [1], first
    # Equal step times (rank 0 waits for rank 1 in the all-reduce); rank 1's lead is the longer.
    leads = {int(r): t for r, t in data["sync_lead_s"].items()}
    assert leads[1] > 2 * leads[0], first
    assert "rank 1 works" in str(first["message"]), first
    assert "before it synchronizes" in output


@pytest.mark.parametrize(("hold_phase", "attempts"), [("wait", 1), ("train", 2)])
def test_a_hold_in_the_wait_phase_is_judged_by_its_allowance_not_the_step_pace(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]], hold_phase: str, attempts: int
) -> None:
    (tmp_path / "hold.py").write_text(HOLD)
    (tmp_path / "out").mkdir()
    proc = dlrover_run(
        tmp_path, "--max-restarts=1", "--hang-timeout=0", "--hang-step-floor=5", "--hang-wait-allowance=120",
        str(tmp_path / "hold.py"), str(tmp_path / "out"), hold_phase,
    )  # fmt: skip
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == {"attempt": attempts - 1}, output
    # Held in training, the same 15 s is a hang: found past the floor, restarted once.
    assert (_HANG.search(output) is not None) == (hold_phase == "train"), output


def test_a_rank_busy_in_an_unmarked_evaluation_is_not_hung_while_its_peer_waits(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "eval.py").write_text(UNMARKED_EVALUATION)
    out = tmp_path / "out"
    out.mkdir()
    proc = dlrover_run(
        tmp_path, "--max-restarts=1", "--hang-timeout=0", "--hang-step-floor=3", "--hang-busy-probe=2",
        str(tmp_path / "eval.py"), str(out),
    )  # fmt: skip
    lines: list[str] = []
    excused = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "busy, not hung" in line:
                excused.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # No step for longer than the 3 s window: rank 0's main thread moved between two dumps.
    assert excused.wait(timeout=200), "".join(lines)
    (out / "eval-done").touch()
    assert proc.wait(timeout=200) == 0, "".join(lines)
    reader.join(timeout=30)
    output = "".join(lines)
    assert json.loads((out / "result.json").read_text()) == {"attempt": 0}, output
    assert re.search(r"busy, not hung|now at .*\b(busy|evaluate)\b", output), output


def test_a_user_code_error_still_stops_after_one_attempt(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    (tmp_path / "bad.py").write_text(USER_ERROR)
    proc = dlrover_run(tmp_path, "--max-restarts=5", "--hang-step-floor=1", str(tmp_path / "bad.py"))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode != 0
    summary = [line for line in output.splitlines() if "finished with exit code" in line]
    assert summary, output
    assert "after 0 restart(s)" in summary[-1], output
    assert "user_code: " in summary[-1], output
    assert "No module named 'this_module_does_not_exist_anywhere'" in summary[-1], output
