from __future__ import annotations

import math

import attrs
import pytest

from dlrover.common import ConfigError, non_negative, port, positive
from dlrover.common.validators import non_negative_finite, non_negative_int, positive_finite, positive_int


@attrs.frozen
class Settings:
    timeout_s: float = attrs.field(default=1.0, validator=positive)
    grace_s: float = attrs.field(default=0.0, validator=non_negative)
    listen_port: int = attrs.field(default=0, validator=port)
    workers: int = attrs.field(default=1, validator=positive_int)
    rank: int = attrs.field(default=0, validator=non_negative_int)
    factor: float = attrs.field(default=1.0, validator=positive_finite)
    seconds: float = attrs.field(default=0.0, validator=non_negative_finite)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -1.5}, "timeout_s"),
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"timeout_s": True}, "timeout_s"),
        ({"timeout_s": "5"}, "timeout_s"),
        ({"grace_s": -0.1}, "grace_s"),
        ({"grace_s": math.nan}, "grace_s"),
        ({"listen_port": 65536}, "listen_port"),
        ({"listen_port": -1}, "listen_port"),
        ({"listen_port": 80.5}, "listen_port"),
        ({"workers": 0}, "workers must be a positive integer"),
        ({"workers": 2.0}, "workers"),
        ({"workers": True}, "workers"),
        ({"rank": -1}, "rank must be a non-negative integer"),
        ({"rank": "0"}, "rank"),
        ({"factor": math.inf}, "factor must be a finite number > 0"),
        ({"factor": 0.0}, "factor"),
        ({"factor": math.nan}, "factor"),
        ({"seconds": -math.inf}, "seconds must be a finite number >= 0"),
        ({"seconds": math.inf}, "seconds"),
        ({"seconds": False}, "seconds"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_value(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        Settings(**kwargs)  # type: ignore[arg-type]
    assert repr(next(iter(kwargs.values()))) in str(info.value)


def test_good_values_pass() -> None:
    s = Settings(timeout_s=0.001, grace_s=0, listen_port=65535)
    assert s.listen_port == 65535
    assert math.isinf(Settings(timeout_s=math.inf).timeout_s)
    edge = Settings(workers=1, rank=0, factor=1e-9, seconds=0)
    assert (edge.workers, edge.rank, edge.factor, edge.seconds) == (1, 0, 1e-9, 0)
