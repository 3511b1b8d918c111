"""Checks shared by every observed metric and configuration value.

Observations arrive from agents and schedulers we do not control, so each value is checked where it enters the
core and rejected with its name and value instead of turning into a NaN deep inside a fit or a solver model.
"""

from __future__ import annotations

import math
from typing import Any

from dlrover.autoscale.errors import InvalidMetricError
from dlrover.common import ConfigError

__all__ = [
    "check_metric",
    "check_count",
    "check_positive",
    "non_negative_number",
    "positive_number",
    "non_negative_int",
    "positive_int",
    "at_least_one",
    "fraction",
]


def check_metric(name: str, value: object) -> float:
    """Return `value` as a float when it is a finite number >= 0.

    Raises:
        InvalidMetricError: if `value` is missing, not a number, NaN, infinite or negative.
    """
    if value is None:
        raise InvalidMetricError(f"{name} is missing (got None)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidMetricError(f"{name} must be a number, got {value!r}")
    f = float(value)
    if math.isnan(f):
        raise InvalidMetricError(f"{name} is NaN")
    if math.isinf(f):
        raise InvalidMetricError(f"{name} must be finite, got {f!r}")
    if f < 0:
        raise InvalidMetricError(f"{name} must be >= 0, got {f!r}")
    return f


def check_positive(name: str, value: object) -> float:
    """Like `check_metric`, but the value must also be > 0.

    Raises:
        InvalidMetricError: if `value` is not a finite number > 0.
    """
    f = check_metric(name, value)
    if f <= 0:
        raise InvalidMetricError(f"{name} must be > 0, got {f!r}")
    return f


def check_count(name: str, value: object, minimum: int = 0) -> int:
    """Return `value` when it is an int >= `minimum`.

    Raises:
        InvalidMetricError: if `value` is missing, not an int, or below `minimum`.
    """
    if value is None:
        raise InvalidMetricError(f"{name} is missing (got None)")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMetricError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidMetricError(f"{name} must be >= {minimum}, got {value!r}")
    return value


# attrs validators for configuration classes: a bad configuration is the caller's mistake, so these raise
# ConfigError, where observed metrics above raise InvalidMetricError.


def non_negative_number(_inst: object, attribute: Any, value: Any) -> None:
    """attrs validator: a finite int or float >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ConfigError(f"{attribute.name} must be a finite number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0, got {value!r}")


def positive_number(_inst: object, attribute: Any, value: Any) -> None:
    """attrs validator: a finite int or float > 0."""
    non_negative_number(_inst, attribute, value)
    if value == 0:
        raise ConfigError(f"{attribute.name} must be > 0, got {value!r}")


def non_negative_int(_inst: object, attribute: Any, value: Any) -> None:
    """attrs validator: an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{attribute.name} must be an integer, got {value!r}")
    if value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0, got {value!r}")


def positive_int(_inst: object, attribute: Any, value: Any) -> None:
    """attrs validator: an int >= 1."""
    non_negative_int(_inst, attribute, value)
    if value == 0:
        raise ConfigError(f"{attribute.name} must be >= 1, got 0")


def at_least_one(_inst: object, attribute: Any, value: Any) -> None:
    """attrs validator: a finite number >= 1 (growth factors)."""
    non_negative_number(_inst, attribute, value)
    if value < 1:
        raise ConfigError(f"{attribute.name} must be >= 1, got {value!r}")


def fraction(_inst: object, attribute: Any, value: Any) -> None:
    """attrs validator: a finite number in (0, 1]."""
    non_negative_number(_inst, attribute, value)
    if not 0 < value <= 1:
        raise ConfigError(f"{attribute.name} must be in (0, 1], got {value!r}")
