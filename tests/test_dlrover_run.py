"""`dlrover-run` end to end: real agents, an embedded master, real workers over gloo."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from dlrover.common import generate_token, remove_dead_owners, write_token_file
from dlrover.flashckpt.segment import DEFAULT_SHM_DIR
from dlrover.launcher.agent import NODE_SHM_PREFIX
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


@pytest.mark.parametrize("prewarm", [False, True])
def test_a_killed_worker_is_restarted_and_the_job_finishes(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]], prewarm: bool
) -> None:
    # The kill comes before any flash checkpoint: the restart's standbys start when the group stops.
    # Standby workers are the default; --prewarm=none asks for fresh ones.
    flags = ["--max-restarts=2", *([] if prewarm else ["--prewarm=none"])]
    proc = dlrover_run(run_dir, *flags, str(run_dir / "train.py"), str(run_dir / "out"), "3")
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    result = json.loads((run_dir / "out" / "result.json").read_text())
    assert result["step"] == 8
    assert result["attempt"] == 1
    # By default the restarted workers came from standbys that had imported torch; none of
    # those standbys outlives the job.
    assert result["preloaded"] is prewarm
    # The first workers' standbys started before the agent was imported (`early_standbys`).
    assert ("standby worker(s) started before the agent" in output) is prewarm, output
    standbys = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not standbys, standbys
    # Every step added 1 + 2 to each weight exactly once, across the restart.
    assert result["w"] == [24.0] * 4
    summary = [line for line in output.splitlines() if "finished with exit code 0" in line]
    assert summary, output
    assert "after 1 restart(s)" in summary[-1], output


def test_a_hung_worker_is_detected_and_restarted(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    args = [str(run_dir / "train.py"), str(run_dir / "out"), "3", "STOP"]
    proc = dlrover_run(run_dir, "--max-restarts=2", "--hang-timeout=3", *args)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    result = json.loads((run_dir / "out" / "result.json").read_text())
    assert (result["step"], result["attempt"], result["w"]) == (8, 1, [24.0] * 4)
    assert "no CPU progress" in output
    summary = [line for line in output.splitlines() if "finished with exit code 0" in line]
    assert summary, output
    assert "after 1 restart(s)" in summary[-1], output


# Fails with an error no rule explains (as a transient fault looks) until its attempt number
# (TORCHELASTIC_RESTART_COUNT) reaches argv[2]; each attempt leaves a mark naming its max restarts.
FLAKY = textwrap.dedent(
    """
    import os, sys
    out, failures = sys.argv[1], int(sys.argv[2])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with open(os.path.join(out, f"attempt-{attempt}.txt"), "w") as f:
        f.write(os.environ["TORCHELASTIC_MAX_RESTARTS"])
    if attempt < failures:
        raise RuntimeError(f"transient fault on attempt {attempt}")
    """
)


def _run_flaky(
    dlrover_run: Callable[..., subprocess.Popen[str]], run_dir: Path, max_restarts: int
) -> tuple[int, str, dict[int, str]]:
    """Run FLAKY failing 4 times under `--max-restarts`; (exit status, output, mark of each attempt)."""
    script = run_dir / "flaky.py"
    script.write_text(FLAKY)
    out = run_dir / "out"
    flags = ["--nproc-per-node=1", f"--max-restarts={max_restarts}", "--prewarm=none"]
    proc = dlrover_run(run_dir, *flags, str(script), str(out), "4")
    output, _ = proc.communicate(timeout=240)
    marks = {int(p.stem.removeprefix("attempt-")): p.read_text() for p in out.glob("attempt-*.txt")}
    return proc.returncode, output, marks


def test_max_restarts_beyond_the_masters_defaults_lets_a_flaky_worker_finish(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    # As under torchrun: --max-restarts=5 restarts the workers up to 5 times; the embedded master
    # takes its budget from the agent and, relaunching no node, restarts them in place.
    code, output, marks = _run_flaky(dlrover_run, run_dir, 5)
    assert code == 0, output
    assert marks == {attempt: "5" for attempt in range(5)}, output
    summary = [line for line in output.splitlines() if "finished with exit code 0" in line]
    assert summary, output
    assert "after 4 restart(s)" in summary[-1], output
    assert ", in place: this job's backend starts no new node" in output
    assert "relaunch" not in output


def test_a_worker_failing_past_max_restarts_ends_the_job_with_the_reason(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    code, output, marks = _run_flaky(dlrover_run, run_dir, 3)
    assert code == 1, output
    assert sorted(marks) == [0, 1, 2, 3], output
    summary = [line for line in output.splitlines() if "finished with exit code 1" in line]
    assert summary, output
    assert "after 3 restart(s)" in summary[-1], output
    assert "the master stopped the job: node 0 (rank 0) failed with exit status 1: " in summary[-1], output
    assert "restarted 3 of 3 times (--max-restarts), no restarts left" in summary[-1], output
    assert "transient fault on attempt 3" in output


def test_a_user_code_error_stops_the_job_instead_of_looping(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    bad = run_dir / "bad.py"
    bad.write_text("import this_module_does_not_exist_anywhere\n")
    proc = dlrover_run(run_dir, "--max-restarts=5", str(bad))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode != 0
    summary = [line for line in output.splitlines() if "finished with exit code" in line]
    assert summary, output
    assert "after 0 restart(s)" in summary[-1], output
    # The reason says why it stopped: the master diagnosed the user's bug from the worker's traceback.
    assert "the master stopped the job: node 0 (rank 0) failed with exit status 1: user_code: " in summary[-1], output
    assert "No module named 'this_module_does_not_exist_anywhere'" in summary[-1], output


# A worker that fails the way a lost peer makes it fail: NCCL's watchdog timeout, then exit 1.
COMMUNICATION_FAILURE = textwrap.dedent(
    """
    import sys
    print(
        "[rank0]:[E1128 04:18:03.337165 5122 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600048 "
        "milliseconds before timing out.",
        file=sys.stderr,
    )
    sys.exit(1)
    """
)


def test_the_stop_reason_of_a_communication_failure_names_what_happened(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    script = run_dir / "comm.py"
    script.write_text(COMMUNICATION_FAILURE)
    flags = ["--nproc-per-node=1", "--max-restarts=2", "--prewarm=none"]
    proc = dlrover_run(run_dir, *flags, str(script))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, output
    summary = [line for line in output.splitlines() if "finished with exit code 1 after 2 restart(s)" in line]
    assert summary, output
    # What follows the reason is where the workers' logs are.
    printed = summary[-1].split(" round(s): ", 1)[1].split("; worker logs in ", 1)[0]
    # The reason printed is the master's decision as it was taken: the job stopped.
    assert printed.startswith("the master stopped the job: "), printed
    reason = printed.removeprefix("the master stopped the job: ")
    assert reason.startswith("node 0 (rank 0) failed with exit status 1: communication: "), reason
    assert "Watchdog caught collective operation timeout" in reason
    assert "restarted 2 of 2 times (--max-restarts), no restarts left" in reason
    assert reason.endswith("no node is left: the job stops"), reason
    # Nothing claims a relaunch or a replacement, nor a node created that nothing would start,
    # and every restart is counted one way: "restart k of 2".
    assert "relaunch" not in output
    assert "replace" not in reason
    assert "created for rank" not in output
    counts = re.findall(r"restart (\d+) of (\d+)", output)
    assert counts, output
    assert {n for _, n in counts} == {"2"}, counts
    assert {k for k, _ in counts} == {"1", "2"}, counts
    # The embedded master's event log, in --log-dir, ends the job with the same reason.
    (log,) = (run_dir / "logs").glob("*_events.jsonl")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["message"] for e in events if e["kind"] == "job_end"] == [f"job failed: {reason}"]
    assert [e["kind"] for e in events].count("process_restart") == 2


def test_a_masters_status_and_event_log_hold_the_stop_reason_its_agent_printed(
    run_dir: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    # The same failure under a dlrover-master with the external backend (bare metal, Slurm): the
    # master lingers after the job ends (up to --linger-max-s), so its status can be asked.
    script = run_dir / "comm.py"
    script.write_text(COMMUNICATION_FAILURE)
    token_file = write_token_file(run_dir / "token", generate_token())
    events = run_dir / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_")}
    master_log = (run_dir / "master.log").open("w")
    master = subprocess.Popen(
        [
            sys.executable, "-m", "dlrover.master.cli", "--backend=external", "--nnodes=1", "--port=0",
            f"--token-file={token_file}", f"--event-log={events}", "--heartbeat-interval-s=60",
            "--heartbeat-timeout-s=120", "--linger-max-s=120", "--node-start-timeout-s=0",
        ],
        env=env, stdout=subprocess.PIPE, stderr=master_log, text=True, start_new_session=True,
    )  # fmt: skip
    master_log.close()
    spawn.append(master)
    assert master.stdout is not None
    first = master.stdout.readline()
    assert "dlrover-master listening on " in first, first
    address = first.split("listening on ", 1)[1].split()[0]
    agent = subprocess.Popen(
        [
            sys.executable, "-m", "dlrover.launcher.cli", f"--master={address}", f"--token-file={token_file}",
            "--nnodes=1", "--nproc-per-node=1", "--max-restarts=2", "--prewarm=none", "--local-addr=127.0.0.1",
            "--monitor-interval=0.05", "--heartbeat-interval=0.5", f"--log-dir={run_dir / 'logs'}", str(script),
        ],
        env={**env, "DLROVER_LOG_LEVEL": "INFO"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    spawn.append(agent)
    output, _ = agent.communicate(timeout=240)
    assert agent.returncode == 1, output
    summary = [line for line in output.splitlines() if "finished with exit code 1 after 2 restart(s)" in line]
    assert summary, output
    reason = summary[-1].split(" round(s): the master stopped the job: ", 1)[1].split("; worker logs in ", 1)[0]
    assert "restarted 2 of 2 times (--max-restarts), no restarts left" in reason
    assert "relaunch" not in output
    # GetJobStatus, through `dlrover-master status`, holds that reason.
    status = subprocess.run(
        [sys.executable, "-m", "dlrover.master.cli", "status", f"--master={address}", f"--token-file={token_file}"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert status.stdout.splitlines()[0] == f"job dlrover-job: failed ({reason})", status.stdout
    # So does the event log, and what the master prints as it exits.
    os.killpg(master.pid, signal.SIGTERM)
    rest, _ = master.communicate(timeout=60)
    assert master.returncode == 1, rest
    assert f"job failed: {reason}" in rest.splitlines()
    ends = [json.loads(line)["message"] for line in events.read_text().splitlines() if '"job_end"' in line]
    assert ends == [f"job failed: {reason}"]


FAILING = textwrap.dedent(
    """
    import os, time

    def load_batch():
        raise ValueError("bad batch in the user's code")

    if os.environ["RANK"] == "1":
        load_batch()
    time.sleep(600)
    """
)


def test_a_failing_scripts_traceback_is_printed_once_from_its_own_frame_and_its_log_outlives_the_run(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    script = run_dir / "failing.py"
    script.write_text(FAILING)
    # No --log-dir: the logs go to ./dlrover-logs, in the (temporary) directory it runs in.
    proc = dlrover_run(run_dir, "--max-restarts=2", str(script), log_dir=False)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, output
    lines = output.splitlines()
    # The traceback is printed once, whole, by the worker, and starts at the script's own frame.
    assert output.count("Traceback (most recent call last):") == 1, output
    start = lines.index("Traceback (most recent call last):")
    assert lines[start + 1].startswith(f'  File "{script}", line '), output
    assert lines[start + 1 : start + 6] == [
        f'  File "{script}", line 8, in <module>',
        "    load_batch()",
        f'  File "{script}", line 5, in load_batch',
        '    raise ValueError("bad batch in the user\'s code")',
        "ValueError: bad batch in the user's code",
    ], output
    assert output.count(f'File "{script}", line 5, in load_batch') == 1, output
    assert "_standby.py" not in output
    assert "dlrover/launcher" not in output
    # Its log folder was named at the start, survives dlrover-run, and the summary names it again.
    (started,) = [line for line in lines if "worker logs and error files go under" in line]
    folder = Path(started.rsplit(" go under ", 1)[1])
    assert folder.parent == run_dir / "dlrover-logs", started
    summary = [line for line in lines if "finished with exit code 1" in line]
    assert summary, output
    assert summary[-1].endswith(f"; worker logs in {folder}"), summary[-1]
    assert lines[-1] == summary[-1]
    stderr_log = folder / "attempt_0" / "1" / "stderr.log"
    assert "ValueError: bad batch in the user's code" in stderr_log.read_text()
    # The agent's own line about the failure names the exception and that file, not the traceback.
    (failed,) = [line for line in lines if "failed with exit code 1" in line]
    assert failed.endswith(f": ValueError: bad batch in the user's code; its whole output: {stderr_log}"), failed


def test_log_cleanup_on_success_removes_the_runs_logs(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    script = run_dir / "fine.py"
    script.write_text("print('done')\n")
    flags = ["--log-cleanup=on-success", "--prewarm=none", "--nproc-per-node=1"]
    proc = dlrover_run(run_dir, *flags, str(script), log_dir=False)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    assert output.splitlines()[-1].endswith("; worker logs removed (--log-cleanup=on-success)"), output
    assert not (run_dir / "dlrover-logs").exists()  # its run's folder, then the emptied default root


def test_killing_the_agent_takes_its_workers_with_it(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    # Each worker says it runs: the agent's children are not enough, its standbys start before the agent
    # has set anything up (`early_standbys`).
    sleeper = run_dir / "sleep.py"
    sleeper.write_text(
        "import os, pathlib, sys, time\npathlib.Path(sys.argv[1], str(os.getpid())).touch()\ntime.sleep(600)\n"
    )
    proc = dlrover_run(run_dir, str(sleeper), str(run_dir / "out"))
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while len(workers) < 2:
        assert time.monotonic() < deadline, "workers did not start"
        workers = [int(p.name) for p in (run_dir / "out").iterdir()]
        time.sleep(0.1)

    # What the agent owns: its shared-memory dir (with its saver host's socket) and its private token dir.
    def owned() -> list[Path]:
        return [
            *Path(DEFAULT_SHM_DIR).glob(f"{NODE_SHM_PREFIX}{proc.pid}-*"),
            *Path(tempfile.gettempdir()).glob(f"{TOKEN_DIR_PREFIX}{proc.pid}-*"),
        ]

    assert len(owned()) == 2, owned()
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their agent"
        time.sleep(0.1)
    # A SIGKILLed agent cannot clean up after itself: the next dlrover-run on the host sweeps what
    # it left. Sweep it here (another dlrover-run starting on this host meanwhile may have swept it
    # first: either way, nothing of it is left).
    remove_dead_owners(NODE_SHM_PREFIX, dir=DEFAULT_SHM_DIR)
    remove_dead_owners(TOKEN_DIR_PREFIX)
    assert owned() == []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# Reaches the master the way a shard or checkpoint client in a worker does: its address and a
# token file from the environment the agent gave.
ASK_THE_MASTER = textwrap.dedent(
    """
    import json, os, sys
    from dlrover.common import load_token
    from dlrover.master import MasterClient
    token_file = os.environ["DLROVER_JOB_TOKEN_FILE"]
    with MasterClient(os.environ["DLROVER_MASTER_ADDR"], load_token(token_file=token_file)) as client:
        status = client.job_status()
    with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"state": status.state, "nodes": len(status.nodes), "token_file": token_file}, f)
    """
)


def test_the_same_plain_torch_script_runs_unchanged_under_torchrun_and_dlrover_run(
    run_dir: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    # TRAIN knows nothing of DLRover: torch.distributed and the torchrun environment only.
    results = {}
    deadline = time.monotonic() + 270  # both runs, inside the module's 300 s: a hang shows its output
    for launcher in ("torchrun", "dlrover-run"):
        out = run_dir / f"out-{launcher}"
        out.mkdir()
        flags = ["--standalone", "--nproc-per-node=2", f"--log-dir={run_dir / 'logs' / launcher}"]
        script = [str(run_dir / "train.py"), str(out), "-1"]  # -1: no step kills itself
        module = "torch.distributed.run" if launcher == "torchrun" else "dlrover.launcher.cli"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_", "TORCHELASTIC_"))}
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *flags, *script],
            cwd=run_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        spawn.append(proc)
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert proc.returncode == 0, f"{launcher}: {output}"
        results[launcher] = json.loads((out / "result.json").read_text())
    for result in results.values():
        assert (result["step"], result["attempt"], result["w"]) == (8, 0, [24.0] * 4)


@pytest.mark.parametrize("token_flag", [False, True])
def test_a_single_node_job_needs_no_master_flags_and_its_workers_reach_the_master(
    run_dir: Path, spawn: list[subprocess.Popen[str]], token_flag: bool
) -> None:
    # As `torchrun --nproc-per-node=2 script` runs a one-node job with no rendezvous flags.
    from dlrover.common import generate_token, write_token_file

    script = run_dir / "ask.py"
    script.write_text(ASK_THE_MASTER)
    out = run_dir / "out"
    given = write_token_file(run_dir / "token", generate_token()) if token_flag else None
    cmd = [
        sys.executable, "-m", "dlrover.launcher.cli", "--nproc-per-node=2", f"--log-dir={run_dir / 'logs'}",
        *([f"--token-file={given}"] if given else []), str(script), str(out),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_")}
    proc = subprocess.Popen(
        cmd, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    spawn.append(proc)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    for rank in range(2):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert seen["state"] == "running"
        assert seen["nodes"] == 1
        if given is not None:
            # The workers read the very file given: the embedded master took its token.
            assert seen["token_file"] == str(given.resolve())


def test_a_multi_node_job_without_a_master_is_refused_with_the_ways_to_name_one(tmp_path: Path) -> None:
    script = tmp_path / "noop.py"
    script.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_")}
    cmd = [sys.executable, "-m", "dlrover.launcher.cli", "--nnodes=1:2", str(script)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "--nnodes=1:2 needs a master" in done.stderr
    assert "--master HOST:PORT" in done.stderr


# Saves a flash checkpoint of step 1, records that it did, then ignores SIGTERM and sleeps: only
# the agent's SIGKILL after the grace period ends it.
STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch, torch.distributed as dist
    from dlrover.flashckpt import FlashCheckpointer, StagerConfig, torch_distributed_agree
    out, ckpt_dir = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    ckpt = FlashCheckpointer(
        StagerConfig(job_id="sigterm", run_id="r", rank=rank, world_size=world),
        ckpt_dir,
        agree=torch_distributed_agree(),
    )
    state = {"w": torch.full((1024,), float(rank)), "step": 1}
    ckpt.save(1, state)
    dist.barrier()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(out, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    """
)


