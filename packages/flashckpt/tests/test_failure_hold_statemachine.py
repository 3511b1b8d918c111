"""A state machine over `FailureHold`: a failure persist is held back only while it may be.

Rules move the clock, kill training processes, seal snapshots, ask whether the held persist is due
and release it outright; the model keeps the first and latest death and each rank's newest seal.
Invariants: the hold is released exactly when every rank sealed after the latest death or the
bound ran out, with the step chosen at the first death; one failure is held at a time.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dlrover.flashckpt.saver_core import FailureHold, HeldFailure

RANKS = (0, 1, 2)


class HoldMachine(RuleBasedStateMachine):
    @initialize(hold_s=st.sampled_from([0.5, 5.0, 30.0]))
    def setup(self, hold_s: float) -> None:
        self.hold = FailureHold(hold_s)
        self.hold_s = hold_s
        self.now = 0.0
        self.sealed_at: dict[int, float] = {}
        self.model: tuple[float, float, int | None] | None = None  # (first death, latest death, step)

    @rule(dt=st.floats(min_value=0.0, max_value=20.0, allow_nan=False))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(step=st.none() | st.integers(min_value=0, max_value=100))
    def process_dies(self, step: int | None) -> None:
        started = self.hold.lost(self.now, step)
        if self.model is None:
            assert started == HeldFailure(self.now, self.now, step)
            self.model = (self.now, self.now, step)
        else:
            assert started is None  # the failure already held waits for this death too
            self.model = (self.model[0], self.now, self.model[2])

    @rule(rank=st.sampled_from(RANKS))
    def seal(self, rank: int) -> None:
        self.sealed_at[rank] = self.now

    @rule()
    def ask_if_due(self) -> None:
        result = self.hold.release_if_due(self.now, dict(self.sealed_at), RANKS)
        if self.model is None:
            assert result is None
            return
        first, last, step = self.model
        timed_out = self.now - first >= self.hold_s
        trained = all(self.sealed_at.get(r, float("-inf")) >= last for r in RANKS)
        if timed_out or trained:
            assert result is not None
            held, reason = result
            assert held == HeldFailure(first, last, step)
            assert reason
            self.model = None
        else:
            assert result is None

    @rule()
    def release(self) -> None:
        held = self.hold.release()
        expected = None if self.model is None else HeldFailure(*self.model)
        assert held == expected
        self.model = None

    @invariant()
    def one_failure_held_as_modelled(self) -> None:
        if hasattr(self, "model"):
            assert self.hold.held == (None if self.model is None else HeldFailure(*self.model))


HoldMachine.TestCase.settings = settings(stateful_step_count=40, deadline=None)
TestFailureHold = HoldMachine.TestCase
