"""The rendezvous manager: the pure state machine of elastic rounds.

Nodes join, poll until a round holds them, heartbeat while they train, and leave. Time comes in as
`now` on every call (monotonic seconds), so tests drive the clock and nothing here reads it. Every
call that names a node counts as a heartbeat from it (but from a member that finished, which is
no longer expected to call), and every call first removes nodes whose heartbeats stopped (and forms
a round that became due), so no thread is needed.

While a round is in force, late nodes wait; a member of the round joining again (its processes
restarted) reopens rendezvous, and the round dissolves when a member leaves or expires. Deciding is
done by the pure functions of `decision.py`; this class only applies what they decide.

Spares (`set_spares`): nodes the caller (the job master) holds in reserve. A spare may join and
poll like any node, but it is never admitted to a round, never counts toward a round's size and is
never reported by `num_nodes_waiting`, so a waiting spare neither breaks nor grows a running
world; it does not time out while it waits. Once the caller gives it a rank (`set_spares` without
it), it is an ordinary waiting node that joined at that moment.

Planned rounds (`expect_round`): when the caller knows which nodes restart for the next round (a
resize let a node go, or a spare takes a failed node's rank), that round forms as soon as all of
them have joined, with no last call, and waits for a slow one up to `planned_wait_s` rather than
close without it and form again when it comes: one restart of every worker instead of two.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import attrs

from dlrover.rendezvous.config import RendezvousConfig, largest_world_size
from dlrover.rendezvous.decision import RoundDecision, assign_ranks, decide_round, select_members
from dlrover.rendezvous.errors import InvalidRequestError, UnknownNodeError, UnknownRoundError
from dlrover.rendezvous.results import (
    MAX_LOCAL_WORLD_SIZE,
    MAX_NODE_ID_CHARS,
    HeartbeatResult,
    JoinResult,
    NodeParams,
    PollResult,
    PollState,
    Round,
    WaitingCount,
)
from dlrover.rendezvous.topology import NodeInfo, TopologyOrder

__all__ = ["RendezvousManager"]


@attrs.define
class _Waiter:
    joined_at: float
    topology_key: str
    local_world_size: int = 0  # the workers it runs; 0: it did not say


def _check_node_id(node_id: object) -> str:
    if not isinstance(node_id, str) or not node_id:
        raise InvalidRequestError(f"node_id must be a non-empty string, got {node_id!r}")
    if len(node_id) > MAX_NODE_ID_CHARS:
        raise InvalidRequestError(f"node_id must have at most {MAX_NODE_ID_CHARS} characters, got {len(node_id)}")
    return node_id


class RendezvousManager:
    """Forms rounds of nodes and assigns each a stable rank.

    Args:
        config: the rendezvous parameters.
        topology: orders the members of each round; ranks are stable (members keep their old rank
            when it fits, newcomers fill the gaps) when None.

    Not thread-safe: a service calls it under one lock.
    """

    def __init__(self, config: RendezvousConfig, topology: TopologyOrder | None = None) -> None:
        self._config = config
        self._topology = topology
        self._waiting: OrderedDict[str, _Waiter] = OrderedDict()
        # Last sign of life of every node the rendezvous tracks (waiting or in the current round),
        # oldest first: expiry pops from the front, so it costs O(expired), not O(nodes).
        self._last_seen: OrderedDict[str, float] = OrderedDict()
        self._current: Round | None = None
        self._round_number = 0
        self._last_ranks: dict[str, int] = {}
        self._last_join_at: float | None = None
        self._dropped: dict[str, str] = {}
        # Members of the current round whose processes finished successfully: they stay in the
        # round but send no more heartbeats, so they never expire (and never dissolve it).
        self._finished: set[str] = set()
        self._closed = False
        # While a round is in force, late nodes wait for its members: only a member joining again
        # (its processes restarted) reopens rendezvous, so late nodes alone never break a running world.
        self._reopened = False
        self._now = float("-inf")
        self._expired: list[str] = []
        # Nodes held in reserve by the caller: they may wait, but no round takes them (see `set_spares`).
        self._spares: frozenset[str] = frozenset()
        # The nodes of a planned round still to form, and until when it waits for them (see `expect_round`).
        self._planned: frozenset[str] = frozenset()
        self._planned_until = float("-inf")
        # Nodes that expired and have not called since: a plan never waits for them.
        self._silent: set[str] = set()
        # Members of the round in force whose processes are being restarted (see
        # `processes_restarting`), and why: not exported, a new master starts without them.
        self._restarting: dict[str, str] = {}

    # -- queries -------------------------------------------------------------------------------

    @property
    def config(self) -> RendezvousConfig:
        """The parameters the next round forms under."""
        return self._config

    @property
    def round_number(self) -> int:
        """The number of the latest completed round (0 before the first)."""
        return self._round_number

    @property
    def current_round(self) -> Round | None:
        """The round in force, or None before the first or after a member departed."""
        return self._current

    @property
    def closed(self) -> bool:
        """Whether the rendezvous is closed."""
        return self._closed

    @property
    def waiting(self) -> tuple[str, ...]:
        """Nodes waiting for the next round, in join order (spares included: see `waiting_spares`)."""
        return tuple(self._waiting)

    @property
    def spares(self) -> frozenset[str]:
        """The nodes held in reserve (see `set_spares`), whether or not they joined yet."""
        return self._spares

    @property
    def waiting_spares(self) -> tuple[str, ...]:
        """Spares that joined and wait to be given a rank, in join order."""
        return tuple(n for n in self._waiting if n in self._spares)

    @property
    def planned(self) -> frozenset[str]:
        """The nodes of the planned round not formed yet (see `expect_round`); empty when none is planned."""
        return self._planned

    @property
    def tracked(self) -> frozenset[str]:
        """Every node whose heartbeats the rendezvous expects: waiting, or in the current round and not finished."""
        return frozenset(self._last_seen)

    def world(self, round_number: int) -> Round:
        """The current round, checked against the number the caller holds.

        Raises:
            UnknownRoundError: `round_number` is not the round in force.
        """
        current = self._current
        if current is None or current.number != round_number:
            held = "none" if current is None else str(current.number)
            raise UnknownRoundError(f"round {round_number!r} is not the current round (current: {held})")
        return current

    @property
    def accepting(self) -> bool:
        """Whether waiting nodes may complete a round: none is in force, or a member joined again."""
        return self._current is None or self._reopened

    def status(self, now: float) -> RoundDecision:
        """What would happen to the waiting nodes at `now`, without changing anything."""
        current = self._current
        if current is not None and not self._reopened:
            waiting = self._count_waiting()
            admissible = self._count_admissible()
            if admissible < waiting:
                why = f"{waiting} node(s) wait for room in a new round"
                if admissible:
                    why = f"{waiting} node(s) wait; {admissible} fit a new round, for which its members join again"
            else:
                why = f"{waiting} node(s) wait for its members to join again"
            return RoundDecision(False, 0, f"round {current.number} is in force with {current.world_size} nodes; {why}")
        planned = self._planned
        return decide_round(
            self._config,
            self._count_waiting(),
            self._last_join_at,
            max(now, self._now),
            awaited=sum(1 for n in planned if n not in self._waiting or n in self._spares),
            planned_until=self._planned_until if planned else None,
        )

    # -- commands ------------------------------------------------------------------------------

    def join(
        self,
        node_id: str,
        now: float,
        *,
        params: NodeParams | None = None,
        topology_key: str = "",
        local_world_size: int = 0,
    ) -> JoinResult:
        """Put a node on the waiting list for the next round.

        A node already waiting stays where it is (a retried join changes nothing but its heartbeat
        and local world size). A member of the current round that joins again (its processes
        restarted) waits for the next round; the others learn it through `num_nodes_waiting`.

        Args:
            node_id: the node's unique id.
            now: the current monotonic time.
            params: the parameters the node expects; rejected when they differ from the config.
            topology_key: where the node sits, for a topology hook.
            local_world_size: the workers the node runs (its ``--nproc-per-node``), so that a
                round places every node's workers among the global ranks (see `worker_ranks`);
                0: it does not say, and no round it is in has a worker layout.

        Returns:
            Whether the node was accepted, the round it waits for, and why.

        Raises:
            InvalidRequestError: the node id, topology key or local world size is malformed;
                nothing changed.
        """
        _check_node_id(node_id)
        if not isinstance(topology_key, str) or len(topology_key) > MAX_NODE_ID_CHARS:
            raise InvalidRequestError(f"topology_key must be a string of at most {MAX_NODE_ID_CHARS} characters")
        if (
            isinstance(local_world_size, bool)
            or not isinstance(local_world_size, int)
            or not 0 <= local_world_size <= MAX_LOCAL_WORLD_SIZE
        ):
            raise InvalidRequestError(
                f"local_world_size must be an integer in 0..{MAX_LOCAL_WORLD_SIZE}, got {local_world_size!r}"
            )
        now = self._tick(now)
        upcoming = self._round_number + 1
        if self._closed:
            return JoinResult(False, upcoming, "the rendezvous is closed; no more rounds form")
        cfg = self._config
        if params is not None and (params.min_nodes, params.max_nodes) != (cfg.min_nodes, cfg.max_nodes):
            return JoinResult(
                False,
                upcoming,
                f"node {node_id!r} expects {params.min_nodes}..{params.max_nodes} nodes but this rendezvous "
                f"runs {cfg.min_nodes}..{cfg.max_nodes}; fix the node's settings",
            )
        if node_id in self._waiting:
            self._waiting[node_id].local_world_size = local_world_size
            self._seen(node_id, now)
            reason = f"already waiting; {self.status(now).reason}"
        else:
            if self._current is not None and self._current.rank_of(node_id) is not None:
                self._reopened = True
            self._waiting[node_id] = _Waiter(
                joined_at=now, topology_key=topology_key, local_world_size=local_world_size
            )
            self._last_join_at = now
            self._dropped.pop(node_id, None)
            self._silent.discard(node_id)
            self._finished.discard(node_id)  # it calls again: tracked like any other node
            self._seen(node_id, now)
            reason = f"waiting for round {upcoming}"
        self._try_complete(now)
        if node_id not in self._waiting:
            return JoinResult(True, self._round_number, f"admitted to round {self._round_number}")
        if node_id in self._spares:
            return JoinResult(True, self._round_number + 1, self._spare_reason(node_id))
        return JoinResult(True, self._round_number + 1, reason)

    def _poll_pace(self, waited_s: float) -> float:
        """When a node that has waited `waited_s` should poll next: together the waiting nodes poll
        about `poll_rate_per_s` times a second, a node that has waited long less often (see
        `RendezvousConfig.poll_rate_per_s`)."""
        return self._pace(len(self._waiting), waited_s / 20.0)

    def _pace(self, asking: int, at_least_s: float = 0.0) -> float:
        """The interval that has `asking` nodes ask together about `poll_rate_per_s` times a second,
        no shorter than `at_least_s`, within [`min_poll_interval_s`, `max_poll_interval_s`] and never
        over a third of the heartbeat timeout (an asking node stays alive)."""
        cfg = self._config
        pace = max(asking / cfg.poll_rate_per_s, at_least_s, cfg.min_poll_interval_s)
        return min(pace, cfg.max_poll_interval_s, cfg.heartbeat_timeout_s / 3.0)

    def poll(self, node_id: str, now: float) -> PollResult:
        """Ask where a node stands; completes the round when the time has come.

        Raises:
            InvalidRequestError: the node id is malformed; nothing changed.
        """
        _check_node_id(node_id)
        now = self._tick(now)
        upcoming = self._round_number + 1
        if node_id in self._waiting:
            if self._closed:
                return PollResult(PollState.CLOSED, upcoming, -1, 0, "the rendezvous is closed; no more rounds form")
            waited = now - self._waiting[node_id].joined_at
            # A spare waits for a rank as long as it is held in reserve: no join timeout.
            if node_id not in self._spares and waited >= self._config.join_timeout_s:
                self._forget(node_id)
                return PollResult(
                    PollState.TIMED_OUT,
                    upcoming,
                    -1,
                    0,
                    f"waited {waited:.1f} s, join_timeout_s is {self._config.join_timeout_s}; "
                    f"{self.status(now).reason}",
                )
            self._seen(node_id, now)
            self._try_complete(now)
        current = self._current
        if node_id in self._waiting:
            spare = node_id in self._spares
            reason = self._spare_reason(node_id) if spare else self.status(now).reason
            pace = self._poll_pace(now - self._waiting[node_id].joined_at)
            return PollResult(PollState.WAITING, self._round_number + 1, -1, 0, reason, spare=spare, retry_after_s=pace)
        if current is not None and (rank := current.rank_of(node_id)) is not None:
            if node_id not in self._finished:  # a finished member is not tracked again
                self._seen(node_id, now)
            workers = current.workers
            return PollResult(
                PollState.ASSIGNED,
                current.number,
                rank,
                current.world_size,
                current.reason,
                first_worker_rank=workers.first[rank] if workers is not None else 0,
                worker_world_size=workers.world_size if workers is not None else 0,
            )
        if self._closed:
            return PollResult(PollState.CLOSED, upcoming, -1, 0, "the rendezvous is closed; no more rounds form")
        why = self._dropped.get(node_id, f"node {node_id!r} is neither waiting nor in the current round")
        return PollResult(PollState.NOT_WAITING, self._round_number + 1, -1, 0, f"{why}; join again")

    def heartbeat(self, node_id: str, now: float) -> HeartbeatResult:
        """Record that a node is alive.

        Raises:
            InvalidRequestError: the node id is malformed; nothing changed.
        """
        _check_node_id(node_id)
        now = self._tick(now)
        if node_id in self.finished:
            return HeartbeatResult(True, f"node {node_id!r} finished; no heartbeats are needed")
        if node_id not in self._last_seen:
            why = self._dropped.get(node_id, f"node {node_id!r} is neither waiting nor in the current round")
            return HeartbeatResult(False, f"{why}; join again")
        self._seen(node_id, now)
        return HeartbeatResult(True, "alive")

    def num_nodes_waiting(self, now: float, node_id: str | None = None) -> int:
        """How many nodes wait for the next round: when non-zero, members should re-rendezvous.

        While a round is in force, only the waiting nodes a new round would admit count: the
        growth to the largest multiple of `node_unit` within `max_nodes`. A node that cannot fit
        (the round is at `max_nodes`, or it is one short of a whole unit) waits without making the
        members restart for a round that would hold the same nodes, again and again.

        When `node_id` names a node whose round was dissolved (a member left or expired), the answer
        is at least 1, so that node restarts too. Naming a node counts as its heartbeat.

        Raises:
            InvalidRequestError: the node id is malformed; nothing changed.
        """
        return self.waiting_check(now, node_id).num_nodes_waiting

    def waiting_check(self, now: float, node_id: str | None = None) -> WaitingCount:
        """`num_nodes_waiting`, and when to ask again: every node the rendezvous knows asks, so
        together they ask about `poll_rate_per_s` times a second (a job of thousands of nodes
        asks each node less often), never more often than `min_poll_interval_s` and never less
        than `max_poll_interval_s` (nor a third of the heartbeat timeout).

        Raises:
            InvalidRequestError: the node id is malformed; nothing changed.
        """
        if node_id is not None:
            _check_node_id(node_id)
        now = self._tick(now)
        count = self._count_admissible()
        if node_id is not None:
            if node_id in self._last_seen:
                self._seen(node_id, now)
            elif node_id in self._dropped:
                count = max(count, 1)
        return WaitingCount(count, self._pace(len(self._last_seen)), self._round_number)

    def processes_restarting(self, node_id: str, why: str, *, round_number: int = 0) -> bool:
        """The processes of `node_id`, a member of the round in force, are being restarted (`why`)
        for a cause of their own (a crash, a planned round, nodes waiting to join; not a collective
        error, which may be a peer's doing): its peers' collectives break before it joins again.
        Remembered for `left_behind` until the next round forms or this one dissolves (the first
        reason given is kept); a node not in the round in force is ignored, and so is a restart of
        `round_number` (0: the round in force) once that round is over (a late announcement must not
        excuse the members of a later round). Returns whether the restart is remembered.

        Raises:
            InvalidRequestError: the node id is malformed; nothing changed.
        """
        _check_node_id(node_id)
        if self._current is None or self._current.rank_of(node_id) is None:
            return False
        if round_number and round_number != self._current.number:
            return False
        self._restarting.setdefault(node_id, why)
        return True

    def left_behind(self, node_id: str) -> str | None:
        """Why `node_id`'s workers still run in a round that is over, or None: its round dissolved
        (another member left or expired), or another member's processes restart for a cause of
        their own (`processes_restarting`), and `node_id` has not joined again. A collective error
        or hang of those workers is then most likely that change's consequence, not a fault of
        their own. A node dropped for its own silence is not left behind, and neither are the
        members of a round another member merely joined again: that member may have restarted
        after a collective error of its own, which a peer's fault can have caused.

        Raises:
            InvalidRequestError: the node id is malformed.
        """
        _check_node_id(node_id)
        if node_id in self._silent or node_id in self._dropped:
            return None if node_id in self._silent else self._dropped[node_id]
        current = self._current
        # Not a member of the round in force, joined again, or its own restart broke the round.
        if current is None or current.rank_of(node_id) is None:
            return None
        if node_id in self._waiting or node_id in self._restarting:
            return None
        if not self._restarting:
            return None
        other, why = next(iter(self._restarting.items()))
        return f"round {current.number}: the processes of node {other!r} restart ({why})"

    def leave(self, node_id: str, now: float) -> str:
        """Take a node out: off the waiting list, out of the current round (which dissolves) and
        out of the planned round (see `expect_round`), which no longer waits for it.

        Returns:
            What happened, in a sentence.

        Raises:
            InvalidRequestError: the node id is malformed; nothing changed.
            UnknownNodeError: the node is neither waiting, in the current round nor planned;
                nothing changed.
        """
        _check_node_id(node_id)
        in_round = self._current is not None and self._current.rank_of(node_id) is not None
        if node_id not in self._waiting and not in_round:
            if node_id not in self._planned:
                raise UnknownNodeError(
                    f"node {node_id!r} cannot leave: it is neither waiting, in the current round "
                    f"({self._held()}) nor planned for the next"
                )
            now = self._tick(now)
            self._planned -= {node_id}
            self._try_complete(now)
            return f"node {node_id!r} left; the planned round no longer waits for it"
        now = self._tick(now)
        what = self._depart(node_id, f"node {node_id!r} left")
        self._try_complete(now)
        return what

    def finish(self, node_id: str, now: float) -> str:
        """A member of the current round finished its work: keep it in the round without heartbeats.

        A node whose training processes succeeded stops calling, and would otherwise expire after
        `heartbeat_timeout_s` and dissolve the round under the members still training, making them
        restart instead of finishing. It stays a member; a later departure or round still removes it.

        Returns:
            What happened, in a sentence.

        Raises:
            InvalidRequestError: the node id is malformed; nothing changed.
            UnknownNodeError: the node is not a member of the current round; nothing changed.
        """
        _check_node_id(node_id)
        current = self._current
        if current is None or current.rank_of(node_id) is None:  # checked before any expiry: nothing changes
            raise UnknownNodeError(f"node {node_id!r} cannot finish: it is not in the current round ({self._held()})")
        now = self._tick(now)
        if self._current is not current:
            return f"round {current.number} ended before node {node_id!r} finished; nothing to keep"
        self._finished.add(node_id)
        self._last_seen.pop(node_id, None)
        if node_id in self._waiting:
            # It had joined again (its processes restarted) and then finished: it waits for nothing,
            # and its join no longer reopens the round unless another member joined again too.
            del self._waiting[node_id]
            self._refresh_last_join()
            self._reopened = any(current.rank_of(n) is not None for n in self._waiting)
            self._try_complete(now)
        return f"node {node_id!r} finished; round {current.number} keeps it without heartbeats"

    @property
    def finished(self) -> frozenset[str]:
        """Members of the current round that finished (see `finish`)."""
        current = self._current
        if current is None:
            return frozenset()
        return frozenset(n for n in self._finished if current.rank_of(n) is not None)

    def expire(self, now: float) -> list[str]:
        """Remove every node silent for longer than `heartbeat_timeout_s`; returns their ids."""
        self._tick(now)
        return self._expired

    def reconfigure(self, config: RendezvousConfig, now: float) -> str:
        """Form the next rounds under new parameters; the current round stays as it is.

        Returns:
            What changed, in a sentence.
        """
        now = self._tick(now)
        old = self._config
        self._config = config
        self._try_complete(now)
        return f"parameters changed from {old.min_nodes}..{old.max_nodes} to {config.min_nodes}..{config.max_nodes}"

    def set_spares(self, node_ids: Iterable[str], now: float) -> str:
        """Hold exactly `node_ids` in reserve from now on (the job master's spare nodes).

        A spare is never admitted to a round nor counted as waiting (see the module docstring); a
        node given a rank is dropped from the set, after which it is an ordinary waiting node that
        joined at `now` (it may complete a round at once). A member of the round in force cannot
        become a spare: it holds a rank.

        Returns:
            What changed, in a sentence.

        Raises:
            InvalidRequestError: a node id is malformed, or names a member of the round in force;
                nothing changed.
        """
        spares = frozenset(_check_node_id(n) for n in node_ids)
        current = self._current
        members = sorted(n for n in spares - self._spares if current is not None and current.rank_of(n) is not None)
        if members:
            raise InvalidRequestError(
                f"node(s) {', '.join(map(repr, members))} hold a rank in round {self._held()} and cannot be spares"
            )
        now = self._tick(now)
        ranked = self._spares - spares
        added = spares - self._spares
        self._spares = spares
        for node_id in self._waiting:
            if node_id in ranked:
                # It waited as a spare: as a ranked node it joins now (the last call counts from here).
                self._waiting[node_id].joined_at = now
        self._refresh_last_join()
        self._try_complete(now)
        parts = []
        if added:
            parts.append(f"held in reserve: {', '.join(sorted(added))}")
        if ranked:
            parts.append(f"given a rank: {', '.join(sorted(ranked))}")
        return "; ".join(parts) or "spares unchanged"

    def expect_round(self, node_ids: Iterable[str], now: float) -> str:
        """Plan the next round for exactly `node_ids`: the caller knows that each of them restarts
        for it (their agents were told, or their collective broke).

        That round forms as soon as every one of them has joined (if they make at least
        `min_nodes`; a node not planned that joins too is taken as usual), without waiting for the
        last call. While one of them has not joined, it waits for it up to `planned_wait_s` from
        now, however long ago the last join was; past that, the last call closes it without the
        missing ones, as any round. A planned node that leaves or expires (or expired before and
        has not called since) is not waited for; a node the rendezvous does not track (the
        members of a dissolved round, until they join again) cannot expire, so a dead one is
        waited for until the caller takes it out (`leave`) or the wait ends. A spare is waited for
        until it is given a rank. Forming any round ends the plan; a new
        call replaces it, and an empty `node_ids` cancels it. The plan is not part of the state a
        master journals: a restarted master's next round forms by the last call.

        Returns:
            What changed, in a sentence.

        Raises:
            InvalidRequestError: a node id is malformed; nothing changed.
        """
        planned = frozenset(_check_node_id(n) for n in node_ids)
        now = self._tick(now)
        before = self._round_number
        self._planned = planned - self._silent
        self._planned_until = now + self._config.planned_wait_s
        self._try_complete(now)
        if not planned:
            return "no round planned"
        names = ", ".join(sorted(planned))
        if self._round_number != before:
            return f"the round planned for {names} formed at once"
        if not self._planned:
            return f"no round planned: {names} expired and did not call since"
        return f"next round planned for {names}; it waits up to {self._config.planned_wait_s:g} s for each of them"

    def close(self, now: float) -> None:
        """Close the rendezvous: joins are refused and waiting nodes learn it on their next poll."""
        self._tick(now)
        self._closed = True

    # -- internals -----------------------------------------------------------------------------

    def _held(self) -> str:
        return "none" if self._current is None else str(self._current.number)

    def _count_waiting(self) -> int:
        if not self._spares:
            return len(self._waiting)
        return sum(1 for n in self._waiting if n not in self._spares)

    def _count_admissible(self) -> int:
        """The waiting nodes the next round would add to the round in force (all of them when none
        is in force, or a member joined again: every member restarts then anyway)."""
        waiting = self._count_waiting()
        current = self._current
        if current is None or self._reopened or not waiting:
            return waiting
        size = current.world_size
        grown = largest_world_size(size + waiting, self._config.max_nodes, self._config.node_unit)
        return max(grown - size, 0)

    def _spare_reason(self, node_id: str) -> str:
        return f"node {node_id!r} is a spare: it waits, outside every round, until it is given a rank"

    def _tick(self, now: float) -> float:
        # Callers on several threads may read the clock in one order and reach the lock in another;
        # time inside the manager never goes back.
        self._now = max(self._now, float(now))
        self._expired = self._expire(self._now)
        # Expiry may have dissolved a round and let the waiting nodes form the next one.
        self._try_complete(self._now)
        return self._now

    def _seen(self, node_id: str, now: float) -> None:
        self._last_seen[node_id] = now
        self._last_seen.move_to_end(node_id)

    def _expire(self, now: float) -> list[str]:
        gone: list[str] = []
        limit = self._config.heartbeat_timeout_s
        while self._last_seen:
            node_id, seen = next(iter(self._last_seen.items()))
            if now - seen <= limit:
                break
            gone.append(node_id)
            why = f"node {node_id!r} sent no heartbeat for {now - seen:.1f} s (limit {limit} s)"
            self._depart(node_id, why)
            # The node may be alive but partitioned: when it calls again it learns why it was dropped.
            self._dropped[node_id] = why
            self._silent.add(node_id)
        return gone

    def _forget(self, node_id: str) -> None:
        self._waiting.pop(node_id, None)
        if self._current is None or self._current.rank_of(node_id) is None:
            self._last_seen.pop(node_id, None)
        self._refresh_last_join()

    def _depart(self, node_id: str, why: str) -> str:
        self._planned -= {node_id}
        self._silent.discard(node_id)
        self._waiting.pop(node_id, None)
        self._last_seen.pop(node_id, None)
        self._last_ranks.pop(node_id, None)
        self._dropped.pop(node_id, None)
        self._refresh_last_join()
        current = self._current
        if current is not None and current.rank_of(node_id) is not None:
            # A round must never hold a departed node: it dissolves, and its other members are told
            # why when they next ask.
            self._current = None
            self._finished.clear()
            self._restarting.clear()
            for member in current.members:
                if member != node_id and member not in self._waiting:
                    self._dropped[member] = f"round {current.number} dissolved: {why}"
                    self._last_seen.pop(member, None)
            return f"{why}; round {current.number} dissolved"
        return why

    def _refresh_last_join(self) -> None:
        self._last_join_at = max((w.joined_at for n, w in self._waiting.items() if n not in self._spares), default=None)

    def _try_complete(self, now: float) -> None:
        # Cheap checks first: this runs on every call, and building a decision formats its reason.
        if self._closed or not self._waiting or not self.accepting:
            return
        decision = self.status(now)
        if not decision.complete:
            return
        candidates = [n for n in self._waiting if n not in self._spares]
        selected, _rest = select_members(candidates, self._last_ranks, decision.world_size)
        infos = [
            NodeInfo(node_id=n, topology_key=self._waiting[n].topology_key, previous_rank=self._last_ranks.get(n))
            for n in selected
        ]
        members = tuple(assign_ranks(infos, self._topology))
        previous = self._current
        self._round_number += 1
        sizes = tuple(self._waiting[node].local_world_size for node in members)
        self._current = Round(self._round_number, members, now, self._config, decision.reason, sizes)
        self._restarting.clear()
        self._reopened = False
        self._planned = frozenset()
        self._finished.clear()
        self._last_ranks = {node: rank for rank, node in enumerate(members)}
        for node in members:
            del self._waiting[node]
        if previous is not None:
            member_set = set(members)
            for node in previous.members:
                if node not in member_set and node not in self._waiting:
                    self._dropped[node] = f"round {self._round_number} formed without node {node!r}"
                    self._last_seen.pop(node, None)
        self._refresh_last_join()
