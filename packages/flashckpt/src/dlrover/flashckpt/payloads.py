"""Sources of a `RankPayload`: a sealed shared-memory slot, or a state held by this process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dlrover.flashckpt.errors import LayoutError
from dlrover.flashckpt.layout import SlotHeader, SlotState
from dlrover.flashckpt.persist import RankPayload
from dlrover.flashckpt.segment import ShmSegment
from dlrover.flashckpt.slotio import read_checksums, read_manifest

__all__ = ["payload_from_slot", "payload_from_state"]


def payload_from_slot(seg: ShmSegment, header: SlotHeader, rank: int, world_size: int) -> RankPayload:
    """A payload streaming straight from a slot the caller holds (shared lock) while persisting.

    Raises:
        LayoutError: the slot is not complete, or its manifest is corrupt.
    """
    if header.state not in (SlotState.COMPLETE, SlotState.SEALED):
        raise LayoutError(f"slot {seg.path} is {header.state.name}, not complete")
    tree, specs = read_manifest(seg, header)
    crcs = tuple(read_checksums(seg, header)) if header.state is SlotState.SEALED else None

    @contextlib.contextmanager
    def open_tensor(i: int) -> Iterator[memoryview]:
        start = header.data_off + specs[i].offset
        with memoryview(seg.mm) as whole, whole[start : start + specs[i].nbytes] as view:
            yield view

    return RankPayload(header.step, rank, world_size, tree, specs, open_tensor, crcs)


def payload_from_state(step: int, rank: int, world_size: int, state: Any) -> RankPayload:
    """A payload of a state held by this process (a synchronous save, or tests).

    Tensors are made contiguous CPU copies only when they are not already.
    """
    # torch is imported here, not at module level, so the saver process never loads it.
    import torch

    from dlrover.flashckpt.planner import plan_layout
    from dlrover.flashckpt.tree import flatten_state

    flat = flatten_state(state)
    layout = plan_layout(flat, 0)
    tensors = [leaf.tensor.detach().cpu().contiguous() for leaf in flat.leaves]

    @contextlib.contextmanager
    def open_tensor(i: int) -> Iterator[memoryview]:
        t = tensors[i]
        if t.numel() == 0:
            yield memoryview(b"")
            return
        with t.reshape(-1).view(torch.uint8).numpy().data as view:
            yield view

    return RankPayload(step, rank, world_size, flat.tree, layout.specs, open_tensor, None)
