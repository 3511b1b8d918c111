"""Standby workers (`StandbyPool`, `dlrover.launcher._standby`): a warm interpreter runs a worker
exactly as a fresh `python -u SCRIPT` would, with its modules already imported."""

from __future__ import annotations

import contextlib
import gc
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
from dlrover.launcher import StandbyPool, WorkerExit, WorkerGroup, WorkerSpec
from dlrover.launcher._standby import runnable

pytestmark = [pytest.mark.integration]

PY = sys.executable

FACTS = """
import json, os, signal, sys, warnings
facts = {
    "flags": list(sys.flags),
    "orig_argv": sys.orig_argv,
    "warnings": [repr(f) for f in warnings.filters],
    "signals": {s.name: repr(signal.getsignal(s)) for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)},
    "main": sys.modules["__main__"].__dict__ is globals(),
    "globals": sorted(globals()),
    "loader": type(__loader__).__name__,
    "builtins": type(__builtins__).__name__,
    "spec": repr(__spec__.name if __spec__ else None),
    "argv": sys.argv,
    "name": __name__,
    "path0": sys.path[0],
    "file": __file__,
    "rank": os.environ.get("RANK"),
    "leftover": os.environ.get("DLROVER_TEST_ONLY_IN_STANDBY_ENV"),
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


# The script sets a filter, then imports the prewarmed module, which adds filters of its own.
FILTERS = """
import json, os, sys, warnings
preloaded = "prewarm_marker" in sys.modules
warnings.filterwarnings("ignore", message="set by the script")
import prewarm_marker
with open(os.environ["FACTS_OUT"], "w") as f:
    json.dump({"preloaded": preloaded, "filters": [repr(f) for f in warnings.filters]}, f)
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
    # Its warnings filters are held back until the program imports it, as a fresh run adds them.
    (tmp_path / "prewarm_marker.py").write_text(
        "import os, pathlib, warnings\n"
        "warnings.filterwarnings('ignore', message='marker in front')\n"
        "warnings.filterwarnings('ignore', message='marker behind', append=True)\n"
        "if os.environ.get('MARKER_DIR'):\n"
        "    pathlib.Path(os.environ['MARKER_DIR'], str(os.getpid())).touch()\n"
    )
    (tmp_path / "filters.py").write_text(FILTERS)
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


def _run_to_exit(spec: WorkerSpec, pool: StandbyPool | None) -> WorkerExit:
    """Start one worker (from `pool` when it has a standby) and wait for its exit."""
    group = WorkerGroup([spec], standby=pool)
    group.start()
    try:
        _wait_until(lambda: not group.running())
    finally:
        exits = group.stop(grace_s=0.0)
    return exits[spec.local_rank]


def _run_one(
    program: tuple[str, ...], env: dict[str, str], pool: StandbyPool | None, tmp: Path
) -> tuple[dict[str, object], int, str]:
    ended = _run_to_exit(WorkerSpec(local_rank=0, argv=program, env=env, log_dir=tmp), pool)
    facts = json.loads(Path(env["FACTS_OUT"]).read_text())
    return facts, ended.exit_code, ended.stderr_tail


