from __future__ import annotations

import pytest

from dlrover.common import Clock, ManualClock, SystemClock


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(start=10.0, wall_start=1000.0)
    assert clock.now() == 10.0
    assert clock.wall_time() == 1000.0
    assert clock.advance(2.5) == 12.5
    clock.sleep(0.5)
    assert clock.now() == 13.0
    assert clock.wall_time() == 1003.0


def test_manual_clock_refuses_to_go_back() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match=r"advance\(-1"):
        clock.advance(-1)
    assert clock.now() == 0.0


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(ManualClock(), Clock)
    assert isinstance(SystemClock(), Clock)


def test_system_clock_is_monotonic() -> None:
    clock = SystemClock()
    first = clock.now()
    clock.sleep(0)
    assert clock.now() >= first
    assert clock.wall_time() > 1_600_000_000
