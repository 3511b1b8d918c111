"""Reports a worker could not deliver at once, delivered in order by one background thread (internal).

A training step must not fail because its master is restarting. A shard client tries each
report once; when the master cannot be reached the report is queued here, and this thread keeps
sending the oldest one (the same request, so the same request id) under the client's retry
policy, which under `dlrover-run` waits as long as the agent does. Later reports queue behind
it, so the master sees every worker's reports in the order they were made. A report the master
refuses, or one that outlives the retry policy, is logged and dropped from the queue; the client
raises its error from its next call, so nothing is dropped without the caller hearing of it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from dlrover.common import Clock

__all__ = ["ReportQueue"]

_log = logging.getLogger(__name__)

Send = Callable[[Any, Any], Any]
"""Sends one request with a stub method: `send(method, request)`; raises when it fails for good."""


class ReportQueue:
    """Undelivered reports of one client, oldest first, and the thread that delivers them.

    Args:
        send: delivers one report, retrying as long as the caller's policy allows.
        name: the thread's name.
        clock: time source for bounded waits.
    """

    def __init__(self, send: Send, name: str, clock: Clock) -> None:
        self._send = send
        self._name = name
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: deque[tuple[Any, Any, str]] = deque()
        self._error: BaseException | None = None
        # Set and cleared under the lock: a thread that decided to stop clears it before it
        # lets go, so a report put after that always starts a new one.
        self._delivering = False
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._pending)

    def busy(self) -> bool:
        """Whether reports wait: a new report must queue behind them to keep the order."""
        with self._cond:
            return bool(self._pending)

    def put(self, method: Any, request: Any, what: str) -> None:
        """Queue a report (`what` names it in messages) and make sure the thread delivers it.

        Raises:
            RuntimeError: the queue is closed; nothing was queued.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{what}: the shard client is closed")
            self._pending.append((method, request, what))
            if len(self._pending) == 1:
                _log.warning(
                    "%s queued: the master cannot be reached; training goes on and it is sent when it is back", what
                )
            if not self._delivering:
                self._delivering = True
                threading.Thread(target=self._deliver, name=self._name, daemon=True).start()

    def raise_error(self) -> None:
        """Raise (once) the error that stopped delivery, if any."""
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def drain(self, timeout_s: float | None) -> bool:
        """Wait until every queued report is delivered or one failed; True when none is left.

        Raises:
            BaseException: a report failed for good (raised once).
        """
        give_up = None if timeout_s is None else self._clock.now() + timeout_s
        with self._cond:
            while self._pending and self._error is None:
                left = None if give_up is None else give_up - self._clock.now()
                if left is not None and left <= 0:
                    break
                # Wake up now and then: the clock may be one the tests advance by hand.
                self._cond.wait(0.5 if left is None else min(left, 0.5))
        self.raise_error()
        return not self.busy()

    def close(self, timeout_s: float | None) -> list[str]:
        """Deliver what is queued (up to `timeout_s`), then stop; returns (and logs) what was left undelivered.

        A report that failed for good was logged when it failed; it is not raised here.
        """
        try:
            self.drain(timeout_s)
        except Exception:  # noqa: S110 (logged by _deliver when it failed)
            pass
        finally:
            with self._cond:
                self._closed = True
                left = [what for _, _, what in self._pending]
                self._pending.clear()
                self._cond.notify_all()
        if left:
            _log.error(
                "%d report(s) never reached the master (%s); their leases will expire", len(left), ", ".join(left)
            )
        return left

    def _deliver(self) -> None:
        while True:
            with self._cond:
                if not self._pending or self._closed:
                    self._delivering = False
                    self._cond.notify_all()
                    return
                method, request, what = self._pending[0]
            error: BaseException | None = None
            try:
                self._send(method, request)
            except BaseException as exc:  # raised from the client's next call, never lost
                error = exc
            with self._cond:
                if self._pending and self._pending[0][1] is request:
                    self._pending.popleft()
                if error is not None:
                    _log.error("%s could not be delivered: %s", what, error)
                    if self._error is None:
                        self._error = error
                elif not self._pending:
                    _log.warning("the master answers again: every queued report is delivered")
                self._cond.notify_all()
