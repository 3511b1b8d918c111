"""`dlrover.diagnosis.PeerExcuse` on the wire (`HangExcuse` of agent.proto), one conversion each way."""

from __future__ import annotations

from dlrover.diagnosis import PeerExcuse
from dlrover.master.v1 import agent_pb2

__all__ = ["excuse_from_proto", "excuse_to_proto"]


def excuse_to_proto(excuse: PeerExcuse) -> agent_pb2.HangExcuse:
    """The message of `excuse`."""
    return agent_pb2.HangExcuse(began_s_ago=excuse.began_s_ago, remaining_s=excuse.remaining_s, why=excuse.why)


def excuse_from_proto(message: agent_pb2.HangExcuse) -> PeerExcuse:
    """The excuse `message` carries.

    Raises:
        ConfigError: a time that is negative, not finite, or longer than `PeerExcuse` allows.
    """
    return PeerExcuse(began_s_ago=message.began_s_ago, remaining_s=message.remaining_s, why=message.why[:200])
