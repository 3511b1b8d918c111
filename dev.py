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

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
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


# The isolation sessions, in two groups of about equal time (seconds of unit tests measured on a CI run: master
# 108, diagnosis 87, flashckpt 58, launcher 26, autoscale 23, rendezvous 15, common 8, shard 6).
_ISOLATION_GROUPS = (("master", "autoscale", "common", "shard"), ("diagnosis", "flashckpt", "launcher", "rendezvous"))


def _isolation_in_two(timings: list[tuple[str, float]]) -> None:
    """Each package's isolation session, two at a time: each is one pytest process of unit tests, bound by one
    core, so on two cores two groups side by side take about half the time of one after the other. Each group's
    output is printed whole once both have ended."""
    packages = _from_noxfile("PACKAGES")
    grouped = {p for group in _ISOLATION_GROUPS for p in group}
    if grouped != set(packages):
        raise SystemExit(f"dev.py's isolation groups {sorted(grouped)} must name every package {packages}")
    started = time.monotonic()
    runs = []
    for index, group in enumerate(_ISOLATION_GROUPS):
        log = ROOT / ".nox" / f"isolation-{index}.log"
        sessions = [f"isolation(pkg='{p}')" for p in group]
        with log.open("w") as out:
            command = [str(BIN / "nox"), "-f", "noxfile.py", "-R", "-s", *sessions]
            print("+", " ".join(command), flush=True)
            runs.append((log, subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)))
    codes = [proc.wait() for _log, proc in runs]
    for log, _proc in runs:
        print(log.read_text(), flush=True)
    timings.append(("isolation, two groups side by side", time.monotonic() - started))
    failed = next((code for code in codes if code != 0), 0)
    if failed:
        raise SystemExit(failed)


def test(pytest_args: list[str]) -> None:
    """Every check, with the separate venvs' installs overlapping the main test run.

    Those installs wait mostly on downloads and disk, the main tests on the CPU, so building the
    venvs of the isolation, TensorFlow and DeepSpeed sessions in the background (`--install-only`)
    and then running their tests in them (`-R`: reuse, install nothing) takes minutes off a run.
    """
    timings: list[tuple[str, float]] = []
    started = time.monotonic()
    log_path = ROOT / ".nox" / "install-only.log"
    log_path.parent.mkdir(exist_ok=True)
    with log_path.open("w") as log:
        installs = subprocess.Popen(
            [str(BIN / "nox"), "-f", "noxfile.py", "--install-only", "-s", *_SEPARATE_VENV_SESSIONS],
            cwd=ROOT,
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        installed_after: list[float] = []

        def note_when_installed() -> None:
            installs.wait()
            installed_after.append(time.monotonic() - started)

        waiter = threading.Thread(target=note_when_installed, daemon=True)
        waiter.start()
        try:
            main_run = ("--no-venv", "--no-install", "-s", "lint", "typecheck", "tests", *pytest_args)
            _timed("lint, typecheck, tests", timings, *main_run)
            _timed("kubernetes tests", timings, "--no-venv", "--no-install", "-s", "tests-kubernetes", *pytest_args)
            _timed("ray tests", timings, "--no-venv", "--no-install", "-s", "tests-ray", *pytest_args)
            _timed("proto check", timings, "--no-venv", "--no-install", "-s", "proto", "--", "--check")
        except BaseException:
            installs.terminate()
            raise
        finally:
            waiter.join()
    timings.append(("separate venvs installed, in the background from the start", installed_after[0]))
    if installs.returncode != 0:
        print(log_path.read_text()[-20000:], file=sys.stderr)
        raise SystemExit(f"installing the separate venvs failed (exit code {installs.returncode}); log: {log_path}")
    _isolation_in_two(timings)
    for session in _SEPARATE_VENV_SESSIONS:
        if session != "isolation":
            _timed(session, timings, "-R", "-s", session)
    print("\ntime per stage:", flush=True)
    for stage, seconds in timings:
        print(f"  {seconds:7.1f} s  {stage}", flush=True)
    print(f"  {time.monotonic() - started:7.1f} s  in all", flush=True)


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
