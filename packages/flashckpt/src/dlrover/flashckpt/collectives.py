"""The few collectives the sharded checkpointer needs, over a process group of its own.

Everything crosses as int64 or uint8 tensors (never ``all_gather_object``, which pickles). A
process without an initialised process group is a group of one rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["RankGroup"]


class RankGroup:
    """The checkpointer's collectives; a single rank when no process group is up.

    Args:
        group: the process group (None: the default group).
    """

    def __init__(self, group: Any) -> None:
        self.active = dist.is_available() and dist.is_initialized()
        self.group = group
        self.rank = dist.get_rank(group) if self.active else 0
        self.size = dist.get_world_size(group) if self.active else 1
        nccl = self.active and dist.get_backend(group) == "nccl"
        # NCCL only moves CUDA tensors; gloo and others take CPU ones.
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def gather_ints(self, values: Sequence[int], width: int) -> list[list[int]]:
        """Every rank's `values` (at most `width`, padded with -1), by rank; no pickle."""
        local = torch.full((width,), -1, dtype=torch.int64, device=self.device)
        if values:
            local[: len(values)] = torch.tensor(list(values)[:width], dtype=torch.int64, device=self.device)
        if not self.active:
            return [local.tolist()]
        out = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(out, local, group=self.group)
        return [t.tolist() for t in out]

    def _global(self, group_rank: int) -> int:
        return dist.get_global_rank(self.group, group_rank) if self.group is not None else group_rank

    def broadcast_int(self, value: int, src: int = 0) -> int:
        """Group rank `src`'s `value` on every rank."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=self._global(src), group=self.group)
        return int(t.item())

    def broadcast_bytes(self, data: bytes, src: int) -> bytes:
        """Group rank `src`'s `data` on every rank (others pass anything); no pickle."""
        if not self.active:
            return data
        size = self.broadcast_int(len(data), src)
        buf = torch.zeros(max(size, 1), dtype=torch.uint8)
        if self.rank == src and data:
            buf[:size] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        buf = buf.to(self.device)
        dist.broadcast(buf, src=self._global(src), group=self.group)
        return buf[:size].cpu().numpy().tobytes()

    def broadcast_into(self, tensor: torch.Tensor, src: int) -> None:
        """Overwrite `tensor` (contiguous, on `device`) with group rank `src`'s, byte for byte.

        Moved as bytes, so every dtype crosses whatever the backend supports.
        """
        if self.active and tensor.numel() > 0:
            dist.broadcast(tensor.reshape(-1).view(torch.uint8), src=self._global(src), group=self.group)

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, by rank; no pickle (the lengths, then the padded bytes)."""
        if not self.active:
            return [data]
        sizes = [r[0] for r in self.gather_ints([len(data)], 1)]
        local = torch.zeros(max(*sizes, 1), dtype=torch.uint8)
        if data:
            local[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        local = local.to(self.device)
        out = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(out, local, group=self.group)
        return [t[:n].cpu().numpy().tobytes() for t, n in zip(out, sizes, strict=True)]

    def barrier(self) -> None:
        """Wait for every rank of the group."""
        if self.active:
            dist.barrier(group=self.group)
