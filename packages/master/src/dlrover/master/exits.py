"""The exit statuses a master that could not start, or could not go on, ends with (`dlrover-master` and its
`ps-job`): what the operator reads from a master pod's container to tell a passing trouble from a bad spec."""

from __future__ import annotations

from dlrover.common import DLRoverError
from dlrover.master.scheduler.base import BackendUnavailableError
from dlrover.master.statedir import StateDirInUseError

__all__ = ["EXIT_RETRY", "EXIT_USAGE", "start_failure"]

EXIT_USAGE = 2
"""The master could not start: bad usage or configuration. Starting it again the same way fails again."""
EXIT_RETRY = 75
"""The master could not start now, for a reason that passes (sysexits' EX_TEMPFAIL): another master still
holds the state directory (a predecessor on a lost node, until its lock is released), or the backend's
platform could not be reached. Start it again later (the operator does, with backoff)."""

_RETRYABLE_START_ERRORS: tuple[type[DLRoverError], ...] = (StateDirInUseError, BackendUnavailableError)


def start_failure(exc: DLRoverError) -> int:
    """The exit status of a master that could not start: `EXIT_RETRY` for a passing reason, else `EXIT_USAGE`."""
    return EXIT_RETRY if isinstance(exc, _RETRYABLE_START_ERRORS) else EXIT_USAGE
