"""Errors the rendezvous raises on purpose; each message names the bad value."""

from __future__ import annotations

from dlrover.common import DLRoverError

__all__ = [
    "InvalidRequestError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "StoreFullError",
    "UnknownNodeError",
    "UnknownRoundError",
]


class RendezvousError(DLRoverError):
    """Base class of rendezvous failures."""


class InvalidRequestError(RendezvousError, ValueError):
    """A request is malformed (an empty node id, a negative size, an oversized key); nothing changed."""


class UnknownNodeError(RendezvousError, LookupError):
    """A request names a node that is neither waiting nor in the current round; nothing changed."""


class UnknownRoundError(RendezvousError, LookupError):
    """A request names a round that is not the current one; nothing changed."""


class StoreFullError(RendezvousError):
    """The key-value store holds its maximum number of keys; nothing changed."""


class RendezvousTimeoutError(RendezvousError):
    """A node was not admitted to a round within its time limit."""
