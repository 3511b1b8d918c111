#!/usr/bin/env python3
"""Set up and run DLRover's development tasks on a machine with only Python 3.11.

    python3 dev.py test    lint, typecheck, proto check, every test (Kubernetes, Ray and local-backend
                           suites included), each package in isolation, TF and DeepSpeed tests
    python3 dev.py demo    the main job: train a small GPT, kill a worker, recover from memory
    python3 dev.py setup   only prepare .venv
    python3 dev.py nox ... any nox command inside .venv (e.g. `python3 dev.py nox -s tests-shard`)

Set-up creates `.venv`, installs torch 2.13.0 first (alone and pinned: an unpinned torch would
pull the CUDA build), then every package editable with `constraints.txt`. It is quick when
`.venv` is already current. Ray (pinned, for the Ray suite) is installed after them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".dlrover-setup"
TORCH_PIN = "torch==2.13.0"
# Sessions that test in venvs of their own, each installing only what it declares.
_SEPARATE_VENV_SESSIONS = ("isolation", "tests-tensorflow", "tests-flashckpt-deepspeed")


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


def _timed(stage: str, timings: list[tuple[str, float]], *args: str) -> None:
    started = time.monotonic()
    try:
        nox(*args)
    finally:
        timings.append((stage, time.monotonic() - started))


# The isolation sessions in the order the side lane runs them (seconds of unit tests measured on a CI run: master
# 140, diagnosis 87, flashckpt 58, launcher 26, autoscale 28, rendezvous 19, common 11, shard 6).
_ISOLATION_ORDER = ("master", "diagnosis", "flashckpt", "launcher", "autoscale", "rendezvous", "common", "shard")


class _SideLane:
    """The sessions that run beside the main test session, one after another, with their output in a log.

    The main session (`tests`) is one pytest process whose tests mostly wait on the processes they start: on a
    CI run its wall time was 35 minutes for about one core's worth of CPU. The Kubernetes, Ray, TensorFlow,
    DeepSpeed and isolation sessions took 21 minutes more, one after another. Run beside it, on the second core,
    they cost the run only what they slow it down. The leak check of each session (the root conftest) already
    judges only what its own session made while another runs beside it. The local-backend suite (jobs the
    master grows, shrinks and relaunches; about 5 minutes) runs here too, where the lane would otherwise
    wait minutes for the separate venvs. On a CI run that shortened the whole by only about a minute: the
    machine is CPU-bound, so what runs beside the main session slows it by about what it saves.

    They run one at a time: the Kubernetes and TensorFlow suites both use the test kubelet's pod addresses, and
    two Ray clusters, or a Ray cluster beside TensorFlow servers, would only add load. The log is printed whole
    once the lane ends, so its output does not cut into the main session's.
    """

    def __init__(self, log: Path, installs: subprocess.Popen[bytes], pytest_args: list[str]) -> None:
        self._log = log
        self._log.write_text("output of the sessions run beside the main one:\n")
        self._installs = installs
        self._pytest_args = pytest_args
        self.timings: list[tuple[str, float]] = []
        self.failures: list[str] = []
        self.installed_after: float | None = None
        self._thread = threading.Thread(target=self._run, name="side-lane", daemon=True)
        self._started = time.monotonic()
        # `_stopping` and `_current` change together, so a stop never misses a session starting.
        self._lock = threading.Lock()
        self._stopping = False
        self._current: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the session running now and run no other (the main session was interrupted)."""
        with self._lock:
            self._stopping = True
            if self._current is not None:
                self._current.terminate()

    def join(self) -> None:
        self._thread.join()
        print(self._log.read_text(errors="replace"), flush=True)

    def _session(self, stage: str, *args: str, after_install: bool = False) -> None:
        if after_install:
            if self.installed_after is None:
                code = self._installs.wait()
                self.installed_after = time.monotonic() - self._started
                if code != 0:
                    self.failures.append(f"installing the separate venvs failed (exit code {code}): {_INSTALL_LOG}")
            if self._installs.returncode != 0:
                return
        command = [str(BIN / "nox"), "-f", "noxfile.py", *args]
        started = time.monotonic()
        with self._log.open("a") as out:
            out.write(f"\n+ {' '.join(command)}\n")
            out.flush()
            with self._lock:
                if self._stopping:
                    return
                self._current = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)
            code = self._current.wait()
        self.timings.append((stage, time.monotonic() - started))
        if code != 0:
            self.failures.append(f"{stage} failed (exit code {code})")

    def _run(self) -> None:
        try:
            self._sessions()
        except BaseException as exc:  # a thread's exception would otherwise end the lane unreported
            self.failures.append(f"the side lane stopped: {exc!r}")
            with self._log.open("a") as out:
                traceback.print_exc(file=out)

    def _sessions(self) -> None:
        beside = ("--no-venv", "--no-install")
        self._session("kubernetes tests", *beside, "-s", "tests-kubernetes", *self._pytest_args)
        self._session("ray tests", *beside, "-s", "tests-ray", *self._pytest_args)
        # Before the isolation sessions, which wait for the separate venvs (about 16 minutes on a CI run, and
        # the two suites above end after about 13): this fills that wait.
        self._session("local-backend tests", *beside, "-s", "tests-local-backend", *self._pytest_args)
        self._session("proto check", *beside, "-s", "proto", "--", "--check")
        for pkg in _ISOLATION_ORDER:
            self._session(f"isolation({pkg})", "-R", "-s", f"isolation(pkg='{pkg}')", after_install=True)
        for session in _SEPARATE_VENV_SESSIONS:
            if session != "isolation":
                self._session(session, "-R", "-s", session, after_install=True)


