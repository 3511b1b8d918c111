"""The checkpoint tracker: the newest step every rank holds, commits, refusals that change nothing."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dlrover.master.checkpoints import CheckpointError, CheckpointTracker
from dlrover.master.journal import CheckpointCommit


def test_complete_step_is_the_newest_step_held_everywhere() -> None:
    t = CheckpointTracker()
    assert t.report(3, {0: [10, 20], 1: [10, 20]}, 0.0).complete_step is None  # rank 2 silent
    report = t.report(3, {2: [10]}, 1.5)
    assert report.complete_step == 10
    assert report.newly_complete == ((10, 1.5),)
    report = t.report(3, {2: [10, 20]}, 2.0)
    assert report.complete_step == 20
    assert report.newly_complete == ((20, 2.0),)


def test_a_new_world_size_starts_over() -> None:
    t = CheckpointTracker()
    t.report(1, {0: [5]}, 0.0)
    assert t.complete_step == 5
    assert t.report(2, {0: [5]}, 1.0).complete_step is None
    assert t.world_size == 2


def test_bad_reports_name_the_value_and_change_nothing() -> None:
    t = CheckpointTracker()
    t.report(2, {0: [1], 1: [1]}, 0.0)
    before = (t.held(), t.complete_step, t.world_size)
    with pytest.raises(CheckpointError, match="rank 2 is outside the world of size 2"):
        t.report(2, {0: [3], 2: [3]}, 1.0)
    with pytest.raises(CheckpointError, match="negative step -4"):
        t.report(2, {0: [-4]}, 1.0)
    with pytest.raises(CheckpointError, match="world_size must be in"):
        t.report(0, {0: [1]}, 1.0)
    with pytest.raises(CheckpointError, match="at least one rank"):
        t.report(2, {}, 1.0)
    with pytest.raises(CheckpointError, match="at most 1024"):
        t.report(2, {0: range(2000)}, 1.0)
    assert (t.held(), t.complete_step, t.world_size) == before


def test_commit_requires_every_rank_and_never_goes_back() -> None:
    t = CheckpointTracker()
    with pytest.raises(CheckpointError, match="not every rank has reported"):
        t.commit(1, "", 0.0)
    t.report(2, {0: [1, 2], 1: [1]}, 0.0)
    with pytest.raises(CheckpointError, match=r"missing on ranks \[1\]"):
        t.commit(2, "", 0.0)
    assert t.commit(1, "/c/1", 5.0) == CheckpointCommit(1, 5.0, 2, "/c/1")
    t.report(2, {0: [1, 2, 3], 1: [1, 2, 3]}, 1.0)
    t.commit(3, "", 6.0)
    with pytest.raises(CheckpointError, match="older than the committed step 3"):
        t.commit(2, "", 7.0)
    assert [c.step for c in t.commits()] == [1, 3]
    restored = CheckpointTracker(t.commits())
    assert restored.latest_commit == t.latest_commit


class TrackerMachine(RuleBasedStateMachine):
    """Against a model: a dict of rank -> steps; the complete step never decreases within a world."""

    @initialize(world=st.integers(1, 4))
    def setup(self, world: int) -> None:
        self.world = world
        self.tracker = CheckpointTracker()
        self.model: dict[int, set[int]] = {}
        self.best: int | None = None

    @rule(data=st.data())
    def report(self, data: st.DataObject) -> None:
        ranks = data.draw(
            st.dictionaries(st.integers(0, self.world - 1), st.sets(st.integers(0, 12), max_size=4), min_size=1)
        )
        result = self.tracker.report(self.world, ranks, 0.0)
        self.model.update({r: set(s) for r, s in ranks.items()})
        if len(self.model) == self.world:
            common = set.intersection(*self.model.values())
            if common and (self.best is None or max(common) > self.best):
                self.best = max(common)
        assert result.complete_step == self.best

    @rule(step=st.integers(0, 12))
    def commit(self, step: int) -> None:
        complete_everywhere = len(self.model) == self.world and all(step in s for s in self.model.values())
        latest = self.tracker.latest_commit
        allowed = complete_everywhere and (latest is None or step >= latest.step)
        try:
            self.tracker.commit(step, "", 0.0)
        except CheckpointError:
            assert not allowed
        else:
            assert allowed

    @invariant()
    def commits_are_held_steps_in_order(self) -> None:
        steps = [c.step for c in self.tracker.commits()]
        assert steps == sorted(steps)


TrackerMachine.TestCase.settings = settings(TrackerMachine.TestCase.settings, stateful_step_count=20)
TestTracker = TrackerMachine.TestCase
