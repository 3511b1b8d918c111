"""Which slot the next snapshot goes into, and what to do when none is free. Pure.

The rule that makes double buffering safe: never write over the newest complete snapshot. A
snapshot goes into another slot, preferring one that holds nothing useful (empty or a write
that never finished), then the oldest complete one. A slot is busy while another party holds it
(the saver persisting it, a reader loading it, this process still sealing it).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from dlrover.flashckpt.layout import SlotState

__all__ = ["BusyAction", "BusyPolicy", "SlotChoice", "SlotView", "decide_busy", "newest_complete", "rank_slots"]


@attrs.frozen
class SlotView:
    """What the chooser needs to know about one slot."""

    index: int
    state: SlotState
    seq: int
    step: int


@attrs.frozen
class SlotChoice:
    """Slots to try, in order, and why."""

    candidates: tuple[int, ...]
    reason: str


def newest_complete(slots: Sequence[SlotView]) -> SlotView | None:
    """The complete (or sealed) slot with the highest sequence number, if any."""
    done = [s for s in slots if s.state in (SlotState.COMPLETE, SlotState.SEALED)]
    return max(done, key=lambda s: s.seq) if done else None


def rank_slots(slots: Sequence[SlotView]) -> SlotChoice:
    """Order the slots a new snapshot may be written into.

    Returns:
        Every slot except the newest complete one: empty or unfinished slots first, then complete
        ones oldest first. The reason names the protected snapshot.
    """
    newest = newest_complete(slots)
    others = [s for s in slots if newest is None or s.index != newest.index]
    useless = [s for s in others if s.state in (SlotState.EMPTY, SlotState.WRITING)]
    older = sorted((s for s in others if s not in useless), key=lambda s: s.seq)
    order = tuple(s.index for s in [*useless, *older])
    if newest is None:
        return SlotChoice(order, "no complete snapshot in memory; any slot may be written")
    return SlotChoice(order, f"slot {newest.index} holds the newest snapshot (step {newest.step}) and is kept")


class BusyPolicy(enum.Enum):
    """What `save` does when every candidate slot is busy."""

    WAIT = "wait"  # wait up to a bound, then skip with a recorded event
    SKIP = "skip"  # skip at once with a recorded event
    RAISE = "raise"  # raise SlotBusyError


class BusyAction(enum.Enum):
    """The decision for one busy moment."""

    RETRY = "retry"
    SKIP = "skip"
    RAISE = "raise"


def decide_busy(policy: BusyPolicy, waited_s: float, timeout_s: float) -> tuple[BusyAction, str]:
    """Decide what to do when no slot is free after waiting `waited_s` seconds.

    Returns:
        The action and a reason for the event log.
    """
    if policy is BusyPolicy.RAISE:
        return BusyAction.RAISE, "both slots are busy and the busy policy is 'raise'"
    if policy is BusyPolicy.SKIP:
        return BusyAction.SKIP, "both slots are busy and the busy policy is 'skip'"
    if waited_s < timeout_s:
        return BusyAction.RETRY, f"both slots are busy; waited {waited_s:.3f}s of {timeout_s:.3f}s"
    return BusyAction.SKIP, f"both slots stayed busy for {waited_s:.3f}s (limit {timeout_s:.3f}s); snapshot skipped"
