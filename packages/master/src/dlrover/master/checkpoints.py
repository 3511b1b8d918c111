"""Which checkpoint step every rank holds, and which steps are committed. Pure: `now` is passed in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from dlrover.common import DLRoverError
from dlrover.master.journal import CheckpointCommit

__all__ = ["MAX_STEPS_PER_RANK", "MAX_WORLD_SIZE", "CheckpointError", "CheckpointReport", "CheckpointTracker"]

MAX_WORLD_SIZE = 1 << 20
MAX_STEPS_PER_RANK = 1024


class CheckpointError(DLRoverError):
    """A report or commit was refused; nothing changed. The message names the bad value."""


@attrs.frozen
class CheckpointReport:
    """The answer to a report.

    Attributes:
        complete_step: the newest step every rank of the world holds, or None.
        newly_complete: steps that became complete with this report, with the seconds since the
            first rank reported them (checkpoint latency).
    """

    complete_step: int | None
    newly_complete: tuple[tuple[int, float], ...] = ()


class CheckpointTracker:
    """Steps held per rank for the current world, and the committed steps.

    A report with a new world size starts over: ranks of another world say nothing about this one.

    Args:
        commits: commits restored from the journal.
    """

    def __init__(self, commits: Sequence[CheckpointCommit] = ()) -> None:
        self._world_size = 0
        self._held: dict[int, frozenset[int]] = {}
        self._first_seen: dict[int, float] = {}
        self._complete: int | None = None
        self._commits = {c.step: c for c in commits}

    @property
    def world_size(self) -> int:
        """The world the current reports belong to (0 before any)."""
        return self._world_size

    @property
    def complete_step(self) -> int | None:
        """The newest step held by every rank, or None."""
        return self._complete

    @property
    def latest_commit(self) -> CheckpointCommit | None:
        """The newest committed checkpoint."""
        return self._commits[max(self._commits)] if self._commits else None

    def held(self) -> dict[int, frozenset[int]]:
        """The steps each rank of the current world reported holding."""
        return dict(self._held)

    def commits(self) -> tuple[CheckpointCommit, ...]:
        """Every committed checkpoint, oldest first."""
        return tuple(self._commits[s] for s in sorted(self._commits))

    def validate(self, world_size: int, ranks: Mapping[int, Iterable[int]]) -> dict[int, frozenset[int]]:
        """The report as sets of steps, or raise naming what is wrong (changes nothing).

        Raises:
            CheckpointError: the world size, a rank or a step is out of range, or no rank is given.
        """
        if not 1 <= world_size <= MAX_WORLD_SIZE:
            raise CheckpointError(f"world_size must be in 1..{MAX_WORLD_SIZE}, got {world_size}")
        if not ranks:
            raise CheckpointError("a report must name at least one rank")
        held: dict[int, frozenset[int]] = {}
        for rank, steps in ranks.items():
            if not 0 <= rank < world_size:
                raise CheckpointError(f"rank {rank} is outside the world of size {world_size}")
            step_list = list(steps)
            if len(step_list) > MAX_STEPS_PER_RANK:
                raise CheckpointError(f"rank {rank} reports {len(step_list)} steps; at most {MAX_STEPS_PER_RANK}")
            bad = [s for s in step_list if s < 0]
            if bad:
                raise CheckpointError(f"rank {rank} reports negative step {bad[0]}")
            held[rank] = frozenset(step_list)
        return held

    def report(self, world_size: int, ranks: Mapping[int, Iterable[int]], now: float) -> CheckpointReport:
        """Ranks report every step they hold; returns the newest step complete everywhere.

        Raises:
            CheckpointError: see `validate`; nothing changed.
        """
        held = self.validate(world_size, ranks)
        if world_size != self._world_size:
            self._world_size = world_size
            self._held = {}
            self._first_seen = {}
            self._complete = None
        self._held.update(held)
        for steps in held.values():
            for step in steps:
                self._first_seen.setdefault(step, now)
        if len(self._held) < world_size:
            return CheckpointReport(self._complete)
        everywhere = frozenset.intersection(*self._held.values())
        newest = max(everywhere) if everywhere else None
        fresh: list[tuple[int, float]] = []
        if newest is not None and (self._complete is None or newest > self._complete):
            fresh = [(s, now - self._first_seen.get(s, now)) for s in sorted(everywhere) if s > (self._complete or -1)]
            self._complete = newest
        # Steps no rank holds any more need no first-seen time.
        alive = frozenset().union(*self._held.values())
        self._first_seen = {s: t for s, t in self._first_seen.items() if s in alive}
        return CheckpointReport(self._complete, tuple(fresh))

    def check_commit(self, step: int) -> None:
        """Raise unless `step` can be committed now.

        Raises:
            CheckpointError: the step is not held by every rank, or is older than the latest commit.
        """
        if step < 0:
            raise CheckpointError(f"step must be non-negative, got {step}")
        if self._world_size == 0 or len(self._held) < self._world_size:
            raise CheckpointError(f"step {step} cannot be committed: not every rank has reported")
        if not all(step in steps for steps in self._held.values()):
            missing = sorted(r for r, steps in self._held.items() if step not in steps)
            raise CheckpointError(f"step {step} is not held by every rank (missing on ranks {missing[:10]})")
        latest = self.latest_commit
        if latest is not None and step < latest.step:
            raise CheckpointError(f"step {step} is older than the committed step {latest.step}")

    def validate_commit(self, step: int, world_size: int) -> None:
        """Raise unless a saver's commit of `step` of `world_size` ranks can be recorded.

        Raises:
            CheckpointError: the step is negative or the world size out of range.
        """
        if step < 0:
            raise CheckpointError(f"step must be non-negative, got {step}")
        if not 1 <= world_size <= MAX_WORLD_SIZE:
            raise CheckpointError(f"world_size must be in 1..{MAX_WORLD_SIZE}, got {world_size}")

    def record(self, commit: CheckpointCommit) -> None:
        """Record a commit a checkpoint saver made itself (checked by `validate_commit`)."""
        self.validate_commit(commit.step, commit.world_size)
        self._commits[commit.step] = commit

    def commit(self, step: int, path: str, wall_time: float) -> CheckpointCommit:
        """Record `step` as committed (idempotent for the same step).

        Raises:
            CheckpointError: see `check_commit`; nothing changed.
        """
        self.check_commit(step)
        commit = CheckpointCommit(step=step, wall_time=wall_time, world_size=self._world_size, path=path)
        self._commits[step] = commit
        return commit
