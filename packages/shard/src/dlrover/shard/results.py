"""What the shard manager returns: each decision carries a reason that says why."""

from __future__ import annotations

import attrs

from dlrover.shard.shard import Shard

__all__ = [
    "FetchResult",
    "ReportResult",
    "RegisterResult",
    "RestoreResult",
    "FailedShard",
    "WorkerThroughput",
    "DatasetStatus",
    "ShardSnapshot",
    "SyncResult",
]


@attrs.frozen
class FetchResult:
    """Shards leased to a worker.

    Attributes:
        shards: the leased shards, possibly none.
        finished: no shard will ever be handed out again (bounded dataset, all epochs done and
            nothing leased). An empty, unfinished result means "ask again later".
        reason: why these shards, or why none.
    """

    shards: tuple[Shard, ...]
    finished: bool
    reason: str


@attrs.frozen
class ReportResult:
    """The outcome of a progress, done or failure report.

    Attributes:
        changed: whether the report changed the manager's state (a stale position does not).
        reason: what happened.
        pending: the master could not be reached and the client queued the report; `changed`
            is then unknown (False) until it is delivered.
    """

    changed: bool
    reason: str
    pending: bool = False


@attrs.frozen
class RegisterResult:
    """The outcome of registering a dataset.

    Attributes:
        created: False when the identical dataset was already registered (registering is
            idempotent, so every worker may do it).
        reason: what happened.
    """

    created: bool
    reason: str


@attrs.frozen
class RestoreResult:
    """The outcome of restoring a progress checkpoint.

    Attributes:
        dataset: the dataset restored.
        returned_to_queue: shards that were leased when the checkpoint was taken and now wait
            in the queue again (at their acknowledged positions under exactly-once).
        reason: what happened.
    """

    dataset: str
    returned_to_queue: int
    reason: str


@attrs.frozen
class FailedShard:
    """A shard given up on, kept visible with the reasons of its failed attempts.

    Attributes:
        shard: the shard; `consumed` is the acknowledged position, so `remaining_samples()` are
            the samples that were never acknowledged.
        reasons: one line per failed attempt, oldest first.
    """

    shard: Shard
    reasons: tuple[str, ...]


@attrs.frozen
class WorkerThroughput:
    """What one worker has consumed of a dataset.

    Attributes:
        worker: the worker's id.
        samples: units reported consumed (progress and done).
        shards_done: shards it finished.
        samples_per_s: `samples` over the time from its first fetch to its last report, or 0.
        leased: shards it holds now.
    """

    worker: str
    samples: int
    shards_done: int
    samples_per_s: float
    leased: int


@attrs.frozen
class DatasetStatus:
    """Counts of a dataset's shards and its workers' throughput.

    Attributes:
        dataset: the dataset's name.
        todo: shards waiting in the current epoch (re-queued and not yet dispatched); future
            epochs are counted by `epochs_remaining`.
        doing: shards leased now.
        done: shards finished, all epochs together.
        failed: shards in the failed set.
        epoch: the newest epoch started (-1 before the first fetch).
        epochs_remaining: epochs not yet started; None when unbounded.
        finished: nothing will be handed out again.
        workers: per-worker throughput, by worker id.
        failed_shards: the failed set with reasons.
    """

    dataset: str
    todo: int
    doing: int
    done: int
    failed: int
    epoch: int
    epochs_remaining: int | None
    finished: bool
    workers: tuple[WorkerThroughput, ...]
    failed_shards: tuple[FailedShard, ...]


@attrs.frozen
class ShardSnapshot:
    """Every shard id of the epochs not yet finished, by state (for tests and tools; O(shards)).

    Attributes:
        todo: ids waiting (re-queued, or of a started epoch and not yet dispatched).
        doing: id -> worker holding its lease.
        done: ids finished in epochs not yet finished (and stream shards).
        failed: ids in the failed set.
    """

    todo: frozenset[int]
    doing: dict[int, str]
    done: frozenset[int]
    failed: frozenset[int]


@attrs.frozen
class SyncResult:
    """What `ShardClient.sync` read: the data position after its acknowledgements, and how many
    shards the dataset still has to hand out (None: unbounded)."""

    document: str
    shards_to_hand_out: int | None