_INSTALL_LOG = ROOT / ".nox" / "install-only.log"


def test(pytest_args: list[str]) -> None:
    """Every check: the main session in front, every other session beside it (`_SideLane`).

    The separate venvs of the isolation, TensorFlow and DeepSpeed sessions are built in the background from
    the start (`--install-only`; they wait mostly on downloads and disk), and their tests run in them (`-R`:
    reuse, install nothing) once they are built.
    """
    timings: list[tuple[str, float]] = []
    started = time.monotonic()
    packages = _from_noxfile("PACKAGES")
    if set(_ISOLATION_ORDER) != set(packages):
        raise SystemExit(f"dev.py's isolation order {sorted(_ISOLATION_ORDER)} must name every package {packages}")
    _INSTALL_LOG.parent.mkdir(exist_ok=True)
    with _INSTALL_LOG.open("w") as log:
        installs = subprocess.Popen(
            [str(BIN / "nox"), "-f", "noxfile.py", "--install-only", "-s", *_SEPARATE_VENV_SESSIONS],
            cwd=ROOT,
            # Without a cache: pip would put the wheel it builds from DeepSpeed's sdist in ~/.cache/pip while
            # the Ray suite runs beside it, whose cluster reports what appeared in ~/.cache as its leak (a CI
            # run on a machine without ~/.cache failed so).
            env={**_env(), "PIP_NO_CACHE_DIR": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    side = _SideLane(ROOT / ".nox" / "side-lane.log", installs, pytest_args)
    side.start()
    main_failed: SystemExit | None = None
    try:
        main_run = ("--no-venv", "--no-install", "-s", "lint", "typecheck", "tests", *pytest_args)
        _timed("lint, typecheck, tests", timings, *main_run)
    except SystemExit as e:
        main_failed = e
    except BaseException:
        side.stop()
        installs.terminate()
        raise
    finally:
        side.join()
    if installs.returncode not in (0, None):
        print(_INSTALL_LOG.read_text()[-20000:], file=sys.stderr)
    print("\ntime per stage:", flush=True)
    for stage, seconds in timings:
        print(f"  {seconds:7.1f} s  {stage}", flush=True)
    print("  beside it, one after another:", flush=True)
    if side.installed_after is not None:
        print(f"  {side.installed_after:7.1f} s  separate venvs installed, from the start", flush=True)
    for stage, seconds in side.timings:
        print(f"  {seconds:7.1f} s  {stage}", flush=True)
    print(f"  {time.monotonic() - started:7.1f} s  in all", flush=True)
    if side.failures:
        print(f"beside the main session: {'; '.join(side.failures)}", file=sys.stderr, flush=True)
    if main_failed is not None:
        raise main_failed
    if side.failures:
        raise SystemExit("; ".join(side.failures))


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
