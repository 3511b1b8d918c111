"""Pure decisions of the rendezvous: whether a round completes, who is in it, and which rank each gets.

These functions read nothing but their arguments, so the manager's behaviour at any instant is a
function of its state and `now`; `RendezvousManager` only applies what they decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from dlrover.rendezvous.config import RendezvousConfig, largest_world_size
from dlrover.rendezvous.topology import NodeInfo, TopologyOrder

__all__ = ["RoundDecision", "WorkerRanks", "assign_ranks", "decide_round", "select_members", "worker_ranks"]


@attrs.frozen
class RoundDecision:
    """Whether the waiting nodes form a round now.

    Attributes:
        complete: True when a round should complete now.
        world_size: how many nodes it takes (0 when not complete).
        reason: why, in a sentence people read.
    """

    complete: bool
    world_size: int
    reason: str


def decide_round(
    config: RendezvousConfig,
    num_waiting: int,
    last_join_at: float | None,
    now: float,
    *,
    awaited: int = 0,
    planned_until: float | None = None,
) -> RoundDecision:
    """Decide whether `num_waiting` nodes complete a round at `now`.

    A round completes at once when `max_nodes` have joined; otherwise when at least `min_nodes` have
    joined and `last_call_s` has passed since the last join. It takes the largest multiple of
    `node_unit` that fits; the rest wait for the next round.

    A planned round (`planned_until` given: the caller knows which nodes restart for it) needs no
    last call: it completes as soon as none of its nodes is `awaited` any more, and until
    `planned_until` it waits for those that are, however long after the last join; past it, the
    last call decides as for any round.

    Args:
        config: the rendezvous parameters.
        num_waiting: nodes waiting for the next round.
        last_join_at: when the most recent of them joined (None when none wait).
        now: the current monotonic time.
        awaited: nodes of a planned round that have not joined yet.
        planned_until: until when a planned round waits for them; None when no round is planned.

    Returns:
        The decision and its reason.
    """
    n, lo, hi, unit = num_waiting, config.min_nodes, config.max_nodes, config.node_unit
    if n == 0 or last_join_at is None:
        return RoundDecision(False, 0, f"no nodes waiting (min {lo}, max {hi})")
    size = largest_world_size(n, hi, unit)
    if n < lo:
        return RoundDecision(False, 0, f"{n} of min {lo} nodes joined; waiting for {lo - n} more")
    if size < lo:
        return RoundDecision(
            False,
            0,
            f"{n} nodes joined but the largest multiple of node_unit {unit} within max {hi} is {size}, "
            f"below min {lo}; waiting for more",
        )
    if n >= hi:
        return RoundDecision(True, size, f"{n} nodes joined, max {hi} reached; round takes {size}")
    planned = (
        None
        if planned_until is None
        else _planned_decision(config, n, size, now=now, awaited=awaited, planned_until=planned_until)
    )
    return planned if planned is not None else _last_call_decision(config, n, size, last_join_at, now)


def _last_call_decision(config: RendezvousConfig, n: int, size: int, last_join_at: float, now: float) -> RoundDecision:
    """Enough nodes joined: the round forms once `last_call_s` passed since the last join."""
    lo, hi = config.min_nodes, config.max_nodes
    remaining = last_join_at + config.last_call_s - now
    if remaining > 0:
        return RoundDecision(
            False, 0, f"{n} nodes joined (min {lo}, max {hi}); last call in {remaining:.1f} s for more to join"
        )
    return RoundDecision(True, size, f"{n} nodes joined (min {lo}, max {hi}) and last call passed; round takes {size}")


def _planned_decision(
    config: RendezvousConfig, n: int, size: int, *, now: float, awaited: int, planned_until: float
) -> RoundDecision | None:
    """What a planned round decides with `n` nodes joined and `awaited` missing; None: its wait is
    over, the last call decides."""
    if awaited == 0:
        return RoundDecision(
            True, size, f"{n} nodes joined, every node of the planned round among them; round takes {size}"
        )
    if now < planned_until:
        return RoundDecision(
            False,
            0,
            f"{n} nodes joined (min {config.min_nodes}, max {config.max_nodes}); waiting up to "
            f"{planned_until - now:.1f} s for {awaited} more node(s) of the planned round",
        )
    return None


def select_members(
    waiting: Sequence[str], previous_ranks: Mapping[str, int], world_size: int
) -> tuple[list[str], list[str]]:
    """Choose `world_size` of the waiting nodes (given in join order) for the round.

    Members of the last round come first (by their old rank), so a round that shrinks keeps the
    nodes whose state is warm; then nodes in the order they joined.

    Returns:
        (selected, left waiting), each in a deterministic order.
    """
    order = {node: i for i, node in enumerate(waiting)}
    ranked = sorted(
        waiting,
        key=lambda node: (0, previous_ranks[node], 0) if node in previous_ranks else (1, 0, order[node]),
    )
    return ranked[:world_size], ranked[world_size:]


def assign_ranks(members: Sequence[NodeInfo], topology: TopologyOrder | None = None) -> list[str]:
    """Order the members of a round; position i gets rank i.

    Without a topology hook ranks are stable: a member of the last round whose old rank still fits
    keeps it, and the free ranks go, lowest first, to the others in their given order, so a
    replacement takes the rank its predecessor left. With a hook, the hook's order decides.

    Raises:
        ValueError: the hook did not return a permutation of the members.
    """
    if topology is not None:
        ordered = topology.order(members)
        if sorted(ordered) != sorted(m.node_id for m in members):
            raise ValueError(f"topology hook {type(topology).__name__} returned {ordered!r}, not a permutation")
        return list(ordered)
    size = len(members)
    slots: list[str | None] = [None] * size
    others: list[str] = []
    for m in members:
        if m.previous_rank is not None and m.previous_rank < size and slots[m.previous_rank] is None:
            slots[m.previous_rank] = m.node_id
        else:
            others.append(m.node_id)
    free = iter(i for i, s in enumerate(slots) if s is None)
    for node in others:
        slots[next(free)] = node
    return [s for s in slots if s is not None]


@attrs.frozen
class WorkerRanks:
    """Where the workers of every node of a round sit among the job's global ranks.

    Attributes:
        first: by node rank, the global rank (``RANK``) of that node's local rank 0.
        world_size: the workers of all nodes together (``WORLD_SIZE``).
    """

    first: tuple[int, ...]
    world_size: int


def worker_ranks(local_world_sizes: Sequence[int]) -> WorkerRanks | None:
    """The global ranks of a round's workers, as torchrun assigns them.

    Each node's workers follow those of the nodes ranked before it (a prefix sum of the local
    world sizes in node-rank order) and the world size is their sum, so nodes may run different
    numbers of workers (``--nproc-per-node``) and ranks stay unique and contiguous from 0.

    Args:
        local_world_sizes: by node rank, the workers each node runs; 0 for a node that did not
            say (a client that predates the field).

    Returns:
        The layout, or None when some node did not say or there is none: its workers cannot
        be placed, and nothing may be guessed.

    Raises:
        ValueError: a size is negative.
    """
    first: list[int] = []
    total = 0
    for node_rank, size in enumerate(local_world_sizes):
        if size < 0:
            raise ValueError(f"the local world size of node rank {node_rank} is negative: {size}")
        first.append(total)
        total += size
    if not first or 0 in local_world_sizes:
        return None
    return WorkerRanks(tuple(first), total)
