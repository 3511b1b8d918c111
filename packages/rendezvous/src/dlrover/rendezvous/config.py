"""Parameters of a rendezvous, validated when built."""

from __future__ import annotations

from typing import Any

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative, positive, positive_finite

__all__ = ["RendezvousConfig", "largest_world_size"]


def _at_least_one(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{attribute.name} must be an integer >= 1, got {value!r}")


def largest_world_size(available: int, max_nodes: int, node_unit: int) -> int:
    """The largest multiple of `node_unit` that is at most `min(available, max_nodes)`."""
    cap = min(available, max_nodes)
    return cap - cap % node_unit if cap > 0 else 0


@attrs.frozen
class RendezvousConfig:
    """How rounds form.

    Attributes:
        min_nodes: the smallest world a round may complete with.
        max_nodes: a round completes at once when this many nodes have joined.
        node_unit: every world size is a multiple of this (nodes sharing a switch, a pipeline stage).
        last_call_s: after the last join, how long to wait for more nodes before closing a round that
            has at least `min_nodes`.
        join_timeout_s: a node that has waited this long without being admitted gets a timeout answer
            and leaves the waiting list.
        planned_wait_s: how long a planned round (`RendezvousManager.expect_round`: the job master
            knows which nodes restart for it) waits for those of its nodes that have not joined yet,
            counted from when it was planned, before the last call closes it without them.
        heartbeat_timeout_s: a node silent (no join, poll or heartbeat) for this long is removed.
        poll_rate_per_s: the polls a second the waiting nodes should send all together: each poll
            answer says when to poll next (`PollResult.retry_after_s`): the number waiting over this
            rate, or a twentieth of how long the node has waited if longer, within
            [`min_poll_interval_s`, `max_poll_interval_s`] and never over a third of
            `heartbeat_timeout_s` (polls keep a waiting node alive). A small job's nodes see a
            completed round within `min_poll_interval_s`; up to `poll_rate_per_s` x
            `max_poll_interval_s` waiting nodes poll at about the rate, more at one poll each per
            `max_poll_interval_s`.
        min_poll_interval_s: the shortest interval a poll answer asks for.
        max_poll_interval_s: the longest (finite).

    Raises:
        ConfigError: a value is out of range, `min_nodes > max_nodes`, `min_poll_interval_s >
            max_poll_interval_s`, or no multiple of `node_unit` lies within [min_nodes, max_nodes].
    """

    min_nodes: int = attrs.field(validator=_at_least_one)
    max_nodes: int = attrs.field(validator=_at_least_one)
    node_unit: int = attrs.field(default=1, validator=_at_least_one)
    last_call_s: float = attrs.field(default=5.0, validator=non_negative)
    join_timeout_s: float = attrs.field(default=600.0, validator=positive)
    planned_wait_s: float = attrs.field(default=60.0, validator=non_negative)
    heartbeat_timeout_s: float = attrs.field(default=30.0, validator=positive)
    poll_rate_per_s: float = attrs.field(default=500.0, validator=positive)
    min_poll_interval_s: float = attrs.field(default=0.05, validator=positive)
    max_poll_interval_s: float = attrs.field(default=5.0, validator=positive_finite)

    def __attrs_post_init__(self) -> None:
        if self.min_nodes > self.max_nodes:
            raise ConfigError(f"min_nodes ({self.min_nodes}) must not exceed max_nodes ({self.max_nodes})")
        if self.min_poll_interval_s > self.max_poll_interval_s:
            raise ConfigError(
                f"min_poll_interval_s ({self.min_poll_interval_s}) must not exceed max_poll_interval_s "
                f"({self.max_poll_interval_s})"
            )
        if largest_world_size(self.max_nodes, self.max_nodes, self.node_unit) < self.min_nodes:
            raise ConfigError(
                f"no multiple of node_unit={self.node_unit} lies within "
                f"[min_nodes={self.min_nodes}, max_nodes={self.max_nodes}]"
            )
