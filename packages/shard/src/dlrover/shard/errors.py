"""Errors the shard manager raises on bad requests; each maps to one gRPC status code.

A request that raises one of these changed no state: checks run before any mutation.
"""

from __future__ import annotations

from dlrover.common import ConfigError, DLRoverError

__all__ = [
    "ShardError",
    "InvalidShardRequestError",
    "UnknownDatasetError",
    "UnknownShardError",
    "ShardStateError",
]


class ShardError(DLRoverError):
    """Base class of every error the shard package raises about a request."""


class InvalidShardRequestError(ShardError, ConfigError):
    """A request or specification holds a malformed or out-of-range value (INVALID_ARGUMENT)."""


class UnknownDatasetError(ShardError, LookupError):
    """The named dataset is not registered (NOT_FOUND)."""


class UnknownShardError(ShardError, LookupError):
    """The shard id was never created for this dataset (NOT_FOUND)."""


class ShardStateError(ShardError):
    """The request does not fit the current state (FAILED_PRECONDITION).

    Examples: a report for a shard the worker does not hold, a second `done`, a checkpoint of
    another specification.
    """
