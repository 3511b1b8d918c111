#!/usr/bin/env python3
"""Set up and run DLRover's development tasks on a machine with only Python 3.11.

    python3 dev.py test    lint, typecheck, proto check, every test (Kubernetes and Ray suites included),
                           each package in isolation, TF and DeepSpeed tests
    python3 dev.py demo    the main job: train a small GPT, kill a worker, recover from memory
    python3 dev.py setup   only prepare .venv
    python3 dev.py nox ... any nox command inside .venv (e.g. `python3 dev.py nox -s tests-shard`)

Set-up creates `.venv`, installs torch 2.13.0 first (alone and pinned: an unpinned torch would
pull the CUDA build), then every package editable with `constraints.txt`. It is quick when
`.venv` is already current. Ray (pinned, for the Ray suite) is installed after them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import venv
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".dlrover-setup"
TORCH_PIN = "torch==2.13.0"


def _run(*cmd: str, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    if code != 0:
        raise SystemExit(code)


def _inputs_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([ROOT / "constraints.txt", ROOT / "noxfile.py", *ROOT.glob("packages/*/pyproject.toml")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def setup() -> None:
    """Create or refresh .venv with torch, every package and the development tools."""
    digest = _inputs_digest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(*pip, "--upgrade", "pip")
    _run(*pip, TORCH_PIN)
    _run(*pip, "-c", "constraints.txt", "nox")
    # The same install the nox sessions do (noxfile.dev_install_args), done once and reused.
    _run(*pip, *_from_noxfile("dev_install_args()"))
    _run(*pip, *_from_noxfile("ray_install_args()"))
    STAMP.write_text(digest)


def _from_noxfile(expression: str) -> Any:
    """The value of `expression` in the noxfile's namespace, read with .venv's Python (which has nox)."""
    query = f"import json, noxfile; print(json.dumps(noxfile.{expression}))"
    return json.loads(subprocess.check_output([str(BIN / "python"), "-c", query], cwd=ROOT, text=True))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV)
    env.pop("PYTHONHOME", None)
    return env


def nox(*args: str) -> None:
    _run(str(BIN / "nox"), "-f", "noxfile.py", *args, env=_env())


# The isolation sessions, longest first (seconds measured on a CI run: master 130, flashckpt 96, launcher 50,
# autoscale 32, diagnosis 28, rendezvous 28, shard 20, common 19).
_ISOLATION_ORDER = ("master", "flashckpt", "launcher", "autoscale", "diagnosis", "rendezvous", "common", "shard")
LANES = 2
"""How many nox sessions `test` runs at once: one per core of the 2-core machines CI runs on."""


@dataclass(frozen=True)
class _Job:
    """A nox session `python3 dev.py test` runs, with what it must wait for before it can start."""

    stage: str
    nox_args: tuple[str, ...]
    venv: str | None = None
    """The separate-venv session it runs in (`-R`, reusing what the installer built); None: `.venv`."""
    kubelet: bool = False
    """It runs pods on the test kubelet. One such job runs at a time: the Kubernetes and TensorFlow suites both
    give pods the kubelet's pod addresses."""


def _jobs(pytest_args: list[str]) -> list[_Job]:
    """Every job of `test`, in the order a free lane looks at them: the longest first, so the two lanes end close
    together (minutes measured: the package and scenario tests 19 and 17 alone on an idle 2-core machine, 45
    together beside the other sessions on a CI run; there TensorFlow 11, Ray 6, Kubernetes 6, typecheck 3,
    DeepSpeed 3, the isolation sessions 1 to 2 each). The proto check goes first: a stale one fails in a second."""
    here = ("--no-venv", "--no-install")  # in `.venv`, which `setup` prepared
    return [
        _Job("proto check", (*here, "-s", "proto", "--", "--check")),
        _Job("package tests", (*here, "-s", "tests-packages", *pytest_args)),
        _Job("scenario tests", (*here, "-s", "tests-scenarios", *pytest_args)),
        _Job("tensorflow tests", ("-R", "-s", "tests-tensorflow"), venv="tests-tensorflow", kubelet=True),
        _Job("ray tests", (*here, "-s", "tests-ray", *pytest_args)),
        _Job("kubernetes tests", (*here, "-s", "tests-kubernetes", *pytest_args), kubelet=True),
        _Job("lint, typecheck", (*here, "-s", "lint", "typecheck")),
        _Job("deepspeed tests", ("-R", "-s", "tests-flashckpt-deepspeed"), venv="tests-flashckpt-deepspeed"),
        *(
            _Job(f"isolation({pkg})", ("-R", "-s", f"isolation(pkg='{pkg}')"), venv=f"isolation(pkg='{pkg}')")
            for pkg in _ISOLATION_ORDER
        ),
    ]


def _nox_command(args: Sequence[str]) -> list[str]:
    return [str(BIN / "nox"), "-f", "noxfile.py", *args]


