"""attrs validators for configuration values; each raises `ConfigError` naming the field and value.

NaN fails every check (no comparison with NaN is true), so a NaN never slips into a timeout, and
a bool or a string is refused rather than read as a number.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from dlrover.common.errors import ConfigError

__all__ = [
    "non_negative",
    "non_negative_finite",
    "non_negative_int",
    "port",
    "positive",
    "positive_finite",
    "positive_int",
]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def positive(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """Accept only numbers greater than zero."""
    if not _is_number(value) or not value > 0:
        raise ConfigError(f"{attribute.name} must be positive, got {value!r}")


def non_negative(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """Accept zero and positive numbers."""
    if not _is_number(value) or not value >= 0:
        raise ConfigError(f"{attribute.name} must be zero or positive, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    """Accept only integers greater than zero (a count, a size)."""
    if not _is_int(value) or value <= 0:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


def non_negative_int(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    """Accept zero and positive integers (a rank, a budget that may be zero)."""
    if not _is_int(value) or value < 0:
        raise ConfigError(f"{attribute.name} must be a non-negative integer, got {value!r}")


def positive_finite(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """Accept finite numbers greater than zero (where infinity would disable a check by accident)."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def non_negative_finite(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """Accept zero and finite positive numbers (a measurement)."""
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def port(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    """Accept a TCP port number, 0 meaning "any free port"."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(f"{attribute.name} must be in 0..65535, got {value!r}")
