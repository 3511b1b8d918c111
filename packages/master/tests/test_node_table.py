"""The lifecycle's node table: its counts always equal a scan of its records."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dlrover.master.node_table import NodeTable
from dlrover.master.records import NodeRecord
from dlrover.master.states import ALIVE_STATES, NodeState

pytestmark = pytest.mark.timeout(120)


def _record(node_id: int, state: NodeState, *, spare: bool = False) -> NodeRecord:
    return NodeRecord(node_id=node_id, rank=-1 if spare else node_id, state=state, spare=spare)


def test_counts_follow_the_records_stored() -> None:
    table = NodeTable()
    table[0] = _record(0, NodeState.PENDING)
    table[1] = _record(1, NodeState.RUNNING, spare=True)
    table[2] = _record(2, NodeState.RUNNING)
    assert table.count(NodeState.RUNNING) == 2
    assert table.count(NodeState.RUNNING, spare=False) == 1
    assert table.alive_ranked() == 2
    assert table.alive_spare_ids() == [1]
    table[1] = _record(1, NodeState.FAILED, spare=True)
    table[0] = _record(0, NodeState.SUCCEEDED)
    assert table.alive_spare_ids() == []
    assert table.alive_ranked() == 1
    assert table.counts()[NodeState.SUCCEEDED] == 1
    assert sum(table.counts().values()) == len(table) == 3


def test_a_record_stored_under_another_id_is_refused_and_changes_nothing() -> None:
    table = NodeTable({0: _record(0, NodeState.RUNNING)})
    with pytest.raises(ValueError, match="node 1 stored under id 0"):
        table[0] = _record(1, NodeState.FAILED)
    assert table[0].state is NodeState.RUNNING
    assert table.count(NodeState.RUNNING) == 1


def test_a_copy_is_independent() -> None:
    table = NodeTable({0: _record(0, NodeState.RUNNING, spare=True)})
    saved = table.copy()
    table[0] = _record(0, NodeState.FAILED, spare=True)
    table[1] = _record(1, NodeState.PENDING)
    assert saved.alive_spare_ids() == [0]
    assert saved.count(NodeState.FAILED) == 0
    assert len(saved) == 1
    assert 1 not in saved


class NodeTableMachine(RuleBasedStateMachine):
    """Random stores (new nodes and changed ones) and savepoints: the counts are a scan's."""

    def __init__(self) -> None:
        super().__init__()
        self.table = NodeTable()
        self.saved: tuple[NodeTable, dict[int, NodeRecord]] | None = None

    @rule(node_id=st.integers(0, 12), state=st.sampled_from(NodeState), spare=st.booleans())
    def store(self, node_id: int, state: NodeState, spare: bool) -> None:
        self.table[node_id] = _record(node_id, state, spare=spare)

    @rule()
    def save(self) -> None:
        self.saved = (self.table.copy(), self.table.as_dict())

    @rule()
    def roll_back(self) -> None:
        if self.saved is not None:
            table, records = self.saved
            assert table.as_dict() == records  # stores since did not reach the copy
            self.table = table.copy()

    @invariant()
    def counts_are_a_scan(self) -> None:
        records = list(self.table.values())
        for state in NodeState:
            for spare in (False, True):
                scanned = sum(1 for n in records if n.state is state and n.spare is spare)
                assert self.table.count(state, spare=spare) == scanned
        assert self.table.alive_ranked() == sum(1 for n in records if n.state in ALIVE_STATES and not n.spare)
        assert self.table.alive_spare_ids() == sorted(n.node_id for n in records if n.state in ALIVE_STATES and n.spare)


NodeTableMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestNodeTable = NodeTableMachine.TestCase
