"""The contract of a cross-rank agreement on which step to load, and the one-rank agreement.

Collective agreements over torch.distributed live in `dlrover.flashckpt.dist`.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["AgreeFn", "agree_single"]

AgreeFn = Callable[[list[int]], int | None]
"""Given this rank's steps (any number of them), return the newest step in every rank's list (or None).

Called at the same points on every rank: with the steps in memory, with the committed steps in
storage, and with small outcome codes (see `FlashCheckpointer.load`)."""


def agree_single(steps: list[int]) -> int | None:
    """The agreement of a one-rank job: its newest step."""
    return max(steps) if steps else None