def _install_order(jobs: Sequence[_Job]) -> list[str]:
    """The separate venvs, built one after another in the order the jobs want them."""
    return list(dict.fromkeys(job.venv for job in jobs if job.venv is not None))


def _runnable(pending: Sequence[_Job], built: Mapping[str, bool], kubelet_busy: bool) -> _Job | None:
    """The first of `pending` that can start now: its venv built (`built[venv]` is True) and, for a job with
    kubelet pods, no other such job running; None when each must wait."""
    for job in pending:
        if job.venv is not None and not built.get(job.venv, False):
            continue
        if job.kubelet and kubelet_busy:
            continue
        return job
    return None


@dataclass
class _Outcome:
    """What became of a job or an install that started."""

    stage: str
    lane: str
    started_s: float
    seconds: float
    code: int


STOP_GRACE_S = 30.0
"""How long the nox sessions get to end after an interrupt (nox ends its session's command on SIGINT) before
their process groups are killed."""
PROGRESS_EVERY_S = 300.0
"""How often a line names the jobs still running, so a long run's log shows it is alive."""
STOPPED_TAIL_CHARS = 20_000
"""How much of the log of a job that was stopped is printed."""


def _signal_group(proc: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


class _Lanes:
    """Runs `jobs` `lanes` at a time, each in a nox process of its own, while one installer thread builds the
    separate venvs one after another from the start (they wait mostly on downloads and disk).

    Each job's output goes to a log under `.nox/lanes/`, printed whole when the job ends, so two jobs' lines
    never interleave; a line every `PROGRESS_EVERY_S` names what still runs, and an interrupt prints the tail
    of what it stopped. Every nox process leads a process group of its own, so an interrupt reaches the
    processes its session started too. The leak check of each pytest session (the root conftest) judges only
    what its own session made while another runs beside it.
    """

    def __init__(
        self, jobs: Sequence[_Job], lanes: int, logs: Path, command: Callable[[Sequence[str]], list[str]] | None = None
    ) -> None:
        self._command = command or _nox_command
        self._pending = list(jobs)
        self._lanes = lanes
        self._logs = logs
        self._venvs = _install_order(jobs)
        self._started = time.monotonic()
        self._cond = threading.Condition()
        self._print_lock = threading.Lock()
        # Guarded by `_cond`: what is built or failed, what runs (stage -> process, log, start), and whether
        # to start anything more.
        self._built: dict[str, bool] = {}
        self._kubelet_busy = False
        self._running: dict[str, tuple[subprocess.Popen[bytes], Path, float]] = {}
        self._stopping = False
        self.outcomes: list[_Outcome] = []
        self.failures: list[str] = []

    def run(self) -> None:
        """Run every job. On an interrupt (KeyboardInterrupt, or SIGTERM where `test` turns it into one), end
        what runs, print the tail of its output, start nothing more, and raise."""
        self._logs.mkdir(parents=True, exist_ok=True)
        for old in self._logs.glob("*.log"):
            old.unlink()
        threads = [threading.Thread(target=self._guarded, args=(self._install, "the installer"), daemon=True)]
        threads += [
            threading.Thread(target=self._guarded, args=(self._lane, f"lane {n}", n), daemon=True)
            for n in range(1, self._lanes + 1)
        ]
        for thread in threads:
            thread.start()
        try:
            next_progress = PROGRESS_EVERY_S
            while alive := [thread for thread in threads if thread.is_alive()]:
                alive[0].join(timeout=1.0)  # a bare join() would not see Ctrl-C
                if self._now() >= next_progress:
                    next_progress += PROGRESS_EVERY_S
                    self._print_progress()
        except BaseException:
            self.stop("interrupted")
            self._end_stopped(threads)
            raise
        with self._cond:
            self.failures += [f"{job.stage} not run: the run stopped" for job in self._pending]

    def stop(self, why: str) -> None:
        """Start nothing more and interrupt every running nox session (SIGINT to its process group)."""
        with self._cond:
            if not self._stopping:
                self.failures.append(f"stopped: {why}")
            self._stopping = True
            running = [proc for proc, _, _ in self._running.values()]
            self._cond.notify_all()
        for proc in running:
            _signal_group(proc, signal.SIGINT)

    def _end_stopped(self, threads: Sequence[threading.Thread]) -> None:
        deadline = time.monotonic() + STOP_GRACE_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._cond:
            left = list(self._running.items())
        for stage, (proc, log, _) in left:
            _signal_group(proc, signal.SIGKILL)
            text = log.read_text(errors="replace")[-STOPPED_TAIL_CHARS:]
            self._print(f"----- {stage}: stopped; the end of its output -----\n{text}")

    def _now(self) -> float:
        return time.monotonic() - self._started

    def _guarded(self, target: Callable[..., None], name: str, *args: object) -> None:
        try:
            target(*args)
        except BaseException as exc:  # a thread's exception would otherwise end it unreported
            traceback.print_exc()
            self.stop(f"{name} failed: {exc!r}")

    def _spawn(self, stage: str, args: Sequence[str], log: Path) -> subprocess.Popen[bytes] | None:
        """Start nox with `args`, its output appended to `log`; None once stopping."""
        command = self._command(args)
        with log.open("ab") as out:
            out.write(f"+ {' '.join(command)}\n".encode())
            out.flush()
            with self._cond:
                if self._stopping:
                    return None
                proc = subprocess.Popen(
                    command, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
                self._running[stage] = (proc, log, self._now())
        return proc

    def _finish(self, stage: str, proc: subprocess.Popen[bytes], lane: str) -> _Outcome:
        code = proc.wait()
        with self._cond:
            _, _, started = self._running.pop(stage)
            outcome = _Outcome(stage, lane, started, self._now() - started, code)
            self.outcomes.append(outcome)
        return outcome

    def _install(self) -> None:
        log = self._logs / "install-only.log"
        for session in self._venvs:
            stage = f"venv of {session}"
            proc = self._spawn(stage, ("--install-only", "-s", session), log)
            if proc is None:
                return
            code = self._finish(stage, proc, "installer").code
            with self._cond:
                self._built[session] = code == 0
                if code != 0:
                    self.failures.append(f"installing the {stage} failed (exit code {code}): see {log}")
                self._cond.notify_all()
        if any(o.code != 0 for o in self.outcomes if o.lane == "installer"):
            self._print(f"----- installing the separate venvs: output -----\n{log.read_text(errors='replace')}")

    def _take(self) -> _Job | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                for unbuilt in [j for j in self._pending if j.venv is not None and self._built.get(j.venv) is False]:
                    self._pending.remove(unbuilt)
                    self.failures.append(f"{unbuilt.stage} not run: its venv was not built")
                if not self._pending:
                    return None
                job = _runnable(self._pending, self._built, self._kubelet_busy)
                if job is not None:
                    self._pending.remove(job)
                    self._kubelet_busy |= job.kubelet
                    return job
                self._cond.wait()

    def _lane(self, number: int) -> None:
        lane = f"lane {number}"
        while (job := self._take()) is not None:
            log = self._logs / f"{job.stage.replace(' ', '-').replace(',', '')}.log"
            self._print(f"+ {lane} at {self._now():.0f} s: {job.stage}")
            proc = self._spawn(job.stage, job.nox_args, log)
            if proc is None:
                with self._cond:
                    self.failures.append(f"{job.stage} not run: the run stopped")
                return
            outcome = self._finish(job.stage, proc, lane)
            code = outcome.code
            with self._cond:
                if code != 0:
                    self.failures.append(f"{job.stage} failed (exit code {code})")
                if job.kubelet:
                    self._kubelet_busy = False
                self._cond.notify_all()
            result = "passed" if code == 0 else f"FAILED (exit code {code})"
            self._print(
                f"----- {job.stage}: output -----\n{log.read_text(errors='replace')}"
                f"----- {job.stage}: {result} after {outcome.seconds:.0f} s on {lane} -----"
            )

    def _print_progress(self) -> None:
        with self._cond:
            now = self._now()
            running = [f"{stage} ({now - started:.0f} s)" for stage, (_, _, started) in self._running.items()]
        self._print(f"  ... at {now:.0f} s, running: {', '.join(running) or 'nothing'}")

    def _print(self, text: str) -> None:
        with self._print_lock:
            print(text, flush=True)

    def report(self) -> None:
        self._print("\ntime per stage (who ran it, start, duration):")
        for o in sorted(self.outcomes, key=lambda o: (o.lane, o.started_s)):
            mark = "" if o.code == 0 else f"  (exit code {o.code})"
            self._print(f"  {o.lane:9} at {o.started_s:6.0f} s  {o.seconds:7.1f} s  {o.stage}{mark}")
        self._print(f"  {self._now():7.1f} s in all")


def _interrupt_on_sigterm() -> None:
    """A SIGTERM (CI's timeout, `kill`) ends the run the way Ctrl-C does, so the sessions are stopped too."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)


def test(pytest_args: list[str]) -> None:
    """Every check, `LANES` nox sessions at a time (`_Lanes`); fails when any of them failed."""
    packages = _from_noxfile("PACKAGES")
    if set(_ISOLATION_ORDER) != set(packages):
        raise SystemExit(f"dev.py's isolation order {sorted(_ISOLATION_ORDER)} must name every package {packages}")
    _interrupt_on_sigterm()
    lanes = _Lanes(_jobs(pytest_args), LANES, ROOT / ".nox" / "lanes")
    try:
        lanes.run()
    finally:
        lanes.report()
    if lanes.failures:
        print("\n".join(["failed:", *lanes.failures]), file=sys.stderr, flush=True)
        raise SystemExit(1)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "help"
    if command in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    setup()
    if command == "setup":
        return 0
    if command == "test":
        test(argv[1:])
        return 0
    if command == "demo":
        nox("--no-venv", "--no-install", "-s", "demo", "--", *argv[1:])
        return 0
    if command == "nox":
        nox(*argv[1:])
        return 0
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
