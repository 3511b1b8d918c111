"""The base of every error DLRover raises on purpose."""

from __future__ import annotations

__all__ = ["ConfigError", "DLRoverError", "AuthError"]


class DLRoverError(Exception):
    """Base class of errors raised by DLRover packages.

    Catching `DLRoverError` catches every failure DLRover reports deliberately, and nothing from
    the libraries underneath it.
    """


class ConfigError(DLRoverError, ValueError):
    """A configuration value is missing, malformed or out of range; the message names it."""


class AuthError(DLRoverError):
    """A token could not be loaded, or a peer presented the wrong one."""
