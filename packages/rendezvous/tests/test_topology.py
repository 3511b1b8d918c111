"""Contract every `TopologyOrder` keeps, run against each implementation, and the ranks it yields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.rendezvous import NodeInfo, SwitchTopology, TopologyOrder, assign_ranks

IMPLEMENTATIONS: list[TopologyOrder] = [SwitchTopology()]

node_lists = st.lists(
    st.builds(
        NodeInfo, node_id=st.text("abcdef", min_size=1, max_size=4), topology_key=st.sampled_from(["s1", "s2", ""])
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda n: n.node_id,
)


@pytest.mark.parametrize("topology", IMPLEMENTATIONS, ids=lambda t: type(t).__name__)
@given(nodes=node_lists, seed=st.randoms())
def test_order_is_a_deterministic_permutation(topology: TopologyOrder, nodes: list[NodeInfo], seed: object) -> None:
    assert isinstance(topology, TopologyOrder)
    shuffled = list(nodes)
    seed.shuffle(shuffled)  # type: ignore[attr-defined]
    ordered = topology.order(nodes)
    assert sorted(ordered) == sorted(n.node_id for n in nodes)
    assert topology.order(shuffled) == ordered


def test_switch_topology_groups_by_switch() -> None:
    nodes = [NodeInfo("b", "s2"), NodeInfo("a", "s2"), NodeInfo("c", "s1")]
    assert SwitchTopology().order(nodes) == ["c", "a", "b"]


def test_a_hook_that_drops_a_node_is_refused() -> None:
    class Broken:
        def order(self, nodes: object) -> list[str]:
            return ["a"]

    with pytest.raises(ValueError, match="not a permutation"):
        assign_ranks([NodeInfo("a"), NodeInfo("b")], Broken())
