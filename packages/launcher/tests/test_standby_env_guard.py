"""A standby that imported torch honours the variables a script sets before its own `import torch`:
it re-executes in place as a fresh interpreter (same pid), unless the script already did something a
second run would repeat, in which case it warns. Real standby processes, real torch."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlrover.launcher import StandbyPool, WorkerGroup, WorkerSpec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to see a thread count of 1 differ"),
]

PY = sys.executable

# torch caps its threads at the cores it may use, so the tests lower OMP_NUM_THREADS from 2 to 1:
# observable on any machine with two cores or more.
SCRIPT = """
import ctypes, json, os, sys
mode = sys.argv[1]
if mode == "before":
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
elif mode == "after":
    import torch
    os.environ["OMP_NUM_THREADS"] = "1"
elif mode == "harmless":
    # Names torch reads only when used, the worker contract, a value the variable already had.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["MASTER_PORT"] = "29555"
    del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
    os.environ["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    import torch
elif mode == "side-effect":
    with open(os.environ["FACTS_OUT"] + ".log", "a") as log:
        log.write("started\\n")
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
pdeathsig = ctypes.c_int(0)
ctypes.CDLL(None).prctl(2, ctypes.byref(pdeathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        # "pipe:[inode]" -> "pipe": which pipe differs from run to run, what kind of file does not.
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}").split(":")[0]
    except FileNotFoundError:
        pass  # the listing's own descriptor, closed by now
facts = {
    "threads": torch.get_num_threads(),
    "pid": os.getpid(),
    "warm": "dlrover.launcher.env_guard" in sys.modules,
    "pdeathsig": pdeathsig.value,
    "stdin": sys.stdin.read(),
    "argv": sys.argv,
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "fds": fds,
}
with open(os.environ["FACTS_OUT"], "w") as f:
    json.dump(facts, f)
"""


def _wait_until(condition: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"FACTS_OUT": str(tmp_path / "facts.json"), "OMP_NUM_THREADS": "2", "RANK": "0"})
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(extra)
    return env


def _run_warm(
    tmp_path: Path, mode: str, standby_env: dict[str, str], worker_env: dict[str, str]
) -> tuple[dict[str, Any], int, int, str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    program = (PY, "-u", str(script), mode)
    pool = StandbyPool(program, ["torch"], standby_env, size=1)
    try:
        pool.fill()
        standby_pid = pool._ready[0].pid
        group = WorkerGroup([WorkerSpec(local_rank=0, argv=program, env=worker_env)], standby=pool)
        group.start()
        try:
            assert group.pids[0] == standby_pid
            _wait_until(lambda: not group.running())
        finally:
            exits = group.stop(grace_s=0.0)
    finally:
        pool.close()
    assert pool.taken == 1
    facts = json.loads((tmp_path / "facts.json").read_text())
    return facts, standby_pid, exits[0].exit_code, exits[0].stderr_tail


def test_a_variable_set_before_import_torch_reexecs_the_standby_in_place(tmp_path: Path) -> None:
    env = _env(tmp_path)
    facts, standby_pid, code, stderr = _run_warm(tmp_path, "before", env, env)
    assert code == 0, stderr
    assert facts["threads"] == 1  # torch's OpenMP runtime saw the script's value
    assert facts["warm"] is False  # a fresh interpreter ran the script
    assert facts["pid"] == standby_pid  # in place: the agent still watches the right process
    assert facts["pdeathsig"] == 9  # SIGKILL when the agent dies, kept across the exec
    assert facts["stdin"] == ""  # /dev/null, as a fresh worker has
    assert facts["argv"] == [str(tmp_path / "train.py"), "before"]
    assert "OMP_NUM_THREADS was set before the program imported torch" in stderr
    # The open files of a fresh worker (WorkerGroup starts it with /dev/null for stdin, its pipes
    # for stdout and stderr, nothing else): nothing the standby opened survived the exec.
    assert facts["fds"] == {"0": "/dev/null", "1": "pipe", "2": "pipe"}


def test_a_variable_set_after_import_torch_changes_nothing_and_does_not_reexec(tmp_path: Path) -> None:
    env = _env(tmp_path)
    facts, standby_pid, code, stderr = _run_warm(tmp_path, "after", env, env)
    assert code == 0, stderr
    assert facts["warm"] is True
    assert facts["pid"] == standby_pid
    assert facts["threads"] == 2  # as in a fresh run: torch was loaded before the script set 1
    assert facts["omp"] == "1"
    assert "standby worker" not in stderr


def test_allowlisted_names_contract_names_and_unchanged_values_do_not_reexec(tmp_path: Path) -> None:
    standby_env = _env(tmp_path, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    del standby_env["RANK"]  # as the agent does: the rank is known only when a standby is taken
    worker_env = {**standby_env, "RANK": "0", "MASTER_PORT": "29555", "CUDA_VISIBLE_DEVICES": "0"}
    facts, standby_pid, code, stderr = _run_warm(tmp_path, "harmless", standby_env, worker_env)
    assert code == 0, stderr
    assert facts["warm"] is True
    assert facts["pid"] == standby_pid
    assert facts["threads"] == 2
    assert "standby worker" not in stderr


def test_after_a_side_effect_a_late_variable_only_warns(tmp_path: Path) -> None:
    env = _env(tmp_path)
    facts, standby_pid, code, stderr = _run_warm(tmp_path, "side-effect", env, env)
    assert code == 0, stderr
    assert facts["warm"] is True  # not run twice
    assert facts["pid"] == standby_pid
    assert facts["threads"] == 2  # the warm torch kept the standby's value: hence the warning
    assert (tmp_path / "facts.json.log").read_text() == "started\n"  # the side effect happened once
    assert "warning: OMP_NUM_THREADS was set before the program imported torch" in stderr
    assert "imported torch before OMP_NUM_THREADS was set" in stderr
    assert "opened" in stderr
    assert "--prewarm none" in stderr
