"""Acknowledgements that a group of trainers exchanges with a collective instead of one call per
trainer and step (internal to `ShardSampler` with a process group).

Every trainer of the group calls `ShardSampler.state_dict` at the same steps (as DDP trainers save
together). Each call is a *round*. In a round a trainer first syncs with the service when one is
due (every `sync_every` rounds: its own acknowledgements not yet reported, a read of the data
position and, when it needs one, its next shard leased, one call), then all-gathers the
acknowledgements the group made since the last round. The data position it returns is the
position read at the last sync plus the group's acknowledgements since the sync before it:

* a sync in round s reads the position after every trainer's sync of the previous sync round p
  (each ended before its trainer joined round p's all-gather, which this trainer passed), and a
  trainer reports at a sync everything it acknowledged up to then, so the read holds every
  acknowledgement of rounds up to p;
* it holds none made after round s: a trainer acknowledges the next step only after round s's
  all-gather, which this trainer joins only after its read;
* so the read plus the exchanged acknowledgements of rounds p+1 .. now is exactly what the group
  acknowledged up to now, whatever the order in which the trainers' calls reached the service.
  Positions are absolute, so one the read already holds changes nothing.

A restore applies them (`dlrover.shard.acknowledged`). Every trainer keeps the same exchanged
acknowledgements, so any trainer's copy of the state restores the group (a checkpoint replicated
across nodes).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dlrover.common import ConfigError

_CAPACITY = 8  # acknowledgements per trainer that the round's one all-gather carries; more take a second


class GroupAcks:
    """One trainer's side of the exchange.

    Args:
        group: the process group of the trainers that save together (their data-parallel group).
        sync_every: rounds between two syncs with the service.
    """

    def __init__(self, group: Any, sync_every: int) -> None:
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ConfigError(f"sync_every must be a positive integer, got {sync_every!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("a ShardSampler with a process group needs torch.distributed initialized")
        self._group = group
        self.size = dist.get_world_size(group)
        # The collective runs where the group's backend runs it: NCCL reduces CUDA tensors only.
        backend = str(dist.get_backend(group)).lower()
        self._device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
        self.sync_every = sync_every
        self.reset()

    def reset(self) -> None:
        """Forget everything (a restore moved the data position): the next round syncs."""
        self._round: dict[int, tuple[int, bool]] = {}  # own, since the last round
        self._unsent: dict[int, tuple[int, bool]] = {}  # own, not reported to the service yet
        self._older: dict[int, tuple[int, bool]] = {}  # the group's, rounds after the sync before the last
        self._newer: dict[int, tuple[int, bool]] = {}  # ... and after the last sync
        self.document: str | None = None
        self._rounds_since_sync = 0
        self.taken_since_sync = 0
        # Near the data's end (see ShardSampler._note_the_data_end): seen at this trainer's own
        # sync, and agreed by the whole group in the next exchange (so every trainer runs the
        # same rounds from the one after).
        self.low_todo_seen = False
        self.near_end = False

    def add(self, shard_id: int, position: int, size: int) -> None:
        """Record this trainer's acknowledgement: the shard used up to `position` (done at `size`)."""
        entry = (size, True) if position >= size else (position, False)
        _merge(self._round, shard_id, entry)
        _merge(self._unsent, shard_id, entry)

    @property
    def unsent(self) -> list[tuple[int, int, bool]]:
        """This trainer's acknowledgements not reported to the service, by shard."""
        return [(sid, consumed, done) for sid, (consumed, done) in sorted(self._unsent.items())]

    def mark_sent(self) -> None:
        """The `unsent` acknowledgements reached the service."""
        self._unsent.clear()

    @property
    def sync_due(self) -> bool:
        """Whether this round syncs (the same answer on every trainer of the group)."""
        return self.document is None or self._rounds_since_sync >= self.sync_every

    def synced(self, document: str) -> None:
        """This round's sync read `document`: it holds the acknowledgements of rounds up to the last sync."""
        self.mark_sent()
        self.document = document
        self._older, self._newer = self._newer, {}
        self._rounds_since_sync = 0
        self.taken_since_sync = 0

    def exchange(self) -> None:
        """All-gather this round's acknowledgements of every trainer of the group (a collective);
        the group is near the data's end from now on when any trainer has seen it."""
        own = [(sid, consumed, done) for sid, (consumed, done) in sorted(self._round.items())]
        most, low_todo_seen, entries = self._all_gather(own, _CAPACITY)
        if most > _CAPACITY:
            most, low_todo_seen, entries = self._all_gather(own, most)
        self.near_end = self.near_end or low_todo_seen
        for sid, consumed, done in entries:
            _merge(self._newer, sid, (consumed, bool(done)))
        self._round.clear()
        self._rounds_since_sync += 1

    def fence(self, failed: bool = False) -> bool:
        """A collective: no trainer of the group goes on before all got here. Returns whether any
        trainer came with `failed` set (so all of them can refuse a step one of them refused)."""
        flags = torch.tensor([int(failed)], dtype=torch.int64, device=self._device)
        dist.all_reduce(flags, group=self._group)
        return bool(flags.item())  # on an accelerator the collective is only queued until its result is read

    def read_exactly(self, document: str) -> None:
        """`document` was read after every acknowledgement of the group (near the data's end, where
        each commit is reported at once): it is the whole position, with nothing to add."""
        self.document = document
        self._older, self._newer = {}, {}
        self._unsent.clear()
        self._rounds_since_sync = 0
        self.taken_since_sync = 0

    def acknowledged(self) -> list[tuple[int, int, bool]]:
        """The group's acknowledgements that `document` may lack, by shard."""
        merged = dict(self._older)
        for sid, entry in self._newer.items():
            _merge(merged, sid, entry)
        return [(sid, consumed, done) for sid, (consumed, done) in sorted(merged.items())]

    def _all_gather(self, own: list[tuple[int, int, bool]], capacity: int) -> tuple[int, bool, list[list[int]]]:
        """One all-gather of every trainer's row (its count, its end flag, up to `capacity` entries):
        the largest count, whether any trainer saw the end near, and the entries that fit, as
        `[shard_id, consumed, done]`. Picked out with tensor operations: a group of a thousand
        trainers sends a thousand rows every round."""
        row = [len(own), int(self.low_todo_seen)] + [0] * (3 * capacity)
        for i, (sid, consumed, done) in enumerate(own[:capacity]):
            row[2 + 3 * i : 5 + 3 * i] = [sid, consumed, int(done)]
        mine = torch.tensor(row, dtype=torch.int64, device=self._device)
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine, group=self._group)
        rows = torch.stack(parts).cpu()
        counts = rows[:, 0]
        triples = rows[:, 2:].reshape(len(parts), capacity, 3)
        fits = torch.arange(capacity).unsqueeze(0) < counts.clamp(max=capacity).unsqueeze(1)
        entries: list[list[int]] = triples[fits].tolist()
        return int(counts.max()), bool(rows[:, 1].any()), entries


def _merge(into: dict[int, tuple[int, bool]], shard_id: int, entry: tuple[int, bool]) -> None:
    old = into.get(shard_id)
    if old is None:
        into[shard_id] = entry
    else:
        into[shard_id] = (max(old[0], entry[0]), old[1] or entry[1])
