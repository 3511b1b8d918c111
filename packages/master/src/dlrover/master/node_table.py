"""Every node incarnation of a job by id, with the counts the lifecycle reads on every call.

The lifecycle asks on nearly every call how many nodes are in a state, whether any ranked node is
still alive, and which spares are alive. Answered by a scan, each of those is O(nodes), and so is
every registration, heartbeat-driven transition and failure: registering 10,000 nodes cost about two
minutes of master CPU (`python tools/goodput_sim cost --nodes 10000`). The table keeps the counts as
records are stored, so those answers cost O(1) (O(spares) for the spares).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView

from dlrover.master.records import NodeRecord
from dlrover.master.states import ALIVE_STATES, NodeState

__all__ = ["NodeTable"]


class NodeTable:
    """Node records by id (records are immutable: storing one is the only change), with counts
    by state and by whether the node is a spare, and the ids of the alive spares.

    Nodes are never removed: a finished incarnation stays, in a terminal state.
    """

    __slots__ = ("_alive_spares", "_by_id", "_counts")

    def __init__(self, records: Mapping[int, NodeRecord] | None = None) -> None:
        self._by_id: dict[int, NodeRecord] = {}
        self._counts: Counter[tuple[NodeState, bool]] = Counter()
        self._alive_spares: set[int] = set()
        for node_id, record in (records or {}).items():
            self[node_id] = record

    def copy(self) -> NodeTable:
        """An independent table holding the same records (a savepoint)."""
        table = NodeTable()
        table._by_id = dict(self._by_id)
        table._counts = Counter(self._counts)
        table._alive_spares = set(self._alive_spares)
        return table

    def __setitem__(self, node_id: int, record: NodeRecord) -> None:
        if record.node_id != node_id:
            raise ValueError(f"node {record.node_id} stored under id {node_id}")
        old = self._by_id.get(node_id)
        if old is not None:
            self._counts[(old.state, old.spare)] -= 1
        self._by_id[node_id] = record
        self._counts[(record.state, record.spare)] += 1
        if record.spare and record.state in ALIVE_STATES:
            self._alive_spares.add(node_id)
        else:
            self._alive_spares.discard(node_id)

    def __getitem__(self, node_id: int) -> NodeRecord:
        return self._by_id[node_id]

    def get(self, node_id: int) -> NodeRecord | None:
        return self._by_id.get(node_id)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def keys(self) -> KeysView[int]:
        return self._by_id.keys()

    def values(self) -> ValuesView[NodeRecord]:
        return self._by_id.values()

    def items(self) -> ItemsView[int, NodeRecord]:
        return self._by_id.items()

    def as_dict(self) -> dict[int, NodeRecord]:
        """The records by id (a copy)."""
        return dict(self._by_id)

    def count(self, state: NodeState, *, spare: bool | None = None) -> int:
        """How many incarnations are in `state`: spares, ranked nodes, or both (None)."""
        if spare is None:
            return self._counts[(state, False)] + self._counts[(state, True)]
        return self._counts[(state, spare)]

    def counts(self) -> dict[NodeState, int]:
        """How many incarnations are in each state (every state present)."""
        return {state: self.count(state) for state in NodeState}

    def alive_ranked(self) -> int:
        """How many ranked nodes (not spares) are pending, starting or running."""
        return sum(self._counts[(state, False)] for state in ALIVE_STATES)

    def alive_spare_ids(self) -> list[int]:
        """The ids of the spares that are pending, starting or running, ascending."""
        return sorted(self._alive_spares)