@pytest.mark.parametrize(
    ("form", "args"),
    [("script", ("0",)), ("script", ("7",)), ("script", ("raise",)), ("module", ("5",)), ("relative script", ("0",))],
)
def test_a_standby_runs_the_worker_as_a_fresh_interpreter_would(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str, args: tuple[str, ...]
) -> None:
    code = 1 if args == ("raise",) else int(args[0])
    target = {"module": ("-m", "factspkg"), "relative script": ("facts.py",)}.get(form, (str(workdir / "facts.py"),))
    if form == "relative script":
        # `dlrover-run train.py`: a fresh interpreter makes __file__ absolute, argv[0] stays relative.
        monkeypatch.chdir(workdir)
    program = (PY, "-u", *target, *args)
    fresh, fresh_code, fresh_tail = _run_one(program, _env(workdir, tmp_path / "fresh.json"), None, tmp_path / "f")

    # As the agent's: the worker's rank comes only with the go message. The other difference is a
    # name the standby's environment guard lets through (a worker-contract name), so the warm
    # interpreter runs the script (a difference the modules may have read re-executes: see
    # test_standby_env_guard.py).
    standby_env = _env(workdir, tmp_path / "warm.json", DLROVER_TEST_ONLY_IN_STANDBY_ENV="yes")
    del standby_env["RANK"]
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
    assert fresh["file"] == str(workdir / ("factspkg/__main__.py" if form == "module" else "facts.py"))
    assert fresh["rank"] == "3"
    assert fresh["leftover"] is None
    assert warm_code == fresh_code == code
    if args == ("raise",):
        assert "RuntimeError: the script failed on purpose" in fresh_tail
        # The same traceback, printed once, starting at the script's own frame: none of the
        # standby's frames that ran the script come before it.
        assert warm_tail == fresh_tail
        assert fresh_tail.count("Traceback (most recent call last):") == 1
        assert fresh_tail.splitlines()[1].startswith(f'  File "{workdir / "facts.py"}", line ')


UNCAUGHT = {
    "nested": "def inner():\n    raise ValueError('deep')\n\ndef outer():\n    inner()\n\nouter()\n",
    "chained": "try:\n    {}['k']\nexcept KeyError as e:\n    raise RuntimeError('wrapped') from e\n",
    "hooked": (
        "import sys\n"
        "sys.excepthook = lambda t, e, tb: print('HOOK', t.__name__, tb.tb_frame.f_code.co_filename, file=sys.stderr)\n"
        "raise OSError('through the hook')\n"
    ),
    "syntax": "def broken(:\n    pass\n",
    "interrupted": "raise KeyboardInterrupt\n",
}


@pytest.mark.parametrize("case", sorted(UNCAUGHT))
def test_an_uncaught_exception_is_printed_from_the_programs_own_frame_as_a_fresh_interpreter_does(
    workdir: Path, tmp_path: Path, case: str
) -> None:
    script = workdir / f"uncaught_{case}.py"
    script.write_text(UNCAUGHT[case])
    program = (PY, "-u", str(script))
    env = _env(workdir, tmp_path / "unused.json")
    fresh = _run_to_exit(WorkerSpec(local_rank=0, argv=program, env=env), None)
    pool = StandbyPool(program, ["prewarm_marker"], env, size=1)
    try:
        pool.fill()
        warm = _run_to_exit(WorkerSpec(local_rank=0, argv=program, env=env), pool)
    finally:
        pool.close()
    assert pool.taken == 1
    # Exit status (1, or SIGINT for KeyboardInterrupt) and the whole of stderr, byte for byte.
    assert (warm.exit_code, warm.signal_name) == (fresh.exit_code, fresh.signal_name)
    assert warm.stderr_tail == fresh.stderr_tail
    assert "_standby" not in warm.stderr_tail
    if case == "hooked":
        assert warm.stderr_tail == f"HOOK OSError {script}\n"
    elif case == "interrupted":
        assert warm.signal_name == "SIGINT"
    else:
        assert warm.exit_code == 1


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


@pytest.mark.timeout(120)
def test_closing_the_pool_does_not_wait_for_a_standby_still_importing(workdir: Path, tmp_path: Path) -> None:
    # A standby reads its input only once its imports are done: under load torch takes tens of
    # seconds, and a stopping agent that waited for it would outlast its own stop grace.
    (workdir / "import_blocks.py").write_text(
        "import os, pathlib, time\npathlib.Path(os.environ['MARKER_DIR'], str(os.getpid())).touch()\ntime.sleep(3600)\n"
    )
    markers = tmp_path / "markers"
    markers.mkdir()
    program = (PY, "-u", str(workdir / "facts.py"))
    warm_pool = StandbyPool(program, ["prewarm_marker"], _env(workdir, tmp_path / "x.json"), size=1)
    blocked_pool = StandbyPool(
        program, ["import_blocks"], _env(workdir, tmp_path / "y.json", MARKER_DIR=str(markers)), size=1
    )
    try:
        warm_pool.fill()
        blocked_pool.fill()
        assert warm_pool.wait_warm(60.0)
        blocked = blocked_pool._ready[0].pid
        _wait_until((markers / str(blocked)).exists)  # inside the import that never ends
        assert not blocked_pool.wait_warm(0.0)
    finally:
        blocked_pool.close(grace_s=3600.0)  # the test's timeout, far below the grace, fails a wait for it
        warm_pool.close(grace_s=3600.0)  # a warm one exits at the end of its input
    assert _gone(blocked)
    assert blocked_pool._ready == []
    assert blocked_pool._importing == {}
    assert not (tmp_path / "x.json").exists()
    assert not (tmp_path / "y.json").exists()


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


