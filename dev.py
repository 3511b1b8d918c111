#!/usr/bin/env python3
"""Set up and run DLRover's development tasks on a machine with only Python 3.11.

    python3 dev.py test    lint, typecheck, proto check, every test, each package in isolation, TF and DeepSpeed tests
    python3 dev.py demo    the main job: train a small GPT, kill a worker, recover from memory
    python3 dev.py setup   only prepare .venv
    python3 dev.py nox ... any nox command inside .venv (e.g. `python3 dev.py nox -s tests-shard`)

Set-up creates `.venv`, installs torch 2.13.0 first (alone and pinned: an unpinned torch would
pull the CUDA build), then every package editable with `constraints.txt`. It is quick when
`.venv` is already current.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

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
    query = "import json, noxfile; print(json.dumps(noxfile.dev_install_args()))"
    args = json.loads(subprocess.check_output([str(BIN / "python"), "-c", query], cwd=ROOT, text=True))
    _run(*pip, *args)
    STAMP.write_text(digest)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV)
    env.pop("PYTHONHOME", None)
    return env


def nox(*args: str) -> None:
    _run(str(BIN / "nox"), "-f", "noxfile.py", *args, env=_env())


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "help"
    if command in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    setup()
    if command == "setup":
        return 0
    if command == "test":
        nox("--no-venv", "--no-install", "-s", "lint", "typecheck", "tests", *argv[1:])
        nox("--no-venv", "--no-install", "-s", "proto", "--", "--check")
        nox("-s", "isolation")
        nox("-s", "tests-shard-tf")
        nox("-s", "tests-flashckpt-deepspeed")
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
