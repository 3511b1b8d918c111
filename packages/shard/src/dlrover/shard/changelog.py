"""A registry's change log: each changing call as one JSON line, replayable onto a base export.

A service that must keep its shard state across a restart (the master) could export the whole
registry after every change; that export holds every worker's lease, so at 80,000 workers it is
26 MB and seconds of CPU, paid per batch of requests. Instead the registry (after
`ShardRegistry.start_change_log`) records each call that changed it, with the time its managers
read, and the host journals those lines as they come; now and then it journals a whole base
(`ShardRegistry.journal_base`) and drops the lines the base holds. A restarted host loads the
newest base and replays the lines after it (`ShardRegistry.load_journal`).

Replay is exact because the managers are pure: the same calls at the same clock readings on the
same state make the same decisions. Two things make it so:

- every clock reading of one call is the same reading (`RequestClock` pins it for the call), and
  that reading is in the line;
- the base holds what a later call depends on: each lease's deadline on the old clock, every
  remembered reply (a retried request is answered from them), the restore replies.

Leases that ran out between two calls are taken back by the next call, in deadline order, live
and in the replay alike, so reads that took them back earlier (a status, a checkpoint) need no
line. After the replay every lease runs a whole lease period on the new clock, as after any
restart.

A line::

    {"seq": 17, "t": 1234.5, "call": "done", "args": {"dataset": "train", "worker": "3/0",
     "shard_id": 12, "request_id": "..."}}

A base::

    {"format": "dlrover.shard.registry", "version": 1, "seq": 16, "time": 1234.0,
     "datasets": [<progress document, version 2, exact>, ...],
     "restores": [{"request_id", "dataset", "returned_to_queue", "reason"}, ...]}

Sequence numbers grow by one per line and per base, so a base is newer than every line it holds.
A registry that logs refuses a change made on one of its managers directly (it would reach no
line): changes go through the registry's own calls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from dlrover.common import Clock
from dlrover.shard.errors import InvalidShardRequestError, ShardStateError

__all__ = [
    "REGISTRY_BASE_FORMAT",
    "REGISTRY_BASE_VERSION",
    "LoggedCall",
    "RequestClock",
    "decode_call",
    "encode_base",
    "encode_call",
]

REGISTRY_BASE_FORMAT = "dlrover.shard.registry"
REGISTRY_BASE_VERSION = 1

CALLS = frozenset({"register", "fetch", "progress", "done", "fail", "remove_worker", "restore", "advance_stream"})
"""The registry calls that change it, by the name their lines carry."""


@attrs.frozen
class LoggedCall:
    """One line of a registry's change log, or one base (`ShardRegistry.journal_base`).

    Attributes:
        seq: its place in the log (a base has the number after the last line it holds).
        text: the JSON text.
    """

    seq: int
    text: str


def encode_call(seq: int, t: float, call: str, args: dict[str, Any]) -> LoggedCall:
    """The line for `call` made with `args` (JSON-ready) at clock reading `t`."""
    return LoggedCall(seq, json.dumps({"seq": seq, "t": t, "call": call, "args": args}, separators=(",", ":")))


def encode_base(seq: int, document: dict[str, Any]) -> LoggedCall:
    """The base numbered `seq` holding `document` (`ShardRegistry.journal_base_document`)."""
    return LoggedCall(seq, json.dumps(document, separators=(",", ":")))


def decode_call(line: LoggedCall) -> tuple[float, str, dict[str, Any]]:
    """A line's clock reading, call and arguments.

    Raises:
        InvalidShardRequestError: the line is not one `encode_call` writes, or its number is not the
            number it is stored under.
    """
    try:
        doc = json.loads(line.text)
    except ValueError as exc:
        raise InvalidShardRequestError(f"change {line.seq}: not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidShardRequestError(f"change {line.seq}: not an object")
    t, call, args = doc.get("t"), doc.get("call"), doc.get("args")
    if doc.get("seq") != line.seq:
        raise InvalidShardRequestError(f"change {line.seq}: it says it is change {doc.get('seq')!r}")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        raise InvalidShardRequestError(f"change {line.seq}: t must be a finite number, got {t!r}")
    if call not in CALLS:
        raise InvalidShardRequestError(f"change {line.seq}: unknown call {call!r}")
    if not isinstance(args, dict):
        raise InvalidShardRequestError(f"change {line.seq}: args must be an object")
    return float(t), call, args


class RequestClock:
    """The clock a registry's managers read: the host's clock, except during a changing call, which
    reads one pinned value throughout (the value its log line carries, or, in a replay, the one it
    carried).

    Args:
        clock: the host's clock.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._pinned: float | None = None
        self.strict = False
        """Changes only inside a pinned call (a registry that logs them): see `check_in_call`."""

    def now(self) -> float:
        """The pinned reading while a call runs, else the host clock's."""
        pinned = self._pinned
        return self._clock.now() if pinned is None else pinned

    def wall_time(self) -> float:
        """The host clock's wall time (never pinned: managers do not read it)."""
        return self._clock.wall_time()

    def sleep(self, seconds: float) -> None:
        """The host clock's sleep."""
        self._clock.sleep(seconds)

    def read(self) -> float:
        """A fresh reading of the host clock, for a call about to be pinned."""
        return self._clock.now()

    def check_in_call(self, what: str) -> None:
        """Refuse a change made straight on a manager of a registry that logs its changes: it would
        reach no line, and a replay would miss it (and refuse the lines after it).

        Raises:
            ShardStateError: strict, and no registry call is under way.
        """
        if self.strict and self._pinned is None:
            raise ShardStateError(
                f"{what} made on a shard manager directly: its registry logs its changes, so make it "
                "through the registry (ShardRegistry.fetch, report_progress, report_done, report_failure, "
                "remove_worker, advance_stream)"
            )

    @contextmanager
    def pinned(self, t: float) -> Iterator[float]:
        """Read `t` until the block ends; calls do not nest (the registry is not reentrant)."""
        if self._pinned is not None:
            raise RuntimeError("a registry call started inside another one")
        self._pinned = t
        try:
            yield t
        finally:
            self._pinned = None
