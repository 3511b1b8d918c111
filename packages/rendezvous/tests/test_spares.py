"""Spares in the rendezvous (`RendezvousManager.set_spares`): held out of every round and out of the
waiting count until given a rank; unit tests and a hypothesis state machine."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dlrover.rendezvous import InvalidRequestError, PollState, RendezvousConfig, RendezvousManager, UnknownNodeError

pytestmark = pytest.mark.timeout(120)


def _manager(min_nodes: int = 2, max_nodes: int = 2, **kw: float) -> RendezvousManager:
    return RendezvousManager(RendezvousConfig(min_nodes=min_nodes, max_nodes=max_nodes, **kw))


def test_a_spare_waits_outside_every_round_and_is_not_counted_as_waiting() -> None:
    m = _manager(1, 3, last_call_s=1.0, join_timeout_s=5.0)
    m.set_spares(["s"], 0.0)
    m.join("a", 0.0)
    m.join("b", 0.0)
    joined = m.join("s", 0.0)
    assert joined.accepted
    assert "spare" in joined.reason
    assert m.poll("a", 2.0).state is PollState.ASSIGNED
    assert m.current_round is not None
    assert set(m.current_round.members) == {"a", "b"}
    # The round is in force: the spare is not a node waiting to grow it, and no join timeout applies.
    for now in (3.0, 8.0, 30.0):
        polled = m.poll("s", now)
        assert (polled.state, polled.spare) == (PollState.WAITING, True), polled
        assert "is a spare" in polled.reason
        assert m.num_nodes_waiting(now, "a") == 0
        m.heartbeat("a", now)
        m.heartbeat("b", now)
    assert m.waiting == ("s",)
    assert m.waiting_spares == ("s",)


def test_a_spare_given_a_rank_completes_the_round_its_predecessor_left() -> None:
    m = _manager(2, 2)
    m.set_spares(["s"], 0.0)
    for node in ("a", "b", "s"):
        m.join(node, 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    rank_b = m.poll("b", 0.0).rank
    m.leave("b", 1.0)  # b died: the round dissolves
    assert m.num_nodes_waiting(1.0, "a") >= 1
    m.join("a", 1.5)  # a's workers restart and it joins again
    assert m.poll("a", 1.5).state is PollState.WAITING  # still short of two: the spare is not taken
    said = m.set_spares([], 2.0)
    assert "given a rank: s" in said
    assigned = m.poll("s", 2.0)
    assert (assigned.state, assigned.spare, assigned.rank) == (PollState.ASSIGNED, False, rank_b)
    assert m.current_round is not None
    assert set(m.current_round.members) == {"a", "s"}


def test_a_spare_given_a_rank_while_a_round_is_in_force_waits_like_a_late_node() -> None:
    m = _manager(1, 2, last_call_s=0.0)
    m.set_spares(["s"], 0.0)
    m.join("a", 0.0)
    m.join("s", 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    assert m.num_nodes_waiting(1.0, "a") == 0
    m.set_spares([], 1.0)  # a grown job takes the spare: the members see it waiting and start a round
    assert m.num_nodes_waiting(1.0, "a") == 1
    assert m.poll("s", 1.0).state is PollState.WAITING


def test_set_spares_refuses_a_member_and_bad_ids_and_changes_nothing() -> None:
    m = _manager(1, 1)
    m.join("a", 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    with pytest.raises(InvalidRequestError, match="'a' hold a rank in round 1"):
        m.set_spares(["a"], 1.0)
    with pytest.raises(InvalidRequestError, match="node_id"):
        m.set_spares([""], 1.0)
    assert m.spares == frozenset()


def test_a_silent_spare_expires_like_any_node() -> None:
    m = _manager(1, 1, heartbeat_timeout_s=5.0)
    m.set_spares(["s"], 0.0)
    m.join("s", 0.0)
    m.join("a", 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    m.heartbeat("a", 6.0)
    assert m.waiting_spares == ()
    assert m.poll("s", 6.0).state is PollState.NOT_WAITING
    with pytest.raises(UnknownNodeError):
        m.leave("s", 6.0)


class SpareMachine(RuleBasedStateMachine):
    """Nodes join, poll, leave and go quiet; any of them may be made a spare or given a rank. A spare is
    never admitted to a round that forms while it is one, and never counted as waiting."""

    @initialize(
        min_nodes=st.integers(1, 3),
        extra=st.integers(0, 2),
        last_call=st.sampled_from([0.0, 1.0]),
    )
    def start(self, min_nodes: int, extra: int, last_call: float) -> None:
        self.m = _manager(min_nodes, min_nodes + extra, last_call_s=last_call, join_timeout_s=3.0,
                          heartbeat_timeout_s=20.0)  # fmt: skip
        self.now = 0.0
        self.rounds_seen = 0

    def _check_new_round(self) -> None:
        current = self.m.current_round
        if current is not None and current.number > self.rounds_seen:
            self.rounds_seen = current.number
            assert not set(current.members) & self.m.spares, (current.members, self.m.spares)

    @rule(node=st.sampled_from("abcdef"))
    def join(self, node: str) -> None:
        current = self.m.current_round
        if node in self.m.spares and current is not None and current.rank_of(node) is not None:
            return  # a member is never made a spare (below), but it may have been one that was given a rank
        self.m.join(node, self.now)
        self._check_new_round()

    @rule(node=st.sampled_from("abcdef"))
    def poll(self, node: str) -> None:
        result = self.m.poll(node, self.now)
        self._check_new_round()
        if node in self.m.spares and node in self.m.waiting_spares:
            assert (result.state, result.spare) == (PollState.WAITING, True)
        else:
            assert not result.spare

    @rule(node=st.sampled_from("abcdef"))
    def leave(self, node: str) -> None:
        with contextlib.suppress(UnknownNodeError):
            self.m.leave(node, self.now)
        self._check_new_round()

    @rule(spares=st.frozensets(st.sampled_from("abcdef"), max_size=3))
    def set_spares(self, spares: frozenset[str]) -> None:
        current = self.m.current_round
        members = set() if current is None else set(current.members)
        before = self.m.spares
        if spares - before & members:
            with pytest.raises(InvalidRequestError):
                self.m.set_spares(spares, self.now)
            assert self.m.spares == before
            return
        self.m.set_spares(spares, self.now)
        assert self.m.spares == spares
        self._check_new_round()

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.m.expire(self.now)
        self._check_new_round()

    @invariant()
    def spares_are_not_counted_as_waiting(self) -> None:
        if not hasattr(self, "m"):
            return
        waiting = [n for n in self.m.waiting if n not in self.m.spares]
        assert set(self.m.waiting_spares) == set(self.m.waiting) & self.m.spares
        current = self.m.current_round
        if current is None or self.m.accepting:
            assert self.m.num_nodes_waiting(self.now) == len(waiting)
        else:
            # A round in force hears only of the nodes a new round would add (none beyond max_nodes).
            room = max(self.m.config.max_nodes - current.world_size, 0)
            assert self.m.num_nodes_waiting(self.now) == min(len(waiting), room)
        self._check_new_round()


TestSpareMachine = SpareMachine.TestCase
TestSpareMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
