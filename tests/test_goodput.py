"""Goodput under `dlrover-run --standalone`: a 60-step job whose worker is killed once.

The workers write a per-step log (step, start and end wall time, kept or redone); the goodput
the master accounts from the step marks its agent batched onto heartbeats (recomputed from the
job's event log, as a restarted master does) agrees with the one computed from that log within
one percentage point. The checkpoints the agent's saver committed reach the master:
`dlrover-master status`, asked by the running job, shows the committed step and its path.
`dlrover-master timeline` draws the job from its event log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrover.master.eventlog import read_event_log
from dlrover.master.goodput import compute_breakdown

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

TOTAL_STEPS = 60
KILL_AFTER = 43  # rank 1 dies after step 43; the memory checkpoint holds step 40: 41..43 are redone

# Every step: an all_reduce and 0.1 s of "compute", a step mark with 8 samples; a flash checkpoint
# in memory every 5 steps, persisted at 20 and 60. Rank 0 logs each step; once step 20 is
# persisted, a thread of rank 0 asks `dlrover-master status` until it shows a committed checkpoint.
JOB = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, threading, time
    import torch, torch.distributed as dist
    from dlrover.diagnosis import StepReporter
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError

    out, ckpt_dir, total, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
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
    log_path = os.path.join(out, f"steps-rank{rank}.jsonl")
    best = 0
    if os.path.exists(log_path):
        with open(log_path) as f:
            best = max((json.loads(line)["step"] for line in f if line.strip()), default=0)
    log = open(log_path, "a")

    def ask_status():
        cmd = [sys.executable, "-m", "dlrover.master.cli", "status", "--master", os.environ["DLROVER_MASTER_ADDR"],
               "--token-file", os.environ["DLROVER_JOB_TOKEN_FILE"]]
        for _ in range(600):
            done = subprocess.run(cmd, capture_output=True, text=True)
            with open(os.path.join(out, f"status-{attempt}.txt"), "w") as f:
                f.write(done.stdout + done.stderr)
            if "committed checkpoint none" not in done.stdout and "samples/s" in done.stdout:
                return
            time.sleep(0.5)

    asking = None
    step = state["step"]
    while step < total:
        if attempt == 0 and rank == 1 and step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.time()
        grad = torch.full((1024,), float(rank + 1))
        dist.all_reduce(grad)
        time.sleep(0.1)
        state["w"] += grad
        step += 1
        state["step"] = step
        end = time.time()
        reporter.step(step, samples=8)
        log.write(json.dumps({"step": step, "start": start, "end": end, "attempt": attempt,
                              "kept": step > best}) + "\\n")
        log.flush()
        if step % 5 == 0:
            ckpt.save(step, state, persist=step in (20, total))
        if rank == 0 and asking is None and step >= 20 and step % 5 == 0:
            if step > 20 or ckpt.wait_persisted(20, timeout_s=120).ok:
                asking = threading.Thread(target=ask_status, daemon=True)
                asking.start()
    assert ckpt.wait_persisted(total, timeout_s=120).ok
    dist.barrier()
    if asking is not None:
        asking.join(timeout=120)
    ckpt.close(job_end=rank == 0)
    dist.destroy_process_group()
    """
)


def _independent_useful_s(log: Path) -> tuple[float, list[int]]:
    """Seconds of kept steps by the workers' own log (a step is kept the first time it ends)."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    useful, best, redone = 0.0, 0, []
    for r in sorted(records, key=lambda r: r["end"]):
        if r["step"] > best:
            useful += r["end"] - r["start"]
            best = r["step"]
            assert r["kept"], r
        else:
            redone.append(r["step"])
            assert not r["kept"], r
    return useful, redone


def test_goodput_of_a_job_with_one_kill_agrees_with_its_per_step_log(
    tmp_path: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(JOB)
    out, ckpt_dir = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    proc = dlrover_run(
        tmp_path, "--max-restarts=2", str(script), str(out), str(ckpt_dir), str(TOTAL_STEPS), str(KILL_AFTER)
    )
    output, _ = proc.communicate(timeout=360)
    assert proc.returncode == 0, output
    logs = list((tmp_path / "logs").glob("*_events.jsonl"))
    assert len(logs) == 1, list((tmp_path / "logs").iterdir())
    events = read_event_log(logs[0])
    kinds = [e["kind"] for e in events]
    assert "failure" in kinds, kinds
    assert "job_end" in kinds, kinds

    # The master's accounting, recomputed from the event log as a restarted master does.
    breakdown = compute_breakdown(events)
    start = next(e["wall_time"] for e in events if e["kind"] == "job_start")
    end = next(e["wall_time"] for e in events if e["kind"] == "job_end")
    assert breakdown.elapsed_s == pytest.approx(end - start)
    useful, redone = _independent_useful_s(out / "steps-rank0.jsonl")
    assert redone == [41, 42, 43]
    master_ratio, log_ratio = breakdown.ratio, useful / breakdown.elapsed_s
    print(f"goodput: master {master_ratio:.2%}, per-step log {log_ratio:.2%}; breakdown {breakdown}")
    assert abs(master_ratio - log_ratio) <= 0.01, (master_ratio, log_ratio, breakdown)
    assert breakdown.best_step == TOTAL_STEPS
    assert breakdown.buckets["steps_redone"] > 0
    assert breakdown.buckets["failure_detection"] + breakdown.buckets["restart"] > 0
    assert breakdown.buckets["checkpoint_load"] > 0
    total = breakdown.useful_s + sum(breakdown.buckets.values())
    assert total == pytest.approx(breakdown.elapsed_s)

    # The saver's commits reached the master: in the event log, and in `dlrover-master status`.
    commits = [e["data"] for e in events if e["kind"] == "checkpoint"]
    assert commits, output
    assert commits[-1]["step"] == TOTAL_STEPS, (commits, output)
    assert commits[-1]["path"] == f"{ckpt_dir}/{TOTAL_STEPS}", commits
    statuses = [p.read_text() for p in sorted(out.glob("status-*.txt"))]
    shown = [s for s in statuses if "committed checkpoint none" not in s and "samples/s" in s]
    assert shown, statuses
    line = next(x for x in shown[-1].splitlines() if "committed checkpoint" in x)
    assert f" at {ckpt_dir}/" in line, line
    samples_per_s = float(line.split("samples/s")[0].split(";")[-1])
    assert samples_per_s > 0, line

    # The picture, from the event log after the fact.
    svg = tmp_path / "job.svg"
    drawn = subprocess.run(
        [sys.executable, "-m", "dlrover.master.cli", "timeline", "--event-log", str(logs[0]), "--out", str(svg)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert drawn.returncode == 0, drawn.stderr
    root = ET.parse(svg).getroot()
    classes = [el.get("class") for el in root.iter()]
    for kind in ("node", "train", "step", "failure", "restart", "checkpoint", "bucket"):
        assert kind in classes, kind
    title = root.find("{http://www.w3.org/2000/svg}title")
    assert title is not None
    assert f"goodput {breakdown.ratio:.1%}" in (title.text or "")
