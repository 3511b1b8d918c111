"""`dlrover-run` end to end: real agents, an embedded master, real workers over gloo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dlrover.common import remove_dead_owners
from dlrover.flashckpt import cleanup_stale
from dlrover.launcher.cli import TOKEN_DIR_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TRAIN = textwrap.dedent(
    """
    import json, os, signal, sys
    preloaded = "torch" in sys.modules  # a standby worker (the default) imported it already
    import torch, torch.distributed as dist

    out, kill_at = sys.argv[1], int(sys.argv[2])
    fault = getattr(signal, "SIG" + (sys.argv[3] if len(sys.argv) > 3 else "KILL"))
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    ckpt = os.path.join(out, "ckpt.pt")
    state = torch.load(ckpt) if os.path.exists(ckpt) else {"step": 0, "w": torch.zeros(4)}
    dist.barrier()
    for step in range(state["step"], 8):
        if step == kill_at and attempt == 0 and rank == 1:
            os.kill(os.getpid(), fault)
        grad = torch.full((4,), float(rank + 1))
        dist.all_reduce(grad)
        state["w"] += grad
        state["step"] = step + 1
        if rank == 0:
            torch.save(state, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"step": state["step"], "w": state["w"].tolist(), "attempt": attempt, "preloaded": preloaded}, f)
    dist.destroy_process_group()
    """
)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "out").mkdir()
    return tmp_path


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _dlrover_run(spawn: list[subprocess.Popen[str]], run_dir: Path, *args: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "dlrover.launcher.cli", "--standalone", "--nproc-per-node=2",
        f"--log-dir={run_dir / 'logs'}", "--monitor-interval=0.05", "--heartbeat-interval=0.5", *args,
    ]  # fmt: skip
    env = {**os.environ, "DLROVER_LOG_LEVEL": "INFO"}
    env.pop("DLROVER_JOB_TOKEN", None)
    env.pop("DLROVER_JOB_TOKEN_FILE", None)
    proc = subprocess.Popen(
        cmd, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    spawn.append(proc)
    return proc


@pytest.mark.parametrize("prewarm", [False, True])
def test_a_killed_worker_is_restarted_and_the_job_finishes(
    run_dir: Path, spawn: list[subprocess.Popen[str]], prewarm: bool
) -> None:
    # The kill comes before any flash checkpoint: the restart's standbys start when the group stops.
    # Standby workers are the default; --prewarm=none asks for fresh ones.
    flags = ["--max-restarts=2", *([] if prewarm else ["--prewarm=none"])]
    proc = _dlrover_run(spawn, run_dir, *flags, str(run_dir / "train.py"), str(run_dir / "out"), "3")
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    result = json.loads((run_dir / "out" / "result.json").read_text())
    assert result["step"] == 8
    assert result["attempt"] == 1
    # By default the restarted workers came from standbys that had imported torch; none of
    # those standbys outlives the job.
    assert result["preloaded"] is prewarm
    standbys = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not standbys, standbys
    # Every step added 1 + 2 to each weight exactly once, across the restart.
    assert result["w"] == [24.0] * 4
    summary = [line for line in output.splitlines() if "finished with exit code 0" in line]
    assert summary, output
    assert "after 1 restart(s)" in summary[-1], output


def test_a_hung_worker_is_detected_and_restarted(run_dir: Path, spawn: list[subprocess.Popen[str]]) -> None:
    args = [str(run_dir / "train.py"), str(run_dir / "out"), "3", "STOP"]
    proc = _dlrover_run(spawn, run_dir, "--max-restarts=2", "--hang-timeout=3", *args)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    result = json.loads((run_dir / "out" / "result.json").read_text())
    assert (result["step"], result["attempt"], result["w"]) == (8, 1, [24.0] * 4)
    assert "no CPU progress" in output
    summary = [line for line in output.splitlines() if "finished with exit code 0" in line]
    assert summary, output
    assert "after 1 restart(s)" in summary[-1], output


def test_a_user_code_error_stops_the_job_instead_of_looping(run_dir: Path, spawn: list[subprocess.Popen[str]]) -> None:
    bad = run_dir / "bad.py"
    bad.write_text("import this_module_does_not_exist_anywhere\n")
    proc = _dlrover_run(spawn, run_dir, "--max-restarts=5", str(bad))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode != 0
    summary = [line for line in output.splitlines() if "finished with exit code" in line]
    assert summary, output
    assert "after 0 restart(s)" in summary[-1], output
    assert "this_module_does_not_exist_anywhere" in output


def _children_of(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children() if _alive(c.pid)]


def test_killing_the_agent_takes_its_workers_with_it(run_dir: Path, spawn: list[subprocess.Popen[str]]) -> None:
    sleeper = run_dir / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    proc = _dlrover_run(spawn, run_dir, str(sleeper))
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while len(workers) < 2:
        assert time.monotonic() < deadline, "workers did not start"
        workers = _children_of(proc.pid)
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their agent"
        time.sleep(0.1)
    # A SIGKILLed agent cannot clean up after itself: the next dlrover-run on the host sweeps what
    # it left (its saver host's socket and owner record, its private token dir). Sweep it here.
    swept = [p.name for p in cleanup_stale("/dev/shm")]
    assert any(name.startswith(f"dlrover-fc.host{proc.pid}.") for name in swept), swept
    swept = [p.name for p in remove_dead_owners(TOKEN_DIR_PREFIX)]
    assert any(name.startswith(f"{TOKEN_DIR_PREFIX}{proc.pid}-") for name in swept), swept


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
