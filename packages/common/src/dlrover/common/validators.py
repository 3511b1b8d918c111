"""attrs validators for configuration values; each raises `ConfigError` naming the field and value.

NaN fails every check (no comparison with NaN is true), so a NaN never slips into a timeout, and
a bool or a string is refused rather than read as a number.
"""

from __future__ import annotations

from typing import Any

import attrs

from dlrover.common.errors import ConfigError

__all__ = ["non_negative", "port", "positive"]


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


def port(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    """Accept a TCP port number, 0 meaning "any free port"."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(f"{attribute.name} must be in 0..65535, got {value!r}")
