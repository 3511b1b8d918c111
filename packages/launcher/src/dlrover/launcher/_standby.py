"""A standby worker: an interpreter that has already imported heavy modules and waits to run.

    python -u -m dlrover.launcher._standby PARENT_PID MODULES -- PYTHON -u SCRIPT [ARGS...]
    python -u -m dlrover.launcher._standby PARENT_PID MODULES -- PYTHON -u -m MODULE [ARGS...]

Starting a worker costs the interpreter's start and the imports of torch and the like: seconds,
all of it on the restart path after a failure. A standby pays that ahead of time: it arms the
parent-death signal (as `_orphan_guard` does, so it dies with its agent), imports `MODULES`
(comma-separated), then blocks reading one line from standard input. The line is the JSON object
``{"env": {NAME: VALUE, ...}}``: the standby replaces its environment with that one, points fd 0 at
/dev/null, and runs the worker program the way ``python -u SCRIPT`` or ``python -u -m MODULE``
would (``sys.argv``, ``sys.path[0]``, ``__name__ == "__main__"``). End of input without a line
means the agent no longer needs it: it exits 0 without running anything.

What differs from a fresh start, and why it is opt-in (``dlrover-run --prewarm``): the modules in
`MODULES` were imported before the worker's own environment was set, so variables they read at
import time (for example ``OMP_NUM_THREADS`` for the OpenMP runtime that torch loads) come from
the agent's environment, not from anything the script sets before its first import.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
from collections.abc import Sequence

from dlrover.launcher._orphan_guard import ORPHANED_EXIT_CODE, _arm_parent_death_signal

USAGE = "usage: python -u -m dlrover.launcher._standby PARENT_PID MODULES -- PYTHON -u (SCRIPT | -m MODULE) [ARGS...]"


def runnable(program: Sequence[str]) -> bool:
    """Whether a standby can run `program` (``python -u SCRIPT ...`` or ``python -u -m MODULE ...``)."""
    if len(program) < 3 or program[1] != "-u":
        return False
    if program[2] == "-m":
        return len(program) >= 4
    return not program[2].startswith("-")


def _read_go_message() -> dict[str, str] | None:
    line = sys.stdin.readline()
    if not line:
        return None
    message = json.loads(line)
    env = message["env"]
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the go message's env must map names to strings")
    return env


def _detach_stdin() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (fd 0 lives as long as the process)


def _run(program: list[str]) -> None:
    if program[2] == "-m":
        module, args = program[3], program[4:]
        # As `python -m`: the current directory first on the path; argv[0] becomes the module's file.
        sys.path[0] = os.getcwd()
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, args = program[2], program[3:]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[2] != "--" or not runnable(argv[3:]):
        print(USAGE, file=sys.stderr)
        return 2
    expected_parent, modules, program = int(argv[0]), argv[1], argv[3:]
    _arm_parent_death_signal()
    if os.getppid() != expected_parent:
        return ORPHANED_EXIT_CODE
    for name in filter(None, modules.split(",")):
        importlib.import_module(name)
    env = _read_go_message()
    if env is None:
        return 0
    os.environ.clear()
    os.environ.update(env)
    _detach_stdin()
    _run(program)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
