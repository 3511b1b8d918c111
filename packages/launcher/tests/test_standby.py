"""Standby workers (`StandbyPool`, `dlrover.launcher._standby`): a warm interpreter runs a worker
exactly as a fresh `python -u SCRIPT` would, with its modules already imported."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from dlrover.common import DLRoverError
from dlrover.launcher import StandbyPool, WorkerGroup, WorkerSpec
from dlrover.launcher._standby import runnable

pytestmark = [pytest.mark.integration]

PY = sys.executable

FACTS = """
import json, os, sys
facts = {
    "argv": sys.argv,
    "name": __name__,
    "path0": sys.path[0],
    "file": os.path.realpath(__file__),
    "rank": os.environ.get("RANK"),
    "leftover": os.environ.get("ONLY_IN_STANDBY_ENV"),
    "preloaded": "prewarm_marker" in sys.modules,
    "stdin": sys.stdin.read(),
    "cwd": os.getcwd(),
}
with open(os.environ["FACTS_OUT"], "w") as f:
    json.dump(facts, f)
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    raise RuntimeError("the script failed on purpose")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def _wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    # Imported after the standby armed its parent-death signal; leaves a file naming its process.
    (tmp_path / "prewarm_marker.py").write_text(
        "import os, pathlib\n"
        "if os.environ.get('MARKER_DIR'):\n"
        "    pathlib.Path(os.environ['MARKER_DIR'], str(os.getpid())).touch()\n"
    )
    (tmp_path / "facts.py").write_text(FACTS)
    pkg = tmp_path / "factspkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(FACTS)
    return tmp_path


def _env(workdir: Path, out: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(workdir), env.get("PYTHONPATH", "")])
    env.update({"FACTS_OUT": str(out), "RANK": "3", **extra})
    return env


def _run_one(
    program: tuple[str, ...], env: dict[str, str], pool: StandbyPool | None, tmp: Path
) -> tuple[dict[str, object], int, str]:
    group = WorkerGroup([WorkerSpec(local_rank=0, argv=program, env=env, log_dir=tmp)], standby=pool)
    group.start()
    try:
        _wait_until(lambda: not group.running())
    finally:
        exits = group.stop(grace_s=0.0)
    facts = json.loads(Path(env["FACTS_OUT"]).read_text())
    return facts, exits[0].exit_code, exits[0].stderr_tail


@pytest.mark.parametrize(
    ("form", "args", "code"),
    [("script", ("0",), 0), ("script", ("7",), 7), ("script", ("raise",), 1), ("module", ("5",), 5)],
)
def test_a_standby_runs_the_worker_as_a_fresh_interpreter_would(
    workdir: Path, tmp_path: Path, form: str, args: tuple[str, ...], code: int
) -> None:
    target = ("-m", "factspkg") if form == "module" else (str(workdir / "facts.py"),)
    program = (PY, "-u", *target, *args)
    fresh, fresh_code, fresh_tail = _run_one(program, _env(workdir, tmp_path / "fresh.json"), None, tmp_path / "f")

    standby_env = _env(workdir, tmp_path / "unused.json", ONLY_IN_STANDBY_ENV="yes")
    pool = StandbyPool(program, ["prewarm_marker"], standby_env, size=1)
    try:
        pool.fill()
        warm, warm_code, warm_tail = _run_one(program, _env(workdir, tmp_path / "warm.json"), pool, tmp_path / "w")
    finally:
        pool.close()
    assert pool.taken == 1
    assert fresh["preloaded"] is False
    assert warm["preloaded"] is True
    # Everything the script can see is the same, including that the standby's own environment
    # is gone and that standard input is empty.
    for facts in (fresh, warm):
        facts.pop("preloaded")
    assert warm == fresh
    assert fresh["name"] == "__main__"
    assert fresh["rank"] == "3"
    assert fresh["leftover"] is None
    assert warm_code == fresh_code == code
    if args == ("raise",):
        assert "RuntimeError: the script failed on purpose" in fresh_tail
        assert "RuntimeError: the script failed on purpose" in warm_tail


