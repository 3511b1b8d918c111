"""The master's relay of hang excuses between nodes (`PeerExcuses`): unit tests and a state machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dlrover.common import ConfigError
from dlrover.diagnosis import PeerExcuse
from dlrover.master.peer_excuses import MAX_RELAYED, PeerExcuses

pytestmark = pytest.mark.timeout(120)


def test_a_node_gets_the_others_excuses_earliest_begun_first_never_its_own() -> None:
    excuses = PeerExcuses(stale_after_s=30.0)
    excuses.observe(1, [PeerExcuse(10.0, 100.0, "rank 0 in phase 'eval'")], now=1000.0)
    excuses.observe(2, [PeerExcuse(2.0, 500.0, "rank 8 in phase 'checkpoint'")], now=1000.0)
    assert excuses.for_node(1, 1005.0) == (PeerExcuse(7.0, 495.0, "rank 8 in phase 'checkpoint'"),)
    assert excuses.for_node(2, 1005.0) == (PeerExcuse(15.0, 95.0, "rank 0 in phase 'eval'"),)
    assert excuses.for_node(3, 1005.0) == (
        PeerExcuse(15.0, 95.0, "rank 0 in phase 'eval'"),
        PeerExcuse(7.0, 495.0, "rank 8 in phase 'checkpoint'"),
    )


def test_at_most_the_earliest_begun_excuses_go_with_one_answer() -> None:
    excuses = PeerExcuses()
    for node in range(MAX_RELAYED + 4):
        excuses.observe(node, [PeerExcuse(float(node), 100.0, f"node {node}")], now=0.0)
    sent = excuses.for_node(99, 0.0)
    assert [e.why for e in sent] == [f"node {n}" for n in reversed(range(4, MAX_RELAYED + 4))]


def test_an_excuse_ends_when_it_runs_out_its_node_says_none_goes_silent_or_leaves() -> None:
    excuses = PeerExcuses(stale_after_s=30.0)
    excuses.observe(1, [PeerExcuse(0.0, 20.0)], now=0.0)
    assert excuses.for_node(2, 19.0) != ()
    assert excuses.for_node(2, 20.0) == ()  # ran out
    excuses.observe(1, [PeerExcuse(0.0, 100.0)], now=30.0)
    assert excuses.for_node(2, 60.0) != ()  # heard 30 s ago: not yet stale
    assert excuses.for_node(2, 60.5) == ()  # its node went silent
    excuses.observe(1, [PeerExcuse(0.0, 100.0)], now=70.0)
    excuses.observe(1, [], now=71.0)  # its ranks train again
    assert excuses.for_node(2, 72.0) == ()
    excuses.observe(1, [PeerExcuse(0.0, 100.0)], now=80.0)
    excuses.forget(1)  # it failed or left
    assert excuses.for_node(2, 81.0) == ()


def test_each_of_a_nodes_excuses_lasts_its_own_time() -> None:
    excuses = PeerExcuses()
    checkpoint, evaluation = PeerExcuse(0.0, 10.0, "rank 0 in phase 'checkpoint'"), PeerExcuse(0.0, 50.0, "rank 1")
    excuses.observe(1, [checkpoint, evaluation], now=0.0)
    # Begun together: the longer lasting first.
    assert excuses.for_node(2, 5.0) == (PeerExcuse(5.0, 45.0, "rank 1"), PeerExcuse(5.0, 5.0, checkpoint.why))
    assert excuses.for_node(2, 10.0) == (PeerExcuse(10.0, 40.0, "rank 1"),)  # the second goes on


def test_a_bad_staleness_is_refused() -> None:
    with pytest.raises(ConfigError, match="stale_after_s"):
        PeerExcuses(stale_after_s=0.0)


class RelayMachine(RuleBasedStateMachine):
    """Random heartbeats, silences and departures of four nodes against a model: a node is only ever sent a
    lasting excuse of another node, heard within the staleness, and the earliest begun of those."""

    STALE_S = 30.0

    def __init__(self) -> None:
        super().__init__()
        self.excuses = PeerExcuses(stale_after_s=self.STALE_S)
        self.now = 0.0
        self.model: dict[int, tuple[float, float, float]] = {}  # node -> (began, until, heard) of its one excuse

    @rule(dt=st.floats(0.0, 40.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(
        node=st.integers(0, 3),
        began_ago=st.floats(0.0, 1000.0),
        remaining=st.floats(0.0, 1000.0),
    )
    def heartbeat_with_an_excuse(self, node: int, began_ago: float, remaining: float) -> None:
        self.excuses.observe(node, [PeerExcuse(began_ago, remaining, f"node {node}")], self.now)
        self.model[node] = (self.now - began_ago, self.now + remaining, self.now)

    @rule(node=st.integers(0, 3))
    def heartbeat_without_one(self, node: int) -> None:
        self.excuses.observe(node, [], self.now)
        self.model.pop(node, None)

    @rule(node=st.integers(0, 3))
    def node_leaves(self, node: int) -> None:
        self.excuses.forget(node)
        self.model.pop(node, None)

    @invariant()
    def each_node_gets_the_lasting_excuses_of_the_others_earliest_begun_first(self) -> None:
        for node in range(4):
            lasting = {
                f"node {other}": (began, until)
                for other, (began, until, heard) in self.model.items()
                if other != node and self.now < until and self.now - heard <= self.STALE_S and began <= self.now
            }
            got = self.excuses.for_node(node, self.now)
            assert sorted(e.why for e in got) == sorted(lasting)
            for excuse in got:
                began, until = lasting[excuse.why]
                assert excuse.began_s_ago == pytest.approx(self.now - began)
                assert excuse.remaining_s == pytest.approx(until - self.now)
                assert excuse.remaining_s > 0
            assert [e.began_s_ago for e in got] == sorted((e.began_s_ago for e in got), reverse=True)


RelayMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_relay_machine = RelayMachine.TestCase
