"""The saver's decisions, kept pure: which step to persist when a training process dies, and when."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

__all__ = [
    "FailureHold",
    "HeldFailure",
    "choose_failure_step",
    "failure_persist_due",
    "newest_common_steps",
    "steps_to_join",
]


def choose_failure_step(
    held: Mapping[int, Collection[int]],
    ranks: Collection[int],
    persisted: Collection[int],
    preferred: int | None = None,
) -> tuple[int | None, str]:
    """The newest step every rank holds complete in memory, unless it is already persisted.

    Args:
        held: for each rank, the steps of its complete snapshots in memory.
        ranks: the ranks that must all hold the step (a step some rank lacks is never persisted,
            so a commit never mixes steps).
        persisted: steps already persisted for all of `ranks` (a step older than one of them is
            not persisted either).
        preferred: the step to persist if every rank still holds it, even when a newer one is
            common: the step chosen when the failure happened (see `HeldFailure`), which the
            other nodes' savers usually choose too (each releases its hold at its own time), so
            their rank files make one complete checkpoint.

    Returns:
        (step, reason), or (None, reason) when there is nothing to do.
    """
    if not ranks:
        return None, "no rank is known to this saver"
    common = newest_common_steps(held, ranks)
    if not common:
        shown = {r: sorted(held.get(r, ())) for r in sorted(ranks)}
        return None, f"no step is complete in memory on every rank (held: {shown})"
    if preferred is not None and preferred in common:
        chosen, why = preferred, f"step {preferred}, the newest step every rank held when the failure happened,"
    else:
        chosen = max(common)
        lost = "" if preferred is None else f" (step {preferred}, chosen at the failure, was overwritten)"
        why = f"step {chosen}, the newest step every one of ranks {sorted(ranks)} holds complete{lost},"
    if chosen in persisted:
        return None, f"{why} is already persisted"
    newer = [s for s in persisted if s > chosen]
    if newer:
        # The tracker never moves back: an older step would only take disk time and space.
        return None, f"{why} is older than step {max(newer)}, already persisted"
    return chosen, f"{why} is persisted"


def steps_to_join(
    uncommitted_done: Mapping[int, Collection[int]],
    ranks: Collection[int],
    held: Mapping[int, Collection[int]],
    persisted: Collection[int],
) -> list[tuple[int, str]]:
    """Steps other nodes' savers persisted that this saver can complete from memory.

    After a failure each node's saver persists the newest step its own ranks hold in common, and
    nodes may differ (one node's processes died before staging step N, the other's after). A step
    then commits only if every node writes it: a saver that sees another node's done markers for
    a step its ranks all still hold in memory writes that step too, so the job commits the newest
    step every rank holds, not nothing.

    Args:
        uncommitted_done: for each step newer than the committed one that has no manifest yet,
            the ranks whose done markers are in storage.
        ranks: this saver's ranks.
        held: for each of them, the steps of its complete snapshots in memory.
        persisted: steps this saver already persisted for all of `ranks`.

    Returns:
        (step, reason) to persist, newest first.
    """
    mine = set(ranks)
    if not mine:
        return []
    common = newest_common_steps(held, mine)
    joins = []
    for step in sorted(uncommitted_done, reverse=True):
        others = sorted(set(uncommitted_done[step]) - mine)
        if not others or step in persisted or step not in common:
            continue
        joins.append((step, f"ranks {others} of other nodes persisted step {step}, which ranks {sorted(mine)} hold"))
    return joins


def newest_common_steps(held: Mapping[int, Collection[int]], ranks: Collection[int]) -> set[int]:
    """The steps every one of `ranks` holds complete (empty when some rank holds none of them)."""
    common: set[int] | None = None
    for rank in sorted(ranks):
        steps = set(held.get(rank, ()))
        common = steps if common is None else common & steps
    return common or set()


@attrs.frozen
class HeldFailure:
    """A failure persist held back while the restarted training processes restore.

    Attributes:
        first_lost_at: when the first process of this failure died (saver clock); the hold
            ends `SaverConfig.failure_persist_hold_s` after it.
        last_lost_at: when the latest one died: the processes train again once every rank has
            sealed a snapshot after it.
        step: the newest step every rank held complete at the first death (None: none), which
            is the step persisted if it is still in memory when the hold ends.
    """

    first_lost_at: float
    last_lost_at: float
    step: int | None


def failure_persist_due(
    held: HeldFailure, now: float, hold_s: float, sealed_at: Mapping[int, float], ranks: Collection[int]
) -> tuple[bool, str]:
    """Whether a held failure persist runs now, and why.

    It runs once every rank has sealed a snapshot since the last death (the restarted processes
    restored and train again, so the persist no longer competes with their restore), or when
    `hold_s` has passed since the first death (processes that do not come back, or that stopped
    checkpointing), whichever comes first.

    Args:
        held: the held failure.
        now: the current time (the clock of `held`).
        hold_s: the longest hold.
        sealed_at: for each rank, when it last sealed a snapshot.
        ranks: the ranks known to the saver.
    """
    waited = now - held.first_lost_at
    if waited >= hold_s:
        return True, f"held for {waited:.1f} s, the longest hold ({hold_s:g} s)"
    if ranks and all(sealed_at.get(r, float("-inf")) >= held.last_lost_at for r in ranks):
        return True, f"every rank sealed a snapshot {waited:.1f} s after the failure: they train again"
    return False, "waiting for every rank to seal a snapshot again"


class FailureHold:
    """Holds back the persist a dead training process triggers (`SaverConfig.failure_persist_hold_s`).

    Pure bookkeeping: the saver calls it under its lock and carries out what it returns. At most
    one failure is held; deaths while it is held extend it (`HeldFailure.last_lost_at`).

    Args:
        hold_s: the longest hold, from the first death.
    """

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.held: HeldFailure | None = None

    def lost(self, now: float, step: int | None) -> HeldFailure | None:
        """A process died at `now`, when `step` was the newest step every rank held.

        Returns:
            The new hold, or None when a failure was held already (it now waits for the ranks to
            seal after `now` too).
        """
        if self.held is None:
            self.held = HeldFailure(now, now, step)
            return self.held
        self.held = attrs.evolve(self.held, last_lost_at=now)
        return None

    def release_if_due(
        self, now: float, sealed_at: Mapping[int, float], ranks: Collection[int]
    ) -> tuple[HeldFailure, str] | None:
        """The held failure and why it runs now (see `failure_persist_due`), or None to wait on."""
        if self.held is None:
            return None
        due, reason = failure_persist_due(self.held, now, self.hold_s, sealed_at, ranks)
        if not due:
            return None
        held, self.held = self.held, None
        return held, reason

    def release(self) -> HeldFailure | None:
        """The held failure, now (the saver stops or persists its newest step anyway), if any."""
        held, self.held = self.held, None
        return held
