"""Decoding a process's exit status into an exit code and a signal."""

from __future__ import annotations

import signal as _signal

import attrs

__all__ = ["ExitInfo"]

# Shells and container runtimes report death by signal N as exit status 128 + N.
_SHELL_SIGNAL_BASE = 128
_MAX_SIGNAL = 64


def _signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@attrs.frozen
class ExitInfo:
    """How a process ended.

    Args:
        returncode: the status as `subprocess` reports it: negative for death by a signal
            (``-9``), or a shell/container style status where ``128 + N`` means signal N (``137``).

    Attributes:
        exit_code: the status as given.
        signal: the signal number that killed the process, or None when it exited by itself.
    """

    returncode: int = attrs.field(validator=attrs.validators.instance_of(int))

    @property
    def signal(self) -> int | None:
        """The signal that ended the process, decoded from either convention, or None."""
        if self.returncode < 0:
            return -self.returncode
        if _SHELL_SIGNAL_BASE < self.returncode <= _SHELL_SIGNAL_BASE + _MAX_SIGNAL:
            return self.returncode - _SHELL_SIGNAL_BASE
        return None

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` and friends, or None when no signal ended the process."""
        signum = self.signal
        return None if signum is None else _signal_name(signum)

    @property
    def succeeded(self) -> bool:
        """True for a clean exit (status 0)."""
        return self.returncode == 0

    def describe(self) -> str:
        """A short human description, e.g. ``"exit status 137 (SIGKILL)"``."""
        name = self.signal_name
        if name is None:
            return f"exit status {self.returncode}"
        return f"exit status {self.returncode} ({name})"
