"""The rendezvous manager under every interleaving of joins, polls, heartbeats, leaves, clock
advances and parameter changes, checked against a plain model of who is alive."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule

from dlrover.rendezvous import (
    InvalidRequestError,
    NodeParams,
    PollState,
    RendezvousConfig,
    RendezvousManager,
    UnknownNodeError,
    UnknownRoundError,
    largest_world_size,
)

HEARTBEAT_TIMEOUT_S = 10.0


@st.composite
def configs(draw: st.DrawFn) -> RendezvousConfig:
    unit = draw(st.integers(1, 3))
    max_nodes = draw(st.integers(unit, 6))
    top = max_nodes - max_nodes % unit
    min_nodes = draw(st.integers(1, top))
    return RendezvousConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_unit=unit,
        last_call_s=draw(st.sampled_from([0.0, 1.0, 3.0])),
        join_timeout_s=draw(st.sampled_from([4.0, 50.0])),
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        planned_wait_s=draw(st.sampled_from([0.0, 2.0, 20.0])),
    )


class RendezvousMachine(RuleBasedStateMachine):
    nodes = Bundle("nodes")

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.counter = 0
        # The model: when each node last showed life (as far as the test knows), and who left.
        self.seen: dict[str, float] = {}
        self.departed: set[str] = set()
        self.finished_in: dict[str, int] = {}  # node -> the round it finished in
        # Nodes that expired or left since the last round formed: the rendezvous forgets their
        # ranks, so joining again they are newcomers and need not get their old rank back.
        self.forgotten: set[str] = set()
        self.last_round_number = 0
        self.last_members: tuple[str, ...] | None = None
        self.rounds_checked = 0
        # The round planned last (`expect_round`) less its nodes that left or expired, and until when it waits.
        self.plan: set[str] = set()
        self.plan_until = 0.0
        # Nodes that expired and have not joined since: no plan waits for them.
        self.silent: set[str] = set()

    @initialize(config=configs())
    def start(self, config: RendezvousConfig) -> None:
        self.m = RendezvousManager(config)

    @rule(target=nodes)
    def new_node(self) -> str:
        self.counter += 1
        return f"node-{self.counter}"

    def _alive_before(self, node: str) -> bool:
        return node in self.m.tracked

    @staticmethod
    def _local_world_size(node: str) -> int:
        """Nodes run different numbers of workers (1, 2 or 3), as with uneven --nproc-per-node."""
        return 1 + int(node.rsplit("-", 1)[1]) % 3

    @rule(node=nodes)
    def join(self, node: str) -> None:
        result = self.m.join(node, self.now, local_world_size=self._local_world_size(node))
        assert result.reason
        if result.accepted:
            self.seen[node] = self.now
            self.departed.discard(node)
            self.silent.discard(node)
        self._after_step()

    @rule(node=nodes, delta=st.integers(-1, 1))
    def join_with_disagreeing_params(self, node: str, delta: int) -> None:
        cfg = self.m.config
        before = self._snapshot()
        if cfg.max_nodes + delta < cfg.min_nodes:
            with pytest.raises(InvalidRequestError):
                NodeParams(cfg.min_nodes, cfg.max_nodes + delta)
            return
        params = NodeParams(cfg.min_nodes, cfg.max_nodes + delta)
        result = self.m.join(node, self.now, params=params, local_world_size=self._local_world_size(node))
        if delta != 0:
            assert not result.accepted
            assert "expects" in result.reason
            assert self._snapshot() == before
        else:
            assert result.accepted
            self.seen[node] = self.now
            self.departed.discard(node)
            self.silent.discard(node)
        self._after_step()

    @rule(node=nodes)
    def poll(self, node: str) -> None:
        result = self.m.poll(node, self.now)
        assert result.reason
        if result.state in (PollState.WAITING, PollState.ASSIGNED):
            self.seen[node] = self.now
        if result.state is PollState.ASSIGNED:
            current = self.m.current_round
            assert current is not None
            assert current.members[result.rank] == node
            assert result.world_size == current.world_size
            sizes = [self._local_world_size(n) for n in current.members]
            assert result.first_worker_rank == sum(sizes[: result.rank])
            assert result.worker_world_size == sum(sizes)
        self._after_step()

    @rule(node=nodes)
    def heartbeat(self, node: str) -> None:
        if self.m.heartbeat(node, self.now).known:
            self.seen[node] = self.now
        self._after_step()

    @rule(node=nodes)
    def num_nodes_waiting(self, node: str) -> None:
        tracked = self._alive_before(node)
        assert self.m.num_nodes_waiting(self.now, node) >= len(self.m.waiting)
        if tracked and node in self.m.tracked:
            self.seen[node] = self.now
        self._after_step()

    @rule(node=consumes(nodes))
    def leave(self, node: str) -> None:
        before = self._snapshot()
        in_round = self.m.current_round is not None and self.m.current_round.rank_of(node) is not None
        if node in self.m.waiting or in_round or node in self.m.planned:
            self.m.leave(node, self.now)
            assert node not in self.m.planned
            self.departed.add(node)
            self.forgotten.add(node)
            self.plan.discard(node)
            assert node not in self.m.tracked
        else:
            with pytest.raises(UnknownNodeError):
                self.m.leave(node, self.now)
            assert self._snapshot() == before
        self._after_step()

    @rule(node=nodes)
    def finish(self, node: str) -> None:
        current = self.m.current_round
        if current is not None and current.rank_of(node) is not None:
            assert self.m.finish(node, self.now)
            self.finished_in[node] = current.number
            assert node in self.m.finished
            assert node not in self.m.tracked
            assert node not in self.m.waiting
        else:
            before = self._snapshot()
            with pytest.raises(UnknownNodeError):
                self.m.finish(node, self.now)
            assert self._snapshot() == before
        self._after_step()

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 6.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        finished = set(self.m.finished)
        expired = self.m.expire(self.now)
        self.forgotten.update(expired)
        self.plan.difference_update(expired)
        self.silent.update(expired)
        for node in expired:
            assert self.now - self.seen[node] > HEARTBEAT_TIMEOUT_S
            assert node not in finished  # a finished member's silence never expires it
        self._after_step()

    @rule(config=configs())
    def reconfigure(self, config: RendezvousConfig) -> None:
        self.m.reconfigure(config, self.now)
        self._after_step()

    @rule(picks=st.lists(st.integers(0, 7), max_size=4))
    def plan_a_round(self, picks: list[int]) -> None:
        # Members of the round in force and waiting nodes, as the master plans them, and sometimes
        # a node the rendezvous never saw (a spare that has not joined yet).
        current = self.m.current_round
        known = [*sorted({*(current.members if current is not None else ()), *self.m.waiting}), "node-unseen"]
        self._plan({known[i % len(known)] for i in picks})

    def _plan(self, chosen: set[str]) -> None:
        before = self.m.round_number
        assert self.m.expect_round(chosen, self.now)
        # Planning ticks the clock too: nodes silent since the last step expire first.
        expired = set(self.m._expired)
        self.forgotten.update(expired)
        self.silent.update(expired)
        self.plan = set() if self.m.round_number != before else chosen - self.silent
        self.plan_until = self.now + self.m.config.planned_wait_s
        self._after_step()

    @precondition(lambda self: self.m.current_round is not None)
    @rule(leaving=st.integers(0, 5))
    def plan_a_round_without_one_member_and_one_rejoins(self, leaving: int) -> None:
        # A resize lets one member go: the master plans the others' round, and the first restarts.
        current = self.m.current_round
        assert current is not None
        staying = [n for i, n in enumerate(current.members) if i != leaving % current.world_size]
        self._plan(set(staying))
        if staying:
            self.join(staying[0])

    @rule(number=st.integers(-2, 30))
    def ask_for_a_round(self, number: int) -> None:
        current = self.m.current_round
        if current is not None and current.number == number:
            assert self.m.world(number) is current
        else:
            before = self._snapshot()
            with pytest.raises(UnknownRoundError):
                self.m.world(number)
            assert self._snapshot() == before

    @precondition(lambda self: self.m.current_round is not None)
    @rule()
    def members_restart_and_rejoin(self) -> None:
        current = self.m.current_round
        assert current is not None
        for node in current.members:
            self.join(node)

    @precondition(lambda self: self.m.closed is False)
    @rule()
    def poll_everyone(self) -> None:
        for node in list(self.m.waiting):
            self.poll(node)
        if self.m.waiting:
            # A poll completes any round that is due: nothing due may be left behind.
            assert not self.m.status(self.now).complete, self.m.status(self.now).reason

    def _snapshot(self) -> tuple[object, ...]:
        return (self.m.waiting, self.m.tracked, self.m.current_round, self.m.round_number, self.m.config)

    def _after_step(self) -> None:
        current = self.m.current_round
        if current is None or current.number == self.last_round_number:
            return
        # A new round formed: a rejoining node keeps its rank while membership is unchanged (a
        # node that expired or left in between comes back as a newcomer).
        # A planned round forms before its last node joined only when max_nodes joined or it
        # waited its time out.
        if self.plan:
            joined = set(current.members) | set(self.m.waiting)
            cfg = current.config
            full = current.world_size == largest_world_size(cfg.max_nodes, cfg.max_nodes, cfg.node_unit)
            assert self.plan <= joined or full or self.now >= self.plan_until, (
                self.plan,
                current,
                self.now,
                self.plan_until,
            )
            self.plan = set()
        assert not self.m.planned
        same = self.last_members is not None and set(self.last_members) == set(current.members)
        if same and not self.forgotten & set(current.members):
            assert current.members == self.last_members
            self.rounds_checked += 1
        self.last_members = current.members
        self.forgotten.clear()

    @invariant()
    def ranks_unique_and_contiguous(self) -> None:
        current = self.m.current_round
        if current is None:
            return
        assert len(set(current.members)) == current.world_size
        assert [current.rank_of(n) for n in current.members] == list(range(current.world_size))

    @invariant()
    def worker_ranks_unique_and_contiguous(self) -> None:
        # Every worker of the round gets exactly one global rank, in node-rank order.
        current = self.m.current_round
        if current is None:
            return
        workers = current.workers
        assert workers is not None
        ranks = [workers.first[r] + local for r, size in enumerate(current.local_world_sizes) for local in range(size)]
        assert ranks == list(range(workers.world_size))

    @invariant()
    def world_size_within_bounds_and_a_multiple_of_unit(self) -> None:
        current = self.m.current_round
        if current is None:
            return
        cfg = current.config
        assert cfg.min_nodes <= current.world_size <= cfg.max_nodes
        assert current.world_size % cfg.node_unit == 0

    @invariant()
    def no_round_holds_an_expired_or_departed_node(self) -> None:
        current = self.m.current_round
        if current is None:
            return
        for node in current.members:
            assert node not in self.departed
            if node not in self.m.finished:  # finished members are silent by design
                assert self.now - self.seen[node] <= HEARTBEAT_TIMEOUT_S

    @invariant()
    def tracked_nodes_are_the_waiting_and_the_unfinished_members(self) -> None:
        current = self.m.current_round
        members = set(current.members) if current is not None else set()
        assert self.m.tracked == set(self.m.waiting) | (members - self.m.finished)
        assert self.m.finished <= members

    @invariant()
    def a_finished_member_stays_in_its_round(self) -> None:
        current = self.m.current_round
        for node, number in self.finished_in.items():
            if current is not None and current.number == number and node not in self.m.tracked:
                assert current.rank_of(node) is not None
                assert node in self.m.finished

    @invariant()
    def rounds_only_increase(self) -> None:
        assert self.m.round_number >= self.last_round_number
        current = self.m.current_round
        assert current is None or current.number == self.m.round_number
        self.last_round_number = self.m.round_number

    @invariant()
    def a_full_waiting_list_always_forms_a_round(self) -> None:
        # Late nodes wait while a round is in force; once rendezvous is open, max_nodes forms a round.
        assert self.m.closed or not self.m.accepting or len(self.m.waiting) < self.m.config.max_nodes

    @invariant()
    def the_plan_holds_no_departed_node(self) -> None:
        assert self.m.planned <= self.plan
        assert not self.m.planned & self.departed

    @invariant()
    def waiting_nodes_are_alive_and_not_departed(self) -> None:
        for node in self.m.waiting:
            assert node not in self.departed
            assert self.now - self.seen[node] <= HEARTBEAT_TIMEOUT_S
            assert node in self.m.tracked


RendezvousMachine.TestCase.settings = settings(RendezvousMachine.TestCase.settings, stateful_step_count=40)
TestRendezvousMachine = RendezvousMachine.TestCase
