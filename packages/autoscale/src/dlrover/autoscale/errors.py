"""Errors dlrover.autoscale raises on purpose; each message names the bad value."""

from __future__ import annotations

from dlrover.common import DLRoverError

__all__ = [
    "AutoscaleError",
    "InvalidMetricError",
    "InsufficientSamplesError",
    "ProfileStoreError",
    "CorruptProfileStoreError",
    "NewerProfileStoreError",
]


class AutoscaleError(DLRoverError):
    """Base class of the errors raised by dlrover.autoscale."""


class InvalidMetricError(AutoscaleError, ValueError):
    """An observed metric is negative, NaN, infinite or missing; the message names it and its value."""


class InsufficientSamplesError(AutoscaleError, ValueError):
    """There are too few observations to fit a model; the message says how many there are and how many are needed."""


class ProfileStoreError(AutoscaleError):
    """The job profile store holds a row or schema it cannot read; the message names the row or version."""


class CorruptProfileStoreError(ProfileStoreError):
    """The profile store file is not an SQLite database this code can read (corrupt, truncated, or another file)."""


class NewerProfileStoreError(ProfileStoreError):
    """The profile store was written by a newer schema version than this code reads; the message names both."""
