"""The job's training data as the master's own shard service hands it out, exactly once.

A DLRover strategy's master hosts the real shard service (`dlrover.shard.ShardRegistry` behind
`dlrover.master.hosting.HostedShards`, as `dlrover-master` hosts it): it is journaled with the
master's state, and a node the master lets go or restarts has its shards returned through the
master's own departure path. The simulated training processes lease shards, acknowledge what they
trained, store the service's data position with each checkpoint, and restore it with the
checkpoint after every failure, as `dlrover.shard.torch_data.ShardSampler` does for a training loop.

What is simulated:

- **Units.** One unit is one node's part of a step's global batch at the job's full size, so a step
  trains `full` units whatever the world: a smaller world's nodes each train `full / world` units
  a step (the simulation's steps keep the global batch).
- **Readers.** The nodes of one model replica train on the same batch, so one reader per replica
  leases shards: reader `j` of a world of `w` nodes serves the members at positions
  ``[j * nodes_per_reader, (j + 1) * nodes_per_reader)`` (by rank), and its worker id names the
  replica's first node (`"<node id>/reader-<j>"`), which is what the master's departure path
  matches. After `n` steps it has trained ``floor(n * full * hi / w) - floor(n * full * lo / w)``
  units, so the readers' units sum to ``n * full`` exactly.
- **Reports.** Real readers acknowledge after every step and so renew their leases. The simulation
  sends a reader's acknowledgements when it must: before the master can act on a node (a failure,
  a relaunch, the end of the attempt) and where a checkpoint's data position is read. So the
  dataset's lease outlasts the run: only the master's departure path and restores take shards
  back, as they would while readers report.
- **Checkpoints.** The data position (`ShardRegistry.checkpoint`) is read at every step a restore
  may later go back to (the flash checkpoint, the persisted one, a persist still being written, a
  planned round's sealed step) after every reader acknowledged up to it; a restore hands that
  document back (`ShardRegistry.restore`).

The check: a data position read at step `s` must hold exactly ``s * full`` units acknowledged,
counted from the document (finished epochs, the done bitmaps, the queued shards' acknowledged
positions), at every restore and at the end of the run. A sample lost or trained twice by the
master's data path would break it, and the run fails with `DataLossError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from dlrover.common import Clock
from dlrover.master.hosting import HostedShards
from dlrover.shard import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    Shard,
    ShardError,
    ShardRegistry,
    decode_progress,
)
from dlrover.shard.shard import decode_bitmap

__all__ = ["DATASET", "DataFeed", "DataLossError"]

DATASET = "goodput-sim"


class DataLossError(AssertionError):
    """The master's data position disagrees with the steps it belongs to: a sample lost or trained twice."""


@attrs.define
class _Reader:
    """One replica's reader in the attempt in force."""

    worker: str
    lo: int  # the attempt's member positions it serves: [lo, hi)
    hi: int
    acked: int = 0  # units acknowledged since the attempt started
    shard: Shard | None = None
    position: int = 0  # the held shard's units acknowledged (its `consumed` when leased)