SPAWN = """
import json, multiprocessing, os, sys


class Scaled:
    def __init__(self, factor):
        self.factor = factor


def scale(pair):
    value, scaled = pair
    return value * scaled.factor, type(scaled).__module__


if __name__ == "__main__":
    # As a DataLoader with num_workers > 0 and the spawn start method: the children import the
    # main module again from its file, and objects of classes defined in it travel by reference.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        results = pool.map(scale, [(2, Scaled(3))])
    with open(os.environ["FACTS_OUT"], "w") as f:
        json.dump({"results": results, "argv": sys.argv, "preloaded": "prewarm_marker" in sys.modules}, f)
"""


def test_multiprocessing_spawn_reimports_the_scripts_main_module_in_a_standby(workdir: Path, tmp_path: Path) -> None:
    (workdir / "spawner.py").write_text(SPAWN)
    program = (PY, "-u", str(workdir / "spawner.py"))
    fresh_env = _env(workdir, tmp_path / "fresh.json")
    fresh, fresh_code, fresh_tail = _run_one(program, fresh_env, None, tmp_path / "f")
    warm_env = _env(workdir, tmp_path / "warm.json")
    pool = StandbyPool(program, ["prewarm_marker"], warm_env, size=1)
    try:
        pool.fill()
        warm, warm_code, warm_tail = _run_one(program, warm_env, pool, tmp_path / "w")
    finally:
        pool.close()
    assert pool.taken == 1
    assert fresh_code == 0, fresh_tail
    assert warm_code == 0, warm_tail
    assert fresh.pop("preloaded") is False
    assert warm.pop("preloaded") is True
    # The child saw the class as the main module's (`__mp_main__` is how spawn imports it).
    assert warm == fresh == {"results": [[6, "__mp_main__"]], "argv": [str(workdir / "spawner.py")]}


def test_the_prewarmed_modules_warnings_filters_land_where_the_programs_import_puts_them(
    workdir: Path, tmp_path: Path
) -> None:
    program = (PY, "-u", str(workdir / "filters.py"))
    fresh, fresh_code, fresh_tail = _run_one(program, _env(workdir, tmp_path / "fresh.json"), None, tmp_path / "f")
    warm_env = _env(workdir, tmp_path / "warm.json")
    pool = StandbyPool(program, ["prewarm_marker"], warm_env, size=1)
    try:
        pool.fill()
        warm, warm_code, warm_tail = _run_one(program, warm_env, pool, tmp_path / "w")
    finally:
        pool.close()
    assert fresh_code == 0, fresh_tail
    assert warm_code == 0, warm_tail
    assert (fresh["preloaded"], warm["preloaded"]) == (False, True)
    filters = warm["filters"]
    assert isinstance(filters, list)
    # In front of the script's own filter, and the appended one behind the defaults.
    assert "marker in front" in filters[0]
    assert "set by the script" in filters[1]
    assert "marker behind" in filters[-1]
    assert filters == fresh["filters"]


