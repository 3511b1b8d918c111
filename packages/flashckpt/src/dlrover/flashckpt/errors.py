"""Errors raised by dlrover.flashckpt; each message names the bad value or file."""

from __future__ import annotations

from dlrover.common import DLRoverError

__all__ = [
    "ChecksumError",
    "FlashCkptError",
    "LayoutError",
    "NoCheckpointError",
    "SaverUnavailableError",
    "SlotBusyError",
    "StateStructureError",
    "StorageError",
    "WorldSizeError",
]


class FlashCkptError(DLRoverError):
    """Base class of every error dlrover.flashckpt raises on purpose."""


class StateStructureError(FlashCkptError, ValueError):
    """A state holds an unsupported leaf, or does not match the snapshot it is restored from."""


class LayoutError(FlashCkptError):
    """A shared-memory slot or a checkpoint file does not follow the documented layout."""


class ChecksumError(FlashCkptError):
    """Bytes read back do not match the checksum recorded when they were written."""


class SlotBusyError(FlashCkptError):
    """Both shared-memory slots were busy and the busy policy is `raise`."""


class NoCheckpointError(FlashCkptError):
    """No complete snapshot exists in memory or in storage."""


class StorageError(FlashCkptError):
    """A storage operation failed (full disk, missing file, permission); the message names the path."""


class SaverUnavailableError(FlashCkptError):
    """The node's saver process could not be reached or started."""


class WorldSizeError(FlashCkptError):
    """A checkpoint was saved by a different number of ranks and cannot be resharded here."""
