"""Errors the diagnosis package raises on purpose."""

from __future__ import annotations

from dlrover.common import DLRoverError

__all__ = ["DiagnosisError", "RulePluginError", "ProbeError"]


class DiagnosisError(DLRoverError):
    """Base class of errors raised by `dlrover.diagnosis`."""


class RulePluginError(DiagnosisError):
    """A classifier rule from an entry point could not be loaded or is malformed.

    The message names the entry point (``name = module:attr``), the distribution that declared it
    and what went wrong, so the owner of the plugin can fix it.
    """


class ProbeError(DiagnosisError):
    """A node health probe could not run (bad arguments, no torch, a process group that failed)."""
