"""Hooks that order the nodes of a completed round, so neighbours in rank are neighbours in the network."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

__all__ = ["NodeInfo", "SwitchTopology", "TopologyOrder"]


@attrs.frozen
class NodeInfo:
    """What the rendezvous knows about a node when it orders a round.

    Attributes:
        node_id: the node's unique id.
        topology_key: where the node sits (a switch or rack name); empty when unknown.
        previous_rank: the node's rank in the last completed round, or None.
    """

    node_id: str
    topology_key: str = ""
    previous_rank: int | None = None


@runtime_checkable
class TopologyOrder(Protocol):
    """Orders the members of a round; position i gets rank i.

    Implementations must be deterministic (the same members in any input order give the same output)
    and return a permutation of the input ids.
    """

    def order(self, nodes: Sequence[NodeInfo]) -> list[str]:
        """Return the node ids of `nodes`, first rank first."""
        ...


class SwitchTopology:
    """Groups nodes by `topology_key` (for example the switch), then by node id within a group.

    Nodes on one switch get consecutive ranks, so ring and tree collectives cross switches least.
    """

    def order(self, nodes: Sequence[NodeInfo]) -> list[str]:
        """Return node ids sorted by (topology_key, node_id)."""
        return [n.node_id for n in sorted(nodes, key=lambda n: (n.topology_key, n.node_id))]
