"""The values the rendezvous manager takes and answers with."""

from __future__ import annotations

import enum

import attrs

from dlrover.rendezvous.config import RendezvousConfig
from dlrover.rendezvous.errors import InvalidRequestError

__all__ = [
    "MAX_NODE_ID_CHARS",
    "HeartbeatResult",
    "JoinResult",
    "NodeParams",
    "PollResult",
    "PollState",
    "Round",
]

MAX_NODE_ID_CHARS = 256


@attrs.frozen
class NodeParams:
    """The parameters a node expects (for example torchrun's `--nnodes=MIN:MAX`).

    They must equal the rendezvous's own: disagreeing nodes are rejected, never silently overruled.

    Raises:
        InvalidRequestError: a size is below 1, or `min_nodes > max_nodes`.
    """

    min_nodes: int
    max_nodes: int

    def __attrs_post_init__(self) -> None:
        for name, value in (("min_nodes", self.min_nodes), ("max_nodes", self.max_nodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequestError(f"{name} must be an integer >= 1, got {value!r}")
        if self.min_nodes > self.max_nodes:
            raise InvalidRequestError(f"min_nodes ({self.min_nodes}) must not exceed max_nodes ({self.max_nodes})")


@attrs.frozen
class Round:
    """A completed round.

    Attributes:
        number: rounds count up from 1.
        members: node ids by rank (members[r] has rank r).
        completed_at: when it completed (monotonic seconds).
        config: the parameters it completed under.
        reason: why it completed.
    """

    number: int
    members: tuple[str, ...]
    completed_at: float
    config: RendezvousConfig
    reason: str
    _ranks: dict[str, int] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # A lookup table, so a poll costs O(1) even in a round of thousands of nodes.
        object.__setattr__(self, "_ranks", {node: rank for rank, node in enumerate(self.members)})

    @property
    def world_size(self) -> int:
        """How many nodes the round holds."""
        return len(self.members)

    def rank_of(self, node_id: str) -> int | None:
        """The node's rank, or None when it is not a member."""
        return self._ranks.get(node_id)


@attrs.frozen
class JoinResult:
    """The answer to a join.

    Attributes:
        accepted: whether the node now waits for a round.
        round: the round it waits for.
        reason: why (always set; says what the node should do when not accepted).
    """

    accepted: bool
    round: int
    reason: str


class PollState(enum.Enum):
    """Where a polling node stands."""

    WAITING = "waiting"
    """It waits for the next round; poll again."""
    ASSIGNED = "assigned"
    """It holds a rank in the current round."""
    NOT_WAITING = "not_waiting"
    """It is neither waiting nor in the current round (expired, dropped, round dissolved): join again."""
    TIMED_OUT = "timed_out"
    """It waited `join_timeout_s` without being admitted and was taken off the waiting list."""
    CLOSED = "closed"
    """The rendezvous is closed; no more rounds form."""


@attrs.frozen
class PollResult:
    """The answer to a poll.

    Attributes:
        state: see `PollState`.
        round: the round assigned, or the round waited for.
        rank: the node's rank when ASSIGNED, else -1.
        world_size: the round's size when ASSIGNED, else 0.
        reason: why, always set ("3 of min 4 nodes joined; waiting for 1 more").
    """

    state: PollState
    round: int
    rank: int
    world_size: int
    reason: str


@attrs.frozen
class HeartbeatResult:
    """The answer to a heartbeat: whether the node is known, and why not when it is not."""

    known: bool
    reason: str
