"""dlrover-run's private temp dirs (the token file's, the default log dir) do not outlive a SIGKILL:
the next dlrover-run on the host removes those whose dlrover-run is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dlrover.common import TOKEN_FILE_ENV_VAR, ProcessIdentity
from dlrover.launcher.cli import LOG_DIR_PREFIX, TOKEN_DIR_PREFIX

WAIT_S = 90.0

# Records its pid and token file (atomically), then waits to be killed or exits at once.
WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    out, mode = sys.argv[1:3]
    record = {"pid": os.getpid(), "token_file": os.environ[TOKEN_FILE_ENV_VAR]}
    tmp = os.path.join(out, f"{mode}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(out, f"{mode}.json"))
    if mode == "wait":
        time.sleep(600)
    """
).replace("TOKEN_FILE_ENV_VAR", repr(TOKEN_FILE_ENV_VAR))


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


def _env(tmpdir: Path) -> dict[str, str]:
    # Nothing of an enclosing job (a master address, a token file, torchrun's PET_ defaults).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLROVER_", "PET_", "TORCHELASTIC_"))}
    env["TMPDIR"] = str(tmpdir)
    # No default log root can be made (./dlrover-logs is a file, the state dir is below one), so
    # --redirects without --log-dir makes dlrover-run keep its logs in a private temp dir.
    env["XDG_STATE_HOME"] = str(tmpdir.parent / "blocked" / "state")
    return env


def _unwritable_cwd(tmp_path: Path) -> Path:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "dlrover-logs").write_text("not a directory")
    (tmp_path / "blocked").write_text("not a directory")
    return cwd


def _command(script: Path, out: Path, mode: str) -> list[str]:
    return [sys.executable, "-m", "dlrover.launcher.cli", "--standalone", "--redirects=3", str(script), str(out), mode]


def _ours(tmpdir: Path) -> list[Path]:
    return sorted(p for p in tmpdir.iterdir() if p.name.startswith((TOKEN_DIR_PREFIX, LOG_DIR_PREFIX)))


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=WAIT_S)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_next_dlrover_run_removes_the_temp_dirs_of_a_killed_one(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    tmpdir, out = tmp_path / "tmp", tmp_path / "out"
    tmpdir.mkdir()
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    cwd = _unwritable_cwd(tmp_path)
    first = subprocess.Popen(
        _command(script, out, "wait"),
        cwd=cwd,
        env=_env(tmpdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started.append(first)
    record_file = out / "wait.json"
    _wait_for(lambda: record_file.exists() or first.poll() is not None, "the first run's worker started")
    assert record_file.exists(), first.communicate(timeout=WAIT_S)[0][-4000:]
    record = json.loads(record_file.read_text())
    token_dir = Path(record["token_file"]).parent
    worker = ProcessIdentity.of(record["pid"])
    assert worker is not None
    leaked = _ours(tmpdir)
    # The token dir and the log dir, both private and named after the first dlrover-run.
    assert token_dir in [p.resolve() for p in leaked]
    assert sorted(p.name[: p.name.index(str(first.pid))] for p in leaked) == [LOG_DIR_PREFIX, TOKEN_DIR_PREFIX]

    first.kill()  # SIGKILL: no cleanup runs
    first.communicate(timeout=WAIT_S)
    assert first.returncode == -signal.SIGKILL
    # The worker gets SIGKILL from its parent-death signal; it is not our child, so wait on /proc.
    _wait_for(lambda: not worker.alive(), "the killed run's worker died")
    assert _ours(tmpdir) == leaked  # what the kill left behind

    second = subprocess.run(
        _command(script, out, "exit"),
        cwd=cwd,
        env=_env(tmpdir),
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
    )
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-4000:]
    assert (out / "exit.json").exists()
    for path in leaked:
        assert f"removed {path}" in output
    assert "worker logs are not kept (give --log-dir): cannot make" in output
    # The first run's dirs were swept, the second's removed on its normal exit.
    assert _ours(tmpdir) == []