def test_a_standby_whose_import_fails_is_replaced_by_a_fresh_worker_and_said_once(
    workdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    program = (PY, "-u", str(workdir / "facts.py"), "0")
    pool = StandbyPool(program, ["no_such_module_for_dlrover_tests"], _env(workdir, tmp_path / "x.json"), size=1)
    try:
        pool.fill()
        pool._ready[0].wait(timeout=60)  # its import fails
        facts, code, _ = _run_one(program, _env(workdir, tmp_path / "run.json"), pool, tmp_path / "logs")
        pool.fill()
        pool._ready[0].wait(timeout=60)
        with caplog.at_level(logging.WARNING, logger="dlrover.launcher.workers"):
            pool.fill()  # reaps the dead one, says why, starts another
            pool._ready[0].wait(timeout=60)
            pool.fill()  # the same failure again: not said again
    finally:
        pool.close()
    assert code == 0
    assert facts["preloaded"] is False
    assert pool.taken == 0
    warnings = [r.getMessage() for r in caplog.records if "exited before it was used" in r.getMessage()]
    assert len(warnings) == 1
    assert "No module named 'no_such_module_for_dlrover_tests'" in warnings[0]


def test_an_environment_too_big_for_the_pipe_starts_the_worker_fresh_without_blocking(
    workdir: Path, tmp_path: Path
) -> None:
    program = (PY, "-u", str(workdir / "facts.py"), "0")
    pool = StandbyPool(program, ["prewarm_marker"], _env(workdir, tmp_path / "x.json"), size=1)
    # 1.5 MB: beyond the 1 MiB pipe (and the 64 KiB default), within exec's limits.
    big = _env(workdir, tmp_path / "run.json", **{f"BIG_{i}": "x" * 100_000 for i in range(15)})
    try:
        pool.fill()
        standby = pool._ready[0].pid
        facts, code, _ = _run_one(program, big, pool, tmp_path / "logs")
    finally:
        pool.close()
    assert code == 0
    assert facts["preloaded"] is False  # a fresh interpreter ran it
    assert pool.taken == 0
    assert _gone(standby)


def test_closing_the_pool_ends_every_standby(workdir: Path, tmp_path: Path) -> None:
    program = (PY, "-u", str(workdir / "facts.py"))
    pool = StandbyPool(program, ["prewarm_marker"], _env(workdir, tmp_path / "x.json"), size=3)
    pool.fill()
    pids = [p.pid for p in pool._ready]
    pool.fill()  # already full: starts nothing more
    assert [p.pid for p in pool._ready] == pids
    pool.close(grace_s=30.0)
    assert all(_gone(pid) for pid in pids)
    assert not (tmp_path / "x.json").exists()  # none of them ran the script


def test_bad_programs_and_sizes_are_refused() -> None:
    assert runnable((PY, "-u", "train.py"))
    assert runnable((PY, "-u", "-m", "pkg"))
    for program in [(PY, "train.py"), (PY, "-u", "-c", "pass"), (PY, "-u", "-m"), ("./train.sh",)]:
        assert not runnable(program)
        with pytest.raises(DLRoverError, match="a standby cannot run"):
            StandbyPool(program, ["torch"], {}, size=1)
    with pytest.raises(DLRoverError, match="size of at least 1, got 0"):
        StandbyPool((PY, "-u", "train.py"), ["torch"], {}, size=0)


AGENT = """
import os, sys, time
from dlrover.launcher import StandbyPool
pool = StandbyPool((sys.executable, "-u", sys.argv[1]), ["prewarm_marker"], dict(os.environ), size=2)
pool.fill()
print(" ".join(str(p.pid) for p in pool._ready), flush=True)
time.sleep(600)
"""


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_standbys_die_with_their_agent(workdir: Path, tmp_path: Path, spawned: list[subprocess.Popen[str]]) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    agent = subprocess.Popen(
        [PY, "-c", textwrap.dedent(AGENT), str(workdir / "facts.py")],
        env=_env(workdir, tmp_path / "x.json", MARKER_DIR=str(markers)),
        stdout=subprocess.PIPE,
        text=True,
    )
    spawned.append(agent)
    assert agent.stdout is not None
    pids = [int(p) for p in agent.stdout.readline().split()]
    assert len(pids) == 2
    # Both armed their parent-death signal and imported their module: they wait for their worker.
    _wait_until(lambda: sorted(int(p.name) for p in markers.iterdir()) == sorted(pids))
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    _wait_until(lambda: all(_gone(pid) for pid in pids), timeout_s=30.0)
