"""Training between interruptions, as step marks the master's goodput accounting reads.

A stretch starts at `ready` (the workers loaded their state) from step `start_step` with `world`
of the job's `full` nodes. The global batch stays the same, so a step of a smaller world takes
`full / world` times as long. Every `save_every` steps a checkpoint save blocks the step for
`save_s`. Marks are few: the first step (the accounting dates an attempt's first interval from its
ready time), the end of the steps that are redone (up to the best step reached before), and the
stretch's end; the accounting treats the time between two marks as evenly spread over their steps.

A straggler in the world slows every step `slowdown` times: the stretch's `step_s` includes it.
When the speed changes while the job trains (a straggler comes or goes), `continued` starts the next
stretch of the same attempt at the end of the last step finished: its marks go on from there.
"""

from __future__ import annotations

import math

import attrs

from dlrover.master.goodput import AttemptReport, StepMark

__all__ = ["Stretch"]


@attrs.define
class Stretch:
    """One stretch of training of one attempt.

    Attributes:
        ready: when training (re)started.
        start_step: the steps done when it started (its state's step).
        step_s: one step's compute at this world size.
        save_every: a blocking save every this many steps (0: none).
        save_s: what one save blocks.
        periodic_save_s: a blocking save every this many seconds of training instead (0: none);
            the step-interval and the time-interval saves are not combined.
        slowdown: how many times as long a step takes as it would without a straggler (`step_s`
            includes it).
    """

    ready: float
    start_step: int
    step_s: float
    save_every: int = 0
    save_s: float = 0.0
    periodic_save_s: float = 0.0
    slowdown: float = 1.0

    def continued(self, t: float, slowdown: float) -> Stretch:
        """The stretch that goes on from the last step finished by `t` at `slowdown` instead (the
        save cadence starts again there: the save that step would have waited for is left out)."""
        n = self.steps_by(t)
        nominal = self.step_s / self.slowdown
        return attrs.evolve(
            self,
            ready=self.end_of(n) if n else self.ready,
            start_step=self.start_step + n,
            step_s=nominal * slowdown,
            slowdown=slowdown,
        )

    def straggled_s(self, steps: int) -> float:
        """What a straggler added to `steps` steps of this stretch."""
        return steps * self.step_s * (1.0 - 1.0 / self.slowdown)

    @property
    def _steps_per_save(self) -> int:
        if self.save_every:
            return self.save_every
        if self.periodic_save_s > 0:
            return max(1, math.ceil(self.periodic_save_s / self.step_s))
        return 0

    def steps_by(self, t: float) -> int:
        """Steps finished by `t` (a save blocks after every `_steps_per_save`-th step)."""
        if t <= self.ready:
            return 0
        per = self._steps_per_save
        if not per:
            return int((t - self.ready) // self.step_s)
        cycle = per * self.step_s + self.save_s
        cycles, rest = divmod(t - self.ready, cycle)
        return int(cycles) * per + min(per, int(rest // self.step_s))

    def end_of(self, n: int) -> float:
        """When the `n`-th step (n >= 1) of the stretch ends: the saves after the steps before it are
        behind it, the one after it (if any) not yet."""
        return self.ready + n * self.step_s + self.saves_in(n) * self.save_s

    def saves_in(self, n: int) -> int:
        """The saves that finished before the `n`-th step ended (n >= 1)."""
        per = self._steps_per_save
        return (n - 1) // per if per else 0

    def last_saved_step(self, t: float) -> int:
        """The newest step whose save had finished by `t` (`start_step` when none)."""
        per = self._steps_per_save
        if not per or t <= self.ready:
            return self.start_step
        cycle = per * self.step_s + self.save_s
        return self.start_step + int((t - self.ready) // cycle) * per

    def marks(self, until: float, best: int, wall0: float) -> tuple[StepMark, ...]:
        """The stretch's marks up to `until`; `best` is the best step reached before it; times in
        wall seconds (`wall0` is the simulation's time 0)."""
        n = self.steps_by(until)
        if n <= 0:
            return ()
        wanted = {1, n}
        redone = best - self.start_step
        if 1 < redone < n:
            wanted.add(redone)
        return tuple(
            StepMark(self.start_step + i, wall0 + self.end_of(i), self.saves_in(i) * self.save_s, 0)
            for i in sorted(wanted)
        )

    def report(
        self,
        node_id: int,
        attempt: int,
        until: float,
        best: int,
        *,
        wall0: float,
        rendezvous: tuple[float, float],
        workers_start: float,
        load_s: float,
    ) -> AttemptReport:
        """Rank 0's attempt report for the stretch up to `until` (simulation seconds in, wall seconds out)."""
        return AttemptReport(
            node_id=node_id,
            attempt=attempt,
            rank=0,
            rendezvous_start=wall0 + rendezvous[0],
            rendezvous_end=wall0 + rendezvous[1],
            workers_start=wall0 + workers_start,
            ready_time=wall0 + self.ready,
            load_s=load_s,
            marks=self.marks(until, best, wall0),
        )