def test_a_worker_environment_that_differs_where_the_modules_may_read_reexecs_before_the_program(
    workdir: Path, tmp_path: Path
) -> None:
    # Every name but the worker contract may be read by a module other than torch while it loads:
    # the standby imported prewarm_marker under MARKER_SETTING=standby, the worker wants "worker".
    program = (PY, "-u", str(workdir / "facts.py"), "0")
    standby_env = _env(workdir, tmp_path / "warm.json", MARKER_SETTING="standby")
    pool = StandbyPool(program, ["prewarm_marker"], standby_env, size=1)
    try:
        pool.fill()
        standby_pid = pool._ready[0].pid
        worker_env = _env(workdir, tmp_path / "warm.json", MARKER_SETTING="worker")
        group = WorkerGroup([WorkerSpec(local_rank=0, argv=program, env=worker_env)], standby=pool)
        group.start()
        try:
            _wait_until(lambda: not group.running())
        finally:
            exits = group.stop(grace_s=0.0)
    finally:
        pool.close()
    assert pool.taken == 1
    assert exits[0].exit_code == 0, exits[0].stderr_tail
    assert exits[0].pid == standby_pid  # re-executed in place
    facts = json.loads((tmp_path / "warm.json").read_text())
    assert facts["preloaded"] is False  # a fresh interpreter ran the script
    assert facts["argv"] == [str(workdir / "facts.py"), "0"]
    assert "MARKER_SETTING" in exits[0].stderr_tail
    assert "restarting as a fresh interpreter (same pid)" in exits[0].stderr_tail


THREADED = """
import json, os, sys, threading
stop = threading.Event()
waiter = threading.Thread(target=stop.wait)
waiter.start()
os.environ["MARKER_SETTING"] = "late"  # prewarm_marker was imported without it
stop.set()
waiter.join()
with open(os.environ["FACTS_OUT"], "w") as f:
    json.dump({"preloaded": "prewarm_marker" in sys.modules, "pid": os.getpid()}, f)
"""


def _run_from_a_standby(
    program: tuple[str, ...], env: dict[str, str], tmp: Path
) -> tuple[dict[str, object], int, str, int]:
    """`_run_one` from a pool of one warm standby (prewarm_marker imported); also returns the standby's pid."""
    pool = StandbyPool(program, ["prewarm_marker"], env, size=1)
    try:
        pool.fill()
        standby_pid = pool._ready[0].pid
        facts, code, stderr = _run_one(program, env, pool, tmp)
    finally:
        pool.close()
    return facts, code, stderr, standby_pid


def test_a_late_variable_after_the_program_started_a_thread_only_warns(workdir: Path, tmp_path: Path) -> None:
    # An exec would end the thread mid-work, so the standby keeps running the program and says why.
    (workdir / "threaded.py").write_text(THREADED)
    program = (PY, "-u", str(workdir / "threaded.py"))
    env = _env(workdir, tmp_path / "warm.json")
    facts, code, stderr, standby_pid = _run_from_a_standby(program, env, tmp_path / "w")
    assert code == 0, stderr
    assert facts == {"preloaded": True, "pid": standby_pid}
    assert "warning: MARKER_SETTING was set before the program imported prewarm_marker" in stderr
    assert "started a thread" in stderr


OWN_MODULE_THEN_LATE = """
import json, os, sys
import own_helper  # the program's own module: importing it writes its bytecode
os.environ["MARKER_SETTING"] = "late"  # prewarm_marker was imported without it
with open(os.environ["FACTS_OUT"], "w") as f:
    json.dump({"preloaded": "prewarm_marker" in sys.modules, "pid": os.getpid()}, f)
"""


@pytest.mark.parametrize("cache", ["__pycache__", "PYTHONPYCACHEPREFIX"])
def test_bytecode_an_import_writes_is_no_side_effect(workdir: Path, tmp_path: Path, cache: str) -> None:
    # Python writes an imported module's bytecode (into __pycache__, or under PYTHONPYCACHEPREFIX,
    # in no __pycache__ folder), the second audit event naming only a descriptor: a late variable
    # after such an import still restarts the program fresh rather than only warning.
    (workdir / "own_helper.py").write_text("VALUE = 1\n")
    (workdir / "own_then_late.py").write_text(OWN_MODULE_THEN_LATE)
    program = (PY, "-u", str(workdir / "own_then_late.py"))
    env = _env(workdir, tmp_path / "warm.json")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    prefix = workdir / "__pycache__"
    if cache == "PYTHONPYCACHEPREFIX":
        prefix = tmp_path / "pyc"
        env["PYTHONPYCACHEPREFIX"] = str(prefix)
    facts, code, stderr, standby_pid = _run_from_a_standby(program, env, tmp_path / "w")
    assert code == 0, stderr
    assert list(prefix.rglob("own_helper*.pyc")), f"the import wrote no bytecode under {prefix}"
    assert facts == {"preloaded": False, "pid": standby_pid}, stderr  # re-executed in place, fresh
    assert "restarting as a fresh interpreter (same pid)" in stderr
    assert "warning" not in stderr


