"""The README's main job end to end: examples/demo.py kills a worker and the job recovers from memory.

Also runs examples/gpt/train.py under plain torchrun (its fallback path), to keep the promise that
the script runs unchanged under both launchers.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlrover.common import processes_mentioning

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parent.parent
QUICK_STEPS = 60  # demo.py --quick
WORLD = 2
BATCH = 16  # train.py's default batch per rank


def _run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_")}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # the demo cleans up after Ctrl-C
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"{cmd[1]} did not finish within {timeout_s}s:\n{out}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(560)
def test_the_demo_recovers_from_memory_without_losing_or_repeating_a_sample(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    demo = [sys.executable, "examples/demo.py", "--quick", "--record-samples", "--timeout-s=240"]
    demo.append(f"--run-dir={run_dir}")
    done = _run(demo, 280)
    assert done.returncode == 0, done.stdout
    assert "KILLING worker rank 1 (pid" in done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps_completed"] == QUICK_STEPS, summary
    assert summary["restarts"] == 1, summary
    assert summary["resumed_source"] == "memory", summary
    resumed = summary["resumed_step"]

    # No step lost: every rank records each step it staged in memory, right after the save
    # returns. The job must resume from the newest step every rank had staged before the kill
    # (one more only when a rank was killed between a save and its record).
    staged_before = [
        max(e["step"] for e in _lines(run_dir / "staged" / f"rank{r}.jsonl") if e["attempt"] == 0) for r in range(WORLD)
    ]
    assert min(staged_before) <= resumed <= min(staged_before) + 1, (staged_before, resumed)
    assert resumed >= summary["killed"]["step"] - 1, summary

    # Exactly once: the samples behind the final model are, per rank and step, the last record
    # written for that step (a restarted worker trains again every step after the one it resumed
    # from). Together they must be every index of the dataset, each once.
    counts: collections.Counter[int] = collections.Counter()
    for r in range(WORLD):
        chain: dict[int, list[int]] = {}
        for e in _lines(run_dir / "samples" / f"rank{r}.jsonl"):
            chain[e["step"]] = e["indices"]
        assert sorted(chain) == list(range(1, QUICK_STEPS + 1)), f"rank {r}"
        for indices in chain.values():
            assert len(indices) == BATCH
            counts.update(indices)
    assert sorted(counts) == list(range(QUICK_STEPS * BATCH * WORLD))
    assert set(counts.values()) == {1}
    # Nothing trained before the resumed step was trained again: the restarted workers began
    # at the step after it.
    for r in range(WORLD):
        after_kill = [e["step"] for e in _lines(run_dir / "samples" / f"rank{r}.jsonl") if e["attempt"] > 0]
        assert min(after_kill) == resumed + 1, f"rank {r}"

    # The agent's saver persisted the step the kill left in memory (nobody asked it to), unless
    # the regular schedule had persisted it already: the newest step every rank held complete. The
    # example's checkpoint is replicated (any rank's copy restores every rank), so the restart may
    # resume from a newer step that only the surviving rank had staged when the other was killed.
    agent_log = (run_dir / "dlrover-run.log").read_text()
    persisted = re.search(r"flashckpt failure_persist step=(-?\d+): ", agent_log)
    assert persisted is not None, agent_log[-4000:]
    step = int(persisted.group(1))
    assert step == -1 or min(staged_before) <= step <= resumed, (step, staged_before, resumed)

    # The persisted checkpoint is where the summary says, and nothing is left behind.
    assert json.loads((Path(summary["checkpoint"]) / "tracker.json").read_text())
    assert not list(Path("/dev/shm").glob(f"*{summary['job_id']}*"))
    assert not (run_dir / "tmp").exists()
    assert not processes_mentioning(summary["job_id"])
    # The saver ran inside dlrover-run's agent (no detached saver process was started), and went
    # with it.
    saver_pid = int((run_dir / "saver.pid").read_text())
    assert saver_pid == summary["launcher_pid"]
    assert not processes_mentioning("dlrover.flashckpt.saver_main\0--job\0" + summary["job_id"])

    # Bit for bit: a fault-free run with the same seeds ends with the same files for the final
    # step (every rank's model and optimizer tensors, and its data position), byte for byte.
    clean_dir = tmp_path / "fault-free"
    clean = _run(
        [
            *[sys.executable, "-m", "dlrover.launcher.cli", "--standalone", "--nproc-per-node=2"],
            f"--log-dir={clean_dir / 'logs'}",
            *[str(ROOT / "examples" / "gpt" / "train.py"), f"--out={clean_dir}", f"--steps={QUICK_STEPS}"],
            f"--job-id={summary['job_id']}-clean",
        ],
        240,
    )
    assert clean.returncode == 0, clean.stdout
    final_with_kill = Path(summary["checkpoint"]) / str(QUICK_STEPS)
    final_clean = clean_dir / "checkpoints" / str(QUICK_STEPS)
    for r in range(WORLD):
        for suffix in (".safetensors", ".json"):
            name = f"rank_{r:05d}{suffix}"
            assert (final_with_kill / name).read_bytes() == (final_clean / name).read_bytes(), name
    assert not list(Path("/dev/shm").glob(f"*{summary['job_id']}-clean*"))


@pytest.mark.timeout(240)
def test_train_runs_under_plain_torchrun_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # --log-dir keeps torch's run folders in tmp_path instead of /tmp/torchelastic_*.
    logs = f"--log-dir={tmp_path / 'torchrun-logs'}"
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", logs]
    train = [str(ROOT / "examples" / "gpt" / "train.py"), f"--out={out}", "--persist-every=5", "--log-every=5"]
    first = _run([*base, *train, "--steps=10"], 200)
    assert first.returncode == 0, first.stdout
    assert "[train] step   10/10" in first.stdout
    # A second run with more steps picks up the torch.save checkpoint of the first.
    second = _run([*base, *train, "--steps=15"], 200)
    assert second.returncode == 0, second.stdout
    events = _lines(out / "progress.jsonl")
    assert [e["step"] for e in events if e["event"] == "resumed"] == [10]
    assert [e["step"] for e in events if e["event"] == "finished"] == [10, 15]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 16))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--steps=10", "--batches-per-shard=4"], "--batches-per-shard must divide --steps (10), got 4"),
        (["--steps=10", "--samples=320", "--batches-per-shard=2"], "--batches-per-shard must be 1 with --samples"),
    ],
)
def test_train_refuses_shards_that_ranks_cannot_share_evenly(tmp_path: Path, args: list[str], reason: str) -> None:
    # A rank finding no shard while a peer still trains its last one would wait inside the peer's collective.
    done = _run([sys.executable, "examples/gpt/train.py", f"--out={tmp_path}", *args], timeout_s=90)
    assert done.returncode == 2, done.stdout
    assert reason in done.stdout
