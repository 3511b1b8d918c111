"""Cross-rank agreement on which in-memory step to load, over torch.distributed.

Each rank has up to `num_slots` complete snapshots in memory; a restart may only load from memory
a step that *every* rank holds, or the ranks would resume from different steps. `common_newest`
is the pure rule; `torch_distributed_agree` gathers every rank's steps with one ``all_gather`` of
a small int64 tensor (no pickle, unlike ``all_gather_object``), and a second one only when some
rank offers more steps than that tensor holds (committed steps in storage can be many).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlrover.common import ConfigError
from dlrover.flashckpt.agree import AgreeFn, agree_single
from dlrover.flashckpt.collectives import RankGroup
from dlrover.flashckpt.job_env import current_dist_state

__all__ = ["common_newest", "default_group_agree", "torch_distributed_agree"]


def common_newest(per_rank: Sequence[Sequence[int]]) -> int | None:
    """The newest step present in every rank's list (None when there is none)."""
    if not per_rank:
        return None
    common = set(per_rank[0])
    for steps in per_rank[1:]:
        common &= set(steps)
    return max(common) if common else None


def torch_distributed_agree(num_slots: int = 2, group: Any = None) -> AgreeFn:
    """An agree function for `FlashCheckpointer` in an initialised torch.distributed job.

    Args:
        num_slots: steps the first gather carries per rank (a longer list costs a second gather).
        group: the process group (default: the world).

    Returns:
        A function every rank must call at the same point (it runs one or two collectives; all
        ranks take the same number, since all see the same gathered lengths).
    """

    def agree(steps: list[int]) -> int | None:
        ranks = RankGroup(group)
        ordered = sorted(set(steps), reverse=True)
        # Element 0 of each row is how many steps that rank has; then its newest ones.
        rows = ranks.gather_ints([len(ordered), *ordered], num_slots + 1)
        longest = max(row[0] for row in rows)
        if longest > num_slots:
            rows = ranks.gather_ints([len(ordered), *ordered], longest + 1)
        return common_newest([[s for s in row[1:] if s >= 0] for row in rows])

    return agree


def default_group_agree(world_size: int, num_slots: int = 2, rank_source: str = "the config") -> AgreeFn:
    """The agreement of a `FlashCheckpointer` given none: a one-rank job agrees with itself; ranks
    of a larger one agree over torch.distributed's default process group.

    The group is looked for when the ranks agree (in `FlashCheckpointer.load`), not when the
    checkpointer is built, so a script may build it before ``init_process_group``.

    Args:
        world_size: the checkpointer's world size.
        num_slots: steps the first gather carries per rank.
        rank_source: where `world_size` came from, for the error message.

    Returns:
        An agree function; with ``world_size > 1`` it raises `ConfigError` when called without an
        initialised default group of exactly `world_size` ranks (before any collective, so
        every rank raises alike).
    """
    if world_size == 1:
        return agree_single
    over_group = torch_distributed_agree(num_slots)

    def agree(steps: list[int]) -> int | None:
        state = current_dist_state()
        if not state.initialized:
            raise ConfigError(
                f"world size {world_size} (from {rank_source}): the ranks agree on the step to load over "
                "torch.distributed's default process group, which is not initialised: call "
                "torch.distributed.init_process_group() before load(), or pass agree="
            )
        if state.world_size != world_size:
            raise ConfigError(
                f"the default process group has {state.world_size} ranks, the checkpointer {world_size} "
                f"(from {rank_source}): build it after init_process_group, or pass world_size= and agree="
            )
        return over_group(steps)

    return agree
