"""The values the rendezvous manager takes and answers with."""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from dlrover.rendezvous.config import RendezvousConfig
from dlrover.rendezvous.decision import WorkerRanks, worker_ranks
from dlrover.rendezvous.errors import InvalidRequestError

__all__ = [
    "MAX_LOCAL_WORLD_SIZE",
    "MAX_NODE_ID_CHARS",
    "HeartbeatResult",
    "JoinResult",
    "NodeParams",
    "PollResult",
    "PollState",
    "Round",
    "WaitingCount",
]

MAX_NODE_ID_CHARS = 256
MAX_LOCAL_WORLD_SIZE = 1 << 16
"""The most workers one node may say it runs (far above any host's accelerators or cores)."""


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


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen
class Round:
    """A completed round.

    Attributes:
        number: rounds count up from 1.
        members: node ids by rank (members[r] has rank r).
        completed_at: when it completed (monotonic seconds).
        config: the parameters it completed under.
        reason: why it completed.
        local_world_sizes: by rank, the workers each member runs (its ``--nproc-per-node``), 0 for
            a member that did not say; empty when none is known (a round restored from a journal
            that predates them).
    """

    number: int
    members: tuple[str, ...]
    completed_at: float
    config: RendezvousConfig
    reason: str
    local_world_sizes: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    _ranks: dict[str, int] = attrs.field(init=False, eq=False, repr=False)
    _workers: WorkerRanks | None = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.local_world_sizes and len(self.local_world_sizes) != len(self.members):
            raise ValueError(
                f"round {self.number} has {len(self.members)} members but "
                f"{len(self.local_world_sizes)} local world sizes"
            )
        # Lookup tables, so a poll costs O(1) even in a round of thousands of nodes.
        object.__setattr__(self, "_ranks", {node: rank for rank, node in enumerate(self.members)})
        object.__setattr__(self, "_workers", worker_ranks(self.local_world_sizes))

    @property
    def world_size(self) -> int:
        """How many nodes the round holds."""
        return len(self.members)

    def rank_of(self, node_id: str) -> int | None:
        """The node's rank, or None when it is not a member."""
        return self._ranks.get(node_id)

    @property
    def workers(self) -> WorkerRanks | None:
        """Where every member's workers sit among the global ranks; None unless every member said
        how many it runs (see `worker_ranks`)."""
        return self._workers


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
class WaitingCount:
    """How many nodes wait for the next round, and when to ask again.

    Attributes:
        num_nodes_waiting: nodes waiting (at least 1 for a node whose round was dissolved).
        retry_after_s: seconds until the asking node should ask again (see
            `RendezvousManager.waiting_check`); 0 from a service that does not pace.
        rounds_formed: rounds the rendezvous has formed so far (0: the first is still forming,
            or a service that does not say).
    """

    num_nodes_waiting: int
    retry_after_s: float = 0.0
    rounds_formed: int = 0


@attrs.frozen
class PollResult:
    """The answer to a poll.

    Attributes:
        state: see `PollState`.
        round: the round assigned, or the round waited for.
        rank: the node's rank when ASSIGNED, else -1.
        world_size: the round's size when ASSIGNED, else 0.
        reason: why, always set ("3 of min 4 nodes joined; waiting for 1 more").
        first_worker_rank: when ASSIGNED and every member said its local world size, the global
            rank of this node's local rank 0 (torchrun's prefix sum over the nodes ranked before
            it); else 0.
        worker_world_size: in that case the workers of all members (``WORLD_SIZE``); else 0, which
            says the layout is unknown.
        spare: the node is WAITING as a spare (see `RendezvousManager.set_spares`): it waits for a
            rank with no join timeout.
        retry_after_s: when WAITING, how long to wait before the next poll (see
            `RendezvousConfig.poll_rate_per_s`); 0 otherwise, and from a service that does not pace.
    """

    state: PollState
    round: int
    rank: int
    world_size: int
    reason: str
    first_worker_rank: int = 0
    worker_world_size: int = 0
    spare: bool = False
    retry_after_s: float = 0.0


@attrs.frozen
class HeartbeatResult:
    """The answer to a heartbeat: whether the node is known, and why not when it is not."""

    known: bool
    reason: str