def _exit_of(program: tuple[str, ...], env: dict[str, str], pool: StandbyPool | None) -> tuple[int, str]:
    group = WorkerGroup([WorkerSpec(local_rank=0, argv=program, env=env)], standby=pool)
    group.start()
    try:
        _wait_until(lambda: not group.running())
    finally:
        exits = group.stop(grace_s=0.0)
    return exits[0].exit_code, exits[0].stderr_tail


def test_a_missing_script_fails_as_in_a_fresh_interpreter(workdir: Path, tmp_path: Path) -> None:
    program = (PY, "-u", str(workdir / "no_such_script.py"))
    env = _env(workdir, tmp_path / "x.json")
    fresh_code, fresh_tail = _exit_of(program, env, None)
    pool = StandbyPool(program, ["prewarm_marker"], env, size=1)
    try:
        pool.fill()
        warm_code, warm_tail = _exit_of(program, env, pool)
    finally:
        pool.close()
    assert pool.taken == 1
    assert warm_code == fresh_code == 2
    message = f"can't open file {str(workdir / 'no_such_script.py')!r}: [Errno 2] No such file or directory"
    assert message in fresh_tail
    assert message in warm_tail


RECORDED = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("recorded by a worker a standby became")

main()
"""


def test_a_worker_taken_from_a_standby_writes_its_error_file(workdir: Path, tmp_path: Path) -> None:
    # TORCHELASTIC_ERROR_FILE comes with the go message, as the rank does, and @record finds it.
    (workdir / "recorded.py").write_text(RECORDED)
    program = (PY, "-u", str(workdir / "recorded.py"))
    standby_env = _env(workdir, tmp_path / "unused.json")
    del standby_env["RANK"]
    pool = StandbyPool(program, ["prewarm_marker"], standby_env, size=1)
    error_file = tmp_path / "errors" / "0" / "error-rank3.json"
    try:
        pool.fill()
        env = _env(workdir, tmp_path / "unused.json")
        ended = _run_to_exit(WorkerSpec(local_rank=0, argv=program, env=env, error_file=error_file), pool)
    finally:
        pool.close()
    assert pool.taken == 1
    assert ended.exit_code == 1
    assert ended.error.startswith("ValueError: recorded by a worker a standby became")


FAILS_AFTER_SIDE_EFFECTS = """
import atexit, os, pathlib, sys, threading, time
out = pathlib.Path(os.environ["OUT_DIR"])
atexit.register(lambda: (out / "atexit").write_text("ran"))
log = open(out / "unclosed.txt", "w")  # never closed: its buffer is written only at exit
log.write("a line only a flush at exit writes\\n")
def late():
    time.sleep(0.3)
    (out / "thread").write_text("finished")
threading.Thread(target=late).start()  # not a daemon: the interpreter waits for it
class Finalized:
    def __del__(self):
        (out / "teardown").write_text("ran")
