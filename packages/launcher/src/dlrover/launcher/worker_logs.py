"""Where `dlrover-run` keeps its workers' logs, and when it removes them.

Without ``--log-dir`` the workers' ``stdout.log``, ``stderr.log`` and error files go to
``./dlrover-logs`` (the directory `dlrover-run` was started in, where a user looks first, as for
``lightning_logs`` or ``wandb``); where that cannot be written (a read-only working directory), to
``$XDG_STATE_HOME/dlrover/logs`` (``~/.local/state/dlrover/logs``). Each agent writes into a folder
of its own below that root (``<run id>_<unique>``, as torchrun's), which outlives the run so that
a failure can be read after `dlrover-run` has exited. ``--log-cleanup`` removes that folder at exit:
``never`` (the default), ``on-success`` or ``always``. The size of each log file is capped by
``--log-max-mb`` (see `dlrover.launcher.workers.CappedLogFile`).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from dlrover.common import ConfigError
from dlrover.diagnosis import extract_tracebacks, strip_rank_prefix
from dlrover.launcher.workers import WorkerExit

__all__ = [
    "DEFAULT_LOG_DIR_NAME",
    "LogCleanup",
    "default_log_root",
    "failure_line",
    "remove_run_logs",
]

_log = logging.getLogger(__name__)

DEFAULT_LOG_DIR_NAME = "dlrover-logs"
"""The default log root's name in the working directory."""


class LogCleanup(enum.Enum):
    """When the agent removes its run's log folder as it exits (``--log-cleanup``)."""

    NEVER = "never"
    ON_SUCCESS = "on-success"
    ALWAYS = "always"

    @classmethod
    def parse(cls, text: str) -> LogCleanup:
        """``never``, ``on-success`` (or ``on_success``) or ``always``.

        Raises:
            ConfigError: any other value; the message names the choices.
        """
        value = str(text).strip().lower().replace("_", "-")
        for member in cls:
            if member.value == value:
                return member
        choices = ", ".join(m.value for m in cls)
        raise ConfigError(f"--log-cleanup must be one of {choices}, got {text!r}")

    def removes(self, succeeded: bool) -> bool:
        """Whether a run that `succeeded` (or not) has its log folder removed."""
        return self is LogCleanup.ALWAYS or (self is LogCleanup.ON_SUCCESS and succeeded)


def _state_home(environ: Mapping[str, str]) -> Path | None:
    given = environ.get("XDG_STATE_HOME", "")
    if given and os.path.isabs(given):  # the XDG spec: a relative path is to be ignored
        return Path(given)
    home = environ.get("HOME", "")
    return Path(home) / ".local" / "state" if home else None


def default_log_root(cwd: Path, environ: Mapping[str, str]) -> tuple[Path | None, list[str]]:
    """The root of the worker logs when no ``--log-dir`` is given, made if missing.

    Args:
        cwd: the working directory `dlrover-run` was started in.
        environ: its environment (for ``XDG_STATE_HOME`` and ``HOME``).

    Returns:
        ``cwd/dlrover-logs``, or else ``$XDG_STATE_HOME/dlrover/logs``, whichever is the first
        that exists or can be made and is writable; None when neither, with why for each.
    """
    candidates = [cwd / DEFAULT_LOG_DIR_NAME]
    state = _state_home(environ)
    if state is not None:
        candidates.append(state / "dlrover" / "logs")
    problems = []
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problems.append(f"cannot make {path}: {exc.strerror or exc}")
            continue
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            problems.append(f"{path} is not a writable directory")
            continue
        return path, problems
    return None, problems


def remove_run_logs(run_dir: Path, default_root: Path | None = None) -> bool:
    """Remove an agent's log folder (never following a symlink); True when it is gone.

    When `default_root` (the default log root, which this run may have made) is left empty, it
    goes too; a root given with ``--log-dir`` stays. A failure is logged as a warning.
    """
    try:
        shutil.rmtree(run_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        _log.warning("could not remove the worker logs in %s: %s", run_dir, exc)
        return False
    if default_root is not None:
        with contextlib.suppress(OSError):  # only when empty: other runs' folders stay
            default_root.rmdir()
    return True


def _last_exception(stderr_tail: str) -> str:
    """The exception line of the last traceback in a worker's stderr, else its last line."""
    lines = stderr_tail.splitlines()
    found = extract_tracebacks(lines)
    if found:
        return found[-1].exception_line
    for line in reversed(lines):
        if line.strip():
            return strip_rank_prefix(line).strip()[:300]
    return ""


def failure_line(failed: WorkerExit, rank: str = "?") -> str:
    """One line for the agent's log about a worker that failed: who, how, the exception that
    ended it, and where its whole output is (the traceback is printed once, by the worker).

    Args:
        failed: how the worker ended.
        rank: its global rank, as given to it.
    """
    how = f"signal {failed.signal_name}" if failed.signal_name else f"exit code {failed.exit_code}"
    line = f"local rank {failed.local_rank} (rank {rank}, pid {failed.pid}) failed with {how}"
    last = _last_exception(failed.stderr_tail)
    if last:
        line += f": {last}"
    if failed.log_dir is not None:
        line += f"; its whole output: {failed.log_dir / 'stderr.log'}"
    return line
