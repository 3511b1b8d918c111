"""Budget windows: what a budget keeps of its uses reads as all of them would."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError
from dlrover.diagnosis import BudgetWindow
from dlrover.diagnosis.window import use_times_from_json

times = st.one_of(st.none(), st.floats(0.0, 1000.0))


@given(
    seconds=st.one_of(st.none(), st.sampled_from([1.0, 50.0, 400.0])),
    uses=st.lists(times, max_size=30),
    keep=st.integers(0, 6),
    later=st.floats(0.0, 2000.0),
)
def test_the_kept_uses_count_as_all_of_them_would_up_to_the_limit(
    seconds: float | None, uses: list[float | None], keep: int, later: float
) -> None:
    # Uses come in any order (a wall clock set back by a restarted master), some of unknown time.
    window = BudgetWindow(seconds)
    kept: tuple[float | None, ...] = ()
    for t in uses:
        kept = window.add(kept, t, keep)
    assert len(kept) <= keep
    now = max([later, *(t for t in uses if t is not None)])
    assert min(window.count(kept, now), keep) == min(window.count(uses, now), keep)


def test_a_window_in_words_and_bad_windows() -> None:
    assert BudgetWindow().per() == ""
    assert BudgetWindow(86400.0).per() == " per 24h"
    assert BudgetWindow(600.0).per() == " per 10min"
    assert BudgetWindow(90.5).per() == " per 90.5s"
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1h"):
        with pytest.raises(ConfigError, match="a budget window must be None"):
            BudgetWindow(bad)  # type: ignore[arg-type]
    assert use_times_from_json([1, None, 2.5]) == (1.0, None, 2.5)
    for bad_times in ({"a": 1}, [True], ["1"], [float("inf")]):
        with pytest.raises(ValueError, match="use time"):
            use_times_from_json(bad_times)
