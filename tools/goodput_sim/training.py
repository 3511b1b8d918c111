"""Training between interruptions, as step marks the master's goodput accounting reads.

A stretch starts at `ready` (the workers loaded their state) from step `start_step` with `world`
of the job's `full` nodes. The global batch stays the same, so a step of a smaller world takes
`full / world` times as long. Every `save_every` steps a checkpoint save blocks the step for
`save_s`. Marks are few: the first step (the accounting dates an attempt's first interval from its
ready time), the end of the steps that are redone (up to the best step reached before), and the
stretch's end; the accounting treats the time between two marks as evenly spread over their steps.

A straggler in the world slows every step `slowdown` times: the stretch's `step_s` includes it.
When the pace changes while the job trains (a straggler comes or goes), `continued` starts the next
stretch of the same attempt at the end of the last step finished (and its save, if one follows it):
its marks, its save cadence and what it has saved go on from there.
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
        unsaved_steps: the steps before `start_step` since the last save (a stretch that continues
            another, see `continued`): the save cadence goes on from there, and until the next save
            the newest saved step is ``start_step - unsaved_steps``.
        saved_s_before: what the saves of the attempt's earlier stretches blocked (its marks go on
            counting from there).
        previous: the stretch this one continues (None: it starts from a loaded state): it says
            what was saved before `ready`.
    """

    ready: float
    start_step: int
    step_s: float
    save_every: int = 0
    save_s: float = 0.0
    periodic_save_s: float = 0.0
    slowdown: float = 1.0
    unsaved_steps: int = 0
    saved_s_before: float = 0.0
    previous: Stretch | None = attrs.field(default=None, eq=False, repr=False)

    def continued(self, t: float, slowdown: float) -> Stretch:
        """The stretch that goes on at `slowdown` from the last step finished by `t` (after its save,
        when one follows it: the step that began before `t` is timed at the new pace)."""
        n = self.steps_by(t)
        per = self._steps_per_save
        done = self.unsaved_steps + n  # the cadence's steps so far
        saving = bool(per) and n > 0 and done % per == 0  # the step is followed by a save: it goes first
        resume = (self.end_of(n) + (self.save_s if saving else 0.0)) if n else self.ready
        nominal = self.step_s / self.slowdown
        following = attrs.evolve(
            self,
            ready=resume,
            start_step=self.start_step + n,
            step_s=nominal * slowdown,
            slowdown=slowdown,
            unsaved_steps=0,
            saved_s_before=self.saved_s_before + (done // per if per else 0) * self.save_s,
            previous=self,
        )
        # A time-interval cadence counts fewer steps at a slower pace: the next save stays at least a step away.
        following.unsaved_steps = min(done % per if per else 0, max(following._steps_per_save - 1, 0))
        return following

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

    @property
    def _origin(self) -> float:
        """Where the cadence's first step would have begun at this pace (`ready` for a fresh stretch)."""
        return self.ready - self.unsaved_steps * self.step_s

    def steps_by(self, t: float) -> int:
        """Steps finished by `t` (a save blocks after every `_steps_per_save`-th step of the cadence)."""
        if t <= self.ready:
            return 0
        per = self._steps_per_save
        if not per:
            return int((t - self.ready) // self.step_s)
        cycle = per * self.step_s + self.save_s
        cycles, rest = divmod(t - self._origin, cycle)
        return int(cycles) * per + min(per, int(rest // self.step_s)) - self.unsaved_steps

    def end_of(self, n: int) -> float:
        """When the `n`-th step (n >= 1) of the stretch ends: the saves after the steps before it are
        behind it, the one after it (if any) not yet."""
        return self._origin + (n + self.unsaved_steps) * self.step_s + self.saves_in(n) * self.save_s

    def saves_in(self, n: int) -> int:
        """The saves of this stretch that finished before its `n`-th step ended (n >= 1)."""
        per = self._steps_per_save
        return (n + self.unsaved_steps - 1) // per if per else 0

    def last_saved_step(self, t: float) -> int:
        """The newest step whose save had finished by `t` (before any: what the stretch started from)."""
        if t < self.ready and self.previous is not None:
            return self.previous.last_saved_step(t)
        per = self._steps_per_save
        saved = self.start_step - self.unsaved_steps
        if not per or t <= self.ready:
            return saved
        cycle = per * self.step_s + self.save_s
        return saved + int((t - self._origin) // cycle) * per

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
            StepMark(
                self.start_step + i, wall0 + self.end_of(i), self.saved_s_before + self.saves_in(i) * self.save_s, 0
            )
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
