"""`python3 dev.py test`'s scheduler: the jobs run two at a time, a job waits for its venv, one job with kubelet
pods runs at a time, and a failed job or install is reported without stopping the others. Real processes stand in
for the nox sessions; each writes what it did to one event file, so the checks are on order, never on time."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dlrover_dev_script", ROOT / "dev.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


dev = _dev()

# A stand-in for nox: `--install-only -s VENV` "builds" a venv (exit 1 for one named "broken"); any other
# argument list is a job `NAME CODE` that exits with CODE. Each appends "start ..." and "end ..." to the
# event file, and sleeps between them so that a neighbour may start meanwhile (on a slow machine it may not:
# then the overlap goes unexercised, and no assertion needs it).
FAKE_NOX = textwrap.dedent(
    """
    import sys, time
    events, args = sys.argv[1], sys.argv[2:]
    if args[0] == "--install-only":
        what, code = "install " + args[2], 1 if args[2] == "broken" else 0
    else:
        what, code = "job " + args[0], int(args[1])
    with open(events, "a") as f:
        f.write("start " + what + "\\n")
    time.sleep(0.3)
    with open(events, "a") as f:
        f.write("end " + what + "\\n")
    sys.exit(code)
    """
)


def _run(tmp_path: Path, jobs: Sequence[Any], lanes: int = 2) -> tuple[Any, list[str]]:
    script, events = tmp_path / "fake_nox.py", tmp_path / "events"
    script.write_text(FAKE_NOX)
    events.touch()
    fake = [sys.executable, str(script), str(events)]
    runner = dev._Lanes(jobs, lanes, tmp_path / "logs", command=lambda args: [*fake, *args])
    runner.run()
    return runner, events.read_text().splitlines()


def test_a_free_lane_takes_the_first_job_that_can_start() -> None:
    a, b = dev._Job("a", ("a", "0")), dev._Job("b", ("b", "0"), venv="v")
    k1, k2 = dev._Job("k1", ("k1", "0"), kubelet=True), dev._Job("k2", ("k2", "0"), kubelet=True)
    assert dev._runnable([b, a], {}, kubelet_busy=False) is a
    assert dev._runnable([b, a], {"v": True}, kubelet_busy=False) is b
    assert dev._runnable([k1, k2], {}, kubelet_busy=True) is None
    assert dev._runnable([k1, a], {}, kubelet_busy=True) is a
    assert dev._install_order([b, dev._Job("c", ("c", "0"), venv="w"), dev._Job("d", ("d", "0"), venv="v")]) == [
        "v",
        "w",
    ]


def test_every_job_runs_two_at_a_time_after_its_venv_and_kubelet_jobs_never_overlap(tmp_path: Path) -> None:
    jobs = [
        dev._Job("long", ("long", "0")),
        dev._Job("in-v", ("in-v", "0"), venv="v"),
        dev._Job("k1", ("k1", "0"), kubelet=True),
        dev._Job("k2", ("k2", "0"), kubelet=True),
        dev._Job("k3", ("k3", "0"), kubelet=True, venv="w"),
    ]
    runner, events = _run(tmp_path, jobs)

    assert runner.failures == []
    assert sorted(o.stage for o in runner.outcomes if o.lane != "installer") == ["in-v", "k1", "k2", "k3", "long"]
    assert [o.stage for o in runner.outcomes if o.lane == "installer"] == ["venv of v", "venv of w"]
    # A job in a venv starts only once that venv's install ended.
    assert events.index("end install v") < events.index("start job in-v")
    assert events.index("end install w") < events.index("start job k3")
    # At most two jobs at once, and never two with kubelet pods.
    running: set[str] = set()
    for line in events:
        verb, kind, name = line.split(" ")
        if kind != "job":
            continue
        if verb == "start":
            running.add(name)
        else:
            running.remove(name)
        assert len(running) <= 2, events
        assert len(running & {"k1", "k2", "k3"}) <= 1, events
    # Every job's output is in its log.
    assert "fake_nox.py" in (tmp_path / "logs" / "long.log").read_text()


def test_a_failed_job_and_a_failed_install_are_reported_and_the_rest_still_runs(tmp_path: Path) -> None:
    jobs = [
        dev._Job("fails", ("fails", "3")),
        dev._Job("needs-broken", ("needs-broken", "0"), venv="broken"),
        dev._Job("fine", ("fine", "0")),
    ]
    runner, events = _run(tmp_path, jobs, lanes=1)

    assert "start job needs-broken" not in events
    assert "end job fine" in events
    # The failures come in the order they happened, which depends on the processes' speed.
    assert sorted(runner.failures) == [
        "fails failed (exit code 3)",
        f"installing the venv of broken failed (exit code 1): see {tmp_path / 'logs' / 'install-only.log'}",
        "needs-broken not run: its venv was not built",
    ]
    ran = {o.stage: o.code for o in runner.outcomes if o.lane != "installer"}
    assert ran == {"fails": 3, "fine": 0}


# A job that starts a child of its own and waits on it, to be stopped.
STUBBORN_NOX = textwrap.dedent(
    """
    import subprocess, sys
    events, args = sys.argv[1], sys.argv[2:]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(events, "a") as f:
        f.write(f"start job {args[0]} child {child.pid}\\n")
    child.wait()
    """
)


def test_a_stop_ends_the_running_session_with_the_processes_it_started_and_starts_nothing_more(
    tmp_path: Path,
) -> None:
    script, events = tmp_path / "stubborn_nox.py", tmp_path / "events"
    script.write_text(STUBBORN_NOX)
    events.touch()
    jobs = [dev._Job("stubborn", ("stubborn",)), dev._Job("next", ("next",))]
    runner = dev._Lanes(
        jobs, 1, tmp_path / "logs", command=lambda args: [sys.executable, str(script), str(events), *args]
    )

    def stop_once_started() -> None:
        while "start job stubborn" not in events.read_text():
            time.sleep(0.05)
        runner.stop("the test stops it")

    stopper = threading.Thread(target=stop_once_started, daemon=True)
    stopper.start()
    runner.run()
    stopper.join()

    (line,) = events.read_text().splitlines()
    child = int(line.rsplit(" ", 1)[1])
    assert not _alive(child), "the session's own child outlived the stop"
    assert runner.failures[0] == "stopped: the test stops it"
    assert runner.failures[1].startswith("stubborn failed (exit code "), runner.failures
    assert runner.failures[2:] == ["next not run: the run stopped"]


def _alive(pid: int) -> bool:
    """Whether `pid` still runs 30 s on: a zombie (ended, its new parent not reaping it yet) does not."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True


def test_the_jobs_are_the_noxfile_sessions_and_each_waits_for_its_own_venv() -> None:
    import noxfile

    jobs = dev._jobs([])
    sessions = {job.nox_args[job.nox_args.index("-s") + 1 :][0] for job in jobs}
    sessions |= {"typecheck"}  # "lint, typecheck" runs both
    expected = {
        "proto", "lint", "typecheck", "tests-packages", "tests-scenarios", "tests-kubernetes", "tests-ray",
        "tests-tensorflow", "tests-flashckpt-deepspeed", *(f"isolation(pkg='{p}')" for p in noxfile.PACKAGES),
    }  # fmt: skip
    assert sessions == expected
    for job in jobs:
        if job.venv is not None:
            assert job.nox_args[:3] == ("-R", "-s", job.venv), job
        else:
            assert job.nox_args[:2] == ("--no-venv", "--no-install"), job
    # The two halves are the `tests` session, whole.
    assert [*noxfile.PACKAGE_TEST_PATHS, *noxfile.SCENARIO_TEST_PATHS] == [
        *[f"packages/{p}/tests" for p in noxfile.PACKAGES],
        noxfile.TESTSUPPORT_TESTS,
        "tests",
    ]