kept = Finalized()
raise RuntimeError("the program failed")
"""


def test_a_failed_worker_ends_after_its_exit_handlers_and_flushed_files_without_module_teardown(
    workdir: Path, tmp_path: Path
) -> None:
    script = workdir / "fails_after_side_effects.py"
    script.write_text(FAILS_AFTER_SIDE_EFFECTS)
    program = (PY, "-u", str(script))
    results = {}
    for how in ("fresh", "standby", "teardown"):
        out = tmp_path / how
        out.mkdir()
        env = _env(workdir, tmp_path / "unused.json", OUT_DIR=str(out))
        if how == "teardown":  # a standby, told to tear down as a fresh interpreter does
            env["DLROVER_FAILED_WORKER_TEARDOWN"] = "1"
        pool = StandbyPool(program, ["prewarm_marker"], env, size=1) if how != "fresh" else None
        try:
            if pool is not None:
                pool.fill()
            ended = _run_to_exit(WorkerSpec(local_rank=0, argv=program, env=env), pool)
        finally:
            if pool is not None:
                pool.close()
        results[how] = (ended.exit_code, sorted(p.name for p in out.iterdir()), (out / "unclosed.txt").read_text())
        assert "RuntimeError: the program failed" in ended.stderr_tail
    # As a fresh interpreter: status 1, its thread waited for, its exit handler run, its file flushed ...
    flushed = "a line only a flush at exit writes\n"
    assert results["fresh"] == (1, ["atexit", "teardown", "thread", "unclosed.txt"], flushed)
    # ... but no module teardown: finalizers of objects still alive at the end do not run.
    assert results["standby"] == (1, ["atexit", "thread", "unclosed.txt"], flushed)
    assert results["teardown"] == results["fresh"]


SUCCEEDS_WITH_A_CYCLE = """
import os, pathlib, sys
out = pathlib.Path(os.environ["OUT_DIR"])
class InACycle:
    def __del__(self):
        (out / "collected").write_text("while finalizing" if sys.is_finalizing() else "before teardown")
a, b = InACycle(), InACycle()
a.peer, b.peer = b, a
del a, b
"""


def test_a_worker_that_ends_well_has_its_cyclic_garbage_collected_before_the_interpreters_teardown(
    workdir: Path, tmp_path: Path
) -> None:
    # Where a destroyed gloo process group is freed (see _FailedExit): not by a finalizing interpreter.
    script = workdir / "succeeds_with_a_cycle.py"
    script.write_text(SUCCEEDS_WITH_A_CYCLE)
    program = (PY, "-u", str(script))
    env = _env(workdir, tmp_path / "unused.json", OUT_DIR=str(tmp_path))
    pool = StandbyPool(program, ["prewarm_marker"], env, size=1)
    try:
        pool.fill()
        ended = _run_to_exit(WorkerSpec(local_rank=0, argv=program, env=env), pool)
    finally:
        pool.close()
    assert pool.taken == 1
    assert ended.exit_code == 0, ended.stderr_tail
    assert (tmp_path / "collected").read_text() == "before teardown"


def test_the_pool_knows_when_its_standbys_are_warm(workdir: Path, tmp_path: Path) -> None:
    # An import that lasts until the test lets it finish, and one that fails.
    (workdir / "slow_import.py").write_text(
        "import os, pathlib, time\n"
        "gate = pathlib.Path(os.environ['IMPORT_GATE'])\n"
        "while not gate.exists():\n"
        "    time.sleep(0.01)\n"
    )
    gate = tmp_path / "gate"
    pipes_before = _open_pipes()
    program = (PY, "-u", str(workdir / "facts.py"))
    env = _env(workdir, tmp_path / "x.json", IMPORT_GATE=str(gate))
    pool = StandbyPool(program, ["slow_import"], env, size=2)
    failing = StandbyPool(program, ["no_such_module_for_dlrover_tests"], env, size=1)
    try:
        pool.fill()
        assert not pool.wait_warm(0.3), "both standbys are still importing"
        asked: list[bool] = []
        assert not pool.wait_warm(60.0, stop=lambda: asked.append(True) or len(asked) > 2), "a stop ends the wait"
        gate.touch()
        assert pool.wait_warm(60.0)
        assert pool.wait_warm(0.0), "nothing left to wait for"
        failing.fill()
        assert failing.wait_warm(60.0), "a standby that died importing is not waited for"
        facts, code, _ = _run_one(program, _env(workdir, tmp_path / "run.json"), pool, tmp_path / "logs")
        assert code == 0
        assert facts["preloaded"] is False  # the facts script looks for another module
        assert pool.taken == 1
    finally:
        pool.close()
        failing.close()
    assert _open_pipes() == pipes_before, "no pipe to a standby is left open"


def _open_pipes() -> int:
    gc.collect()  # pipes of earlier tests' processes that nothing refers to any more
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the directory's own descriptor is gone once listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return count