class DataFeed:
    """The readers of a job of `full` nodes, and the data positions its checkpoints hold.

    Args:
        clock: the master's clock (the shard service's lease deadlines run on it).
        full: the job's nodes at full size (units per step).
        nodes_per_reader: the nodes of one model replica.
        shard_steps: steps of a reader's batches in one shard.
        lease_timeout_s: the dataset's lease; longer than the run (see the module's notes).
    """

    def __init__(
        self, clock: Clock, *, full: int, nodes_per_reader: int, shard_steps: int, lease_timeout_s: float
    ) -> None:
        self.full = full
        self.nodes_per_reader = nodes_per_reader
        self.shard_units = shard_steps * nodes_per_reader
        readers = math.ceil(full / nodes_per_reader)
        # Epochs of a few shards per reader keep the data position small: a finished epoch is a count.
        self.shards_per_epoch = max(8, 4 * readers)
        self.registry = ShardRegistry(clock)
        self.hosted = HostedShards(self.registry)
        self.spec = DatasetSpec(
            name=DATASET,
            source=IndexSource(self.shards_per_epoch * self.shard_units),
            batch_size=nodes_per_reader,
            batches_per_shard=shard_steps,
            num_epochs=None,
            shuffle=False,
            delivery=DeliveryMode.EXACTLY_ONCE,
            lease_timeout_s=lease_timeout_s,
        )
        self._readers: list[_Reader] = []
        self._world = 0
        self._from_step = 0  # the step the attempt in force restored
        self._acked_step = 0  # the step every reader of the attempt acknowledged up to
        self.positions: dict[int, str] = {}  # step -> the data position read there
        self.restores = 0

    def register(self) -> None:
        """Register the dataset (the job's first round) and read its data position at step 0."""
        with self.hosted.locked() as registry:
            registry.register(self.spec)
            self.positions[0] = registry.checkpoint(DATASET)
        self.hosted.changed_by_request()

    def start_attempt(self, members_by_rank: Sequence[int], step: int, *, restore: bool) -> None:
        """A round of `members_by_rank` trains from `step`; with `restore`, its data position is restored first
        (by one trainer, as rank 0 does in the example)."""
        if restore:
            document = self.positions.get(step)
            if document is None:
                raise DataLossError(f"no data position was read at step {step}, which the round restores")
            self._check(document, step)
            with self.hosted.locked() as registry:
                registry.restore(document, DATASET)
            self.hosted.changed_by_request()
            self.restores += 1
        # Positions after the step restored belong to steps that are trained again now, on other data.
        self.positions = {s: d for s, d in self.positions.items() if s <= step}
        world = len(members_by_rank)
        per = self.nodes_per_reader
        self._world = world
        self._from_step = self._acked_step = step
        self._readers = [
            _Reader(f"{members_by_rank[lo]}/reader-{lo // per}", lo, min(lo + per, world))
            for lo in range(0, world, per)
        ]

    def settle(self, reached: int, restorable: Iterable[int]) -> None:
        """Every reader acknowledges the steps up to `reached`, and the data position is read on the way at
        each step of `restorable` (the saved steps a later restore may go back to: the flash checkpoint, the
        persisted one, persists still being written) and at `reached`: a save that finishes later is of a step
        at or after the flash checkpoint now, so it is one of those. Positions older than every restorable
        step are forgotten."""
        points = {*restorable, reached}
        if reached < self._acked_step:
            raise AssertionError(f"the steps went back from {self._acked_step} to {reached} within an attempt")
        if max(points) > reached:
            raise AssertionError(f"a restorable step {max(points)} is after the step reached, {reached}")
        passed = sorted(s for s in points if s < self._acked_step and s not in self.positions)
        if passed:
            # Its position was not read when the readers passed it: a restore there could not be checked.
            raise AssertionError(f"restorable step(s) {passed} were acknowledged past without their data position")
        with self.hosted.locked() as registry:
            for step in sorted(s for s in points if s >= self._acked_step and s not in self.positions):
                self._acknowledge_to(registry, step)
                self.positions[step] = registry.checkpoint(DATASET)
            self._acknowledge_to(registry, reached)
        self.hosted.changed_by_request()
        oldest = min(points)
        self.positions = {s: d for s, d in self.positions.items() if s >= oldest}

    def check(self, step: int) -> None:
        """The data position now (every reader acknowledged up to `step`) holds exactly `step` steps' units.

        Raises:
            DataLossError: it does not.
        """
        with self.hosted.locked() as registry:
            document = registry.checkpoint(DATASET)
        self._check(document, step)

    def _acknowledge_to(self, registry: ShardRegistry, step: int) -> None:
        n = step - self._from_step
        for reader in self._readers:
            trained = n * self.full * reader.hi // self._world - n * self.full * reader.lo // self._world
            self._acknowledge_units(registry, reader, trained - reader.acked)
            reader.acked = trained
        self._acked_step = step

    def _acknowledge_units(self, registry: ShardRegistry, reader: _Reader, units: int) -> None:
        """The reader trained `units` more: acknowledge them, leasing shards as it uses them up. A report
        the service refuses (a shard the reader no longer holds) is data trained twice or lost.

        Raises:
            DataLossError: the service refused a report, or had no shard to hand out.
        """
        try:
            self._lease_and_report(registry, reader, units)
        except ShardError as exc:
            raise DataLossError(f"{reader.worker}'s report was refused: {exc}") from exc

    def _lease_and_report(self, registry: ShardRegistry, reader: _Reader, units: int) -> None:
        while units > 0:
            if reader.shard is None:
                fetched = registry.fetch(DATASET, reader.worker)
                if not fetched.shards:
                    raise DataLossError(f"{reader.worker} got no shard: {fetched.reason}")
                reader.shard = fetched.shards[0]
                reader.position = reader.shard.consumed
            shard = reader.shard
            take = min(units, shard.size - reader.position)
            reader.position += take
            units -= take
            if reader.position == shard.size:
                registry.report_done(DATASET, reader.worker, shard.shard_id)
                reader.shard = None
            elif units == 0:
                registry.report_progress(DATASET, reader.worker, shard.shard_id, reader.position)

    def _check(self, document: str, step: int) -> None:
        held = self.acknowledged(document)
        if held != step * self.full:
            raise DataLossError(
                f"the data position at step {step} holds {held} units acknowledged, expected {step * self.full} "
                f"({step} steps of {self.full}): a sample was lost or trained twice"
            )

    def acknowledged(self, document: str) -> int:
        """The distinct units a data position holds acknowledged: every shard of a finished epoch, the done
        shards of the others, and the acknowledged part of every queued shard."""
        _, state = decode_progress(document)
        per_epoch = self.shards_per_epoch
        done = state["finished_epochs"] * per_epoch
        for epoch, book in state["epochs"].items():
            done += len(decode_bitmap(book["done_bitmap"], int(epoch) * per_epoch, per_epoch))
        return int(done * self.shard_units + sum(int(entry["consumed"]) for entry in state["queue"]))