def test_sigterm_persists_the_newest_snapshot_stops_stubborn_workers_and_leaves_nothing(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    script = run_dir / "stubborn.py"
    script.write_text(STUBBORN)
    out, ckpt_dir = run_dir / "out", run_dir / "ckpt"
    proc = dlrover_run(run_dir, "--shutdown-grace=1", str(script), str(out), str(ckpt_dir))
    deadline = time.monotonic() + 180
    while not all((out / f"rank{r}.pid").exists() for r in range(2)):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the workers did not save and settle"
        time.sleep(0.1)
    workers = [int((out / f"rank{r}.pid").read_text()) for r in range(2)]
    token_dirs = list(Path(tempfile.gettempdir()).glob(f"{TOKEN_DIR_PREFIX}{proc.pid}-*"))
    assert token_dirs  # the agent's private token copy, to be removed on the way out
    # The workers' snapshots are in a shared-memory dir of the agent's own.
    (node_dir,) = Path(DEFAULT_SHM_DIR).glob(f"{NODE_SHM_PREFIX}{proc.pid}-*")
    assert list(node_dir.glob("dlrover-fc.sigterm.r.r1.s*"))
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, output
    # Workers that ignored SIGTERM were killed after the grace period, and reaped: no orphan,
    # no zombie.
    assert not any(_alive(pid) for pid in workers), output
    # The log says so as it happens: the signal when it arrived, then which workers were killed,
    # and the summary line comes last, once everything has stopped.
    lines = output.splitlines()
    (arrived,) = [i for i, line in enumerate(lines) if "received SIGTERM: stopping the workers" in line]
    assert "SIGKILL after the 1 s grace period" in lines[arrived], lines[arrived]
    for rank, pid in enumerate(workers):
        killed = [i for i, line in enumerate(lines) if f"(rank {rank}, pid {pid}) did not exit within" in line]
        assert len(killed) == 1, output
        assert killed[0] > arrived
        assert lines[killed[0]].endswith("grace period after SIGTERM: sending SIGKILL"), lines[killed[0]]
    assert "finished with exit code 143" in lines[-1], output
    assert sum("finished with exit code" in line for line in lines) == 1
    # The step that was only in memory reached storage, committed by every rank.
    tracker = json.loads((ckpt_dir / "tracker.json").read_text())
    assert (tracker["step"], tracker["world_size"]) == (1, 2)
    # Nothing of the job is left in shared memory or the temp dir.
    assert not node_dir.exists(), output
    assert not list(Path(DEFAULT_SHM_DIR).glob("dlrover-fc.sigterm.*")), output
    assert not any(path.exists() for path in token_dirs)


FORWARDED = textwrap.dedent(
    """
    import os, signal, sys, time
    out, rank = sys.argv[1], os.environ["LOCAL_RANK"]

    def on_signal(signum, _frame):
        with open(os.path.join(out, f"got{rank}"), "w") as f:
            f.write(signal.Signals(signum).name)
        sys.exit(0)

    signal.signal(signal.SIGUSR1, on_signal)
    open(os.path.join(out, f"ready{rank}"), "w").close()
    time.sleep(600)
    """
)


def test_a_signal_in_signals_to_handle_is_forwarded_to_the_workers_as_torchrun_does(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    script = run_dir / "forwarded.py"
    script.write_text(FORWARDED)
    out = run_dir / "out"
    out.mkdir(exist_ok=True)
    proc = dlrover_run(run_dir, "--signals-to-handle=SIGTERM,SIGUSR1", str(script), str(out))
    deadline = time.monotonic() + 180
    while not all((out / f"ready{r}").exists() for r in range(2)):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)  # Slurm's warning signal, say
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGUSR1, output
    assert [(out / f"got{r}").read_text() for r in range(2)] == ["SIGUSR1", "SIGUSR1"]


# The one-line flash checkpoint: no ids, ranks or agreement in the script. With `kill_at` >= 0,
# rank 1 SIGKILLs itself in the first attempt once step `kill_at` is in memory on both ranks, and
# the restarted workers load it from memory (agreeing over the default group) and finish. At the
# end each rank closes its checkpointer and opens another, as a restarted process would: it finds
# the last step in memory. Each rank records what it loaded and who its checkpointer says it is.
ONE_LINER = textwrap.dedent(
    """
    import json, os, signal, sys
    import torch, torch.distributed as dist
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError

    out, ckpt_dir, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def record(ckpt, what, source, step):
        c = ckpt.config
        with open(os.path.join(out, f"rank{rank}-{what}-{os.getpid()}.json"), "w") as f:
            json.dump({"attempt": attempt, "source": source, "step": step, "job": c.job_id, "run": c.run_id,
                       "rank": c.rank, "world": c.world_size, "reason": ckpt.identity_reason}, f)

    ckpt = FlashCheckpointer(ckpt_dir)
    state = {"w": torch.zeros(4096), "step": 0}
    try:
        source = ckpt.load(target=state).source
    except NoCheckpointError:
        source = None
    record(ckpt, "start", source, state["step"])
    for step in range(state["step"], 6):
        if step == kill_at and attempt == 0 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        grad = torch.full((4096,), float(rank + 1))
        dist.all_reduce(grad)
        state["w"] += grad
        state["step"] = step + 1
        ckpt.save(step + 1, state, persist=step + 1 == 6)
        dist.barrier()  # both ranks hold the step before either goes on
    if state["step"] == 6 and source != "storage":
        assert ckpt.wait_persisted(6, timeout_s=120).ok
    dist.barrier()
    ckpt.close()
    again = FlashCheckpointer(ckpt_dir)
    fresh = {"w": torch.zeros(4096), "step": 0}
    record(again, "reopen", again.load(target=fresh).source, fresh["step"])
    assert torch.equal(fresh["w"], state["w"])
    dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"step": state["step"], "w": sorted(set(state["w"].tolist()))}, f)
    again.close(job_end=rank == 0)
    dist.destroy_process_group()
    """
)


def _records(out: Path, what: str) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"rank*-{what}-*.json"))]


