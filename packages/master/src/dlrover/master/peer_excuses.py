"""Hang excuses relayed between nodes: a rank that waits on another node's rank is not hung while that rank is
in a named phase within its allowance or runs code its agent found busy.

Each agent judges only its own ranks (`dlrover.launcher.step_watch`). Rank 0 evaluating alone while every other
rank waits at the next barrier is excused on rank 0's node, but the ranks of the other nodes would go quiet past
their windows and be restarted as hung. So every heartbeat carries its node's excuses (`PeerExcuse`, relative to
when it was sent), and the answer to every heartbeat carries the lasting excuses of the *other* nodes (the
earliest begun first, at most `MAX_RELAYED`): an agent excuses its quiet ranks by them when they went quiet
after one began (see `HangDetector.check`).

A node's excuses are replaced by those its next heartbeat carries (none: it excuses nobody); an excuse is dropped
when it has run out, when its node has not been heard for `stale_after_s` (a node that died mid-evaluation
excuses nobody for long: its peers' collectives fail anyway), and when the master hears that the node failed,
finished or was lost (`forget`).

Pure: ``now`` comes in as an argument (the master's clock).
"""

from __future__ import annotations

from collections.abc import Sequence

from dlrover.common import ConfigError
from dlrover.diagnosis import AnchoredExcuse, PeerExcuse

__all__ = ["MAX_EXCUSES_PER_NODE", "MAX_RELAYED", "PeerExcuses"]

MAX_EXCUSES_PER_NODE = 64
"""At most this many excuses come with one heartbeat (a node's ranks in named phases, its busy ranks)."""

MAX_RELAYED = 8
"""At most this many excuses go with one heartbeat answer (the earliest begun)."""


class PeerExcuses:
    """The excuses of a job's nodes, by node id.

    Args:
        stale_after_s: an excuse whose node has not been heard for this long is dropped.
    """

    def __init__(self, stale_after_s: float = 30.0) -> None:
        if not stale_after_s > 0:
            raise ConfigError(f"stale_after_s must be > 0, got {stale_after_s!r}")
        self._stale_after_s = stale_after_s
        self._held: dict[int, tuple[float, list[AnchoredExcuse]]] = {}  # node -> (when heard, its excuses)

    def observe(self, node_id: int, excuses: Sequence[PeerExcuse], now: float) -> None:
        """Record what `node_id`'s heartbeat received at `now` carried (none: it excuses nobody now)."""
        if not excuses:
            self._held.pop(node_id, None)
            return
        self._held[node_id] = (now, [e.anchored(now) for e in excuses])

    def forget(self, node_id: int) -> None:
        """The node left, or its processes restart: it excuses nobody."""
        self._held.pop(node_id, None)

    def for_node(self, node_id: int, now: float) -> tuple[PeerExcuse, ...]:
        """The excuses to send `node_id` at `now`: the other nodes' that still last, the earliest begun first
        (at most `MAX_RELAYED`)."""
        lasting: list[AnchoredExcuse] = []
        for other, (heard, excuses) in list(self._held.items()):
            kept = [e for e in excuses if now < e.until_s] if now - heard <= self._stale_after_s else []
            if not kept:
                del self._held[other]
                continue
            self._held[other] = (heard, kept)
            if other != node_id:
                lasting.extend(e for e in kept if e.lasts(now))
        lasting.sort(key=lambda e: (e.began_s, -e.until_s))
        return tuple(e.relative(now) for e in lasting[:MAX_RELAYED])
