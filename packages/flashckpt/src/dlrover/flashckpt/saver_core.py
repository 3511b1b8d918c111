"""The saver's decisions, kept pure: which step to persist when a training process dies."""

from __future__ import annotations

from collections.abc import Collection, Mapping

__all__ = ["choose_failure_step"]


def choose_failure_step(
    held: Mapping[int, Collection[int]], ranks: Collection[int], persisted: Collection[int]
) -> tuple[int | None, str]:
    """The newest step every rank holds complete in memory, unless it is already persisted.

    Args:
        held: for each rank, the steps of its complete snapshots in memory.
        ranks: the ranks that must all hold the step (a step some rank lacks is never persisted,
            so a commit never mixes steps).
        persisted: steps already persisted for all of `ranks`.

    Returns:
        (step, reason), or (None, reason) when there is nothing to do.
    """
    if not ranks:
        return None, "no rank is known to this saver"
    common: set[int] | None = None
    for rank in sorted(ranks):
        steps = set(held.get(rank, ()))
        common = steps if common is None else common & steps
    if not common:
        shown = {r: sorted(held.get(r, ())) for r in sorted(ranks)}
        return None, f"no step is complete in memory on every rank (held: {shown})"
    newest = max(common)
    if newest in persisted:
        return None, f"step {newest}, the newest held by every rank, is already persisted"
    return newest, f"step {newest} is the newest step every one of ranks {sorted(ranks)} holds complete"