def _one_identity(out: Path, run_id: str) -> str:
    """The job id every checkpointer of every attempt had (with `run_id` and world size 2)."""
    records = _records(out, "start") + _records(out, "reopen")
    assert {(r["run"], r["world"]) for r in records} == {(run_id, 2)}, records
    jobs = {str(r["job"]) for r in records}
    assert len(jobs) == 1, records
    return jobs.pop()


def _check_result(out: Path, ckpt_dir: Path, reopened_from: str = "memory") -> None:
    result = json.loads((out / "result.json").read_text())
    assert result == {"step": 6, "w": [18.0]}  # each step added 1 + 2 exactly once
    for r in _records(out, "reopen"):
        assert (r["source"], r["step"]) == (reopened_from, 6), r
    tracker = json.loads((ckpt_dir / "tracker.json").read_text())
    assert (tracker["step"], tracker["world_size"]) == (6, 2)


def _torchrun(spawn: list[subprocess.Popen[str]], run_dir: Path, logs: str, *args: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        f"--log-dir={run_dir / logs}", *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_", "TORCHELASTIC_"))}
    proc = subprocess.Popen(
        cmd, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    spawn.append(proc)
    return proc


def test_the_one_line_checkpointer_resumes_from_memory_after_a_kill_under_dlrover_run(
    run_dir: Path, dlrover_run: Callable[..., subprocess.Popen[str]]
) -> None:
    from dlrover.flashckpt.job_env import run_id_for

    script = run_dir / "one_liner.py"
    script.write_text(ONE_LINER)
    out, ckpt_dir = run_dir / "out", run_dir / "ckpt"
    proc = dlrover_run(run_dir, "--max-restarts=2", str(script), str(out), str(ckpt_dir), "3")
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    _check_result(out, ckpt_dir)
    starts = sorted((r["attempt"], r["rank"], r["source"], r["step"]) for r in _records(out, "start"))
    assert starts == [(0, 0, None, 0), (0, 1, None, 0), (1, 0, "memory", 3), (1, 1, "memory", 3)], starts
    # One identity across the restart: the agent named the job (its run id, a fresh uuid here).
    job = _one_identity(out, run_id_for(str(ckpt_dir)))
    assert len(job) == 36, job
    assert all("DLROVER_JOB_ID (dlrover-run)" in str(r["reason"]) for r in _records(out, "start"))
    assert not list(Path(DEFAULT_SHM_DIR).glob(f"{NODE_SHM_PREFIX}{proc.pid}-*")), output
    assert not list(Path(DEFAULT_SHM_DIR).glob(f"dlrover-fc.{job}.*")), output


def test_the_one_line_checkpointer_saves_and_loads_with_agreement_under_plain_torchrun(
    run_dir: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    # No agent of ours: torchrun's run id names the job and a detached saver persists. No kill
    # here: with torch 2.13, a torchrun restart over gloo fails in init_process_group when its
    # ranks reach it seconds apart (a rank dials its peer's address from the attempt before),
    # with or without this library; dlrover-run's agent gives every round a fresh store.
    from dlrover.flashckpt.job_env import run_id_for

    script = run_dir / "one_liner.py"
    script.write_text(ONE_LINER)
    ckpt_dir = run_dir / "ckpt"
    jobs = []
    for attempt, out in enumerate((run_dir / "out", run_dir / "out-again")):
        out.mkdir(exist_ok=True)
        proc = _torchrun(spawn, run_dir, f"logs{attempt}", str(script), str(out), str(ckpt_dir), "-1")
        output, _ = proc.communicate(timeout=200)
        assert proc.returncode == 0, output
        # The second job saves nothing (it starts at the end): its memory stays empty.
        _check_result(out, ckpt_dir, "memory" if attempt == 0 else "storage")
        jobs.append(_one_identity(out, run_id_for(str(ckpt_dir))))
        assert all("TORCHELASTIC_RUN_ID=" in str(r["reason"]) for r in _records(out, "start"))
        deadline = time.monotonic() + 60  # the detached saver removes the job's memory as it exits
        while list(Path(DEFAULT_SHM_DIR).glob(f"dlrover-fc.{jobs[-1]}.*")):
            assert time.monotonic() < deadline, list(Path(DEFAULT_SHM_DIR).glob(f"dlrover-fc.{jobs[-1]}.*"))
            time.sleep(0.1)
    # A second job (another torchrun) is another job id: it loads the first's checkpoint from
    # storage, the committed step every rank agreed on, never the first job's memory.
    assert jobs[0] != jobs[1]
    starts = sorted((r["rank"], r["source"], r["step"]) for r in _records(run_dir / "out-again", "start"))
    assert starts == [(0, "storage", 6), (1, "storage", 6)], starts
