"""Group commit: many changes made durable by one write, none answered before it is.

A library the master hosts (the shard service) must have each change journaled before it answers
the request that made it (an acknowledged sample survives a master restart), and its journal
entry is an export of its whole state. Journaling once per request costs each request the export,
which grows with the workers (at 4,000 workers about 23 ms a request): a job of thousands of
ranks would wait on the master's disk. Here the requests that change the state while one export is
being written wait for the next one, which covers them all: under load one write serves many
requests, and alone a request pays for one write, as before.

A request counts its change (`changed`) after making it, so any export that starts after the count
holds the change. The one caller that finds no write under way writes; the others wait until a
write that started after their change has finished. A write that fails raises in its writer; the
waiters it would have covered try again themselves, so each learns whether its change is durable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["GroupCommit"]


class GroupCommit:
    """Makes changes durable in groups.

    Args:
        write: exports the whole state and journals it; raises when it could not.
    """

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._changes = 0  # changes counted so far
        self._durable = 0  # the changes the newest finished write holds
        self._writing = False
        self._writes = 0

    @property
    def changes(self) -> int:
        """Changes counted so far (for measurements and tests)."""
        with self._cond:
            return self._changes

    @property
    def writes(self) -> int:
        """Writes that finished (for measurements and tests)."""
        with self._cond:
            return self._writes

    def changed(self) -> None:
        """Count a change just made and return once a write holding it has finished.

        Raises:
            Whatever `write` raised, when this caller's own write failed; the change stays in
            memory and reaches the journal with the next write that succeeds.
        """
        with self._cond:
            self._changes += 1
            ticket = self._changes
            while self._durable < ticket:
                if not self._writing:
                    self._writing = True
                    covers = self._changes  # each of them was made before the export starts
                    break
                self._cond.wait()
            else:
                return
        try:
            self._write()
        except BaseException:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._writing = False
            self._durable = max(self._durable, covers)
            self._writes += 1
            self._cond.notify_all()
