"""The shard manager of one dataset: a pure state machine driven by requests and an injected clock.

Every shard is in exactly one of four states:

    todo  --fetch-->  doing  --done-->  done
      ^                 |
      +--fail/expire----+--(attempts used up, or at-most-once)-->  failed

A bounded dataset's epochs are materialized lazily: epoch e+1 starts when epoch e has nothing
left to hand out (its stragglers may still be leased), so fast workers never wait for slow
ones. Shards of a started epoch that were never dispatched are not objects at all: they are a
permutation of shard numbers and a cursor into it. Only leased, re-queued and failed shards are
objects.

The manager does no I/O, starts no threads and reads time only from the `Clock` it is given. It
is not thread-safe: the service that hosts it serializes calls.
"""

from __future__ import annotations

import heapq
import random
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from dlrover.common import Clock
from dlrover.shard._bookkeeping import (
    MAX_REQUEST_ID_CHARS,
    EpochBook,
    Lease,
    Parked,
    WorkerStats,
    check_int,
    check_request_id,
    check_worker,
)
from dlrover.shard.changelog import RequestClock
from dlrover.shard.config import DatasetSpec, DeliveryMode, ShardManagerConfig, StreamPartitions
from dlrover.shard.errors import InvalidShardRequestError, ShardStateError, UnknownShardError
from dlrover.shard.progress import load_manager_state
from dlrover.shard.results import (
    DatasetStatus,
    FailedShard,
    FetchResult,
    ReportResult,
    ShardSnapshot,
    WorkerThroughput,
)
from dlrover.shard.shard import Shard, bitmap_text, mix_seed
from dlrover.shard.splitter import Splitter, make_splitter

__all__ = ["ShardManager", "MAX_REASONS_KEPT", "MAX_REQUEST_ID_CHARS", "check_acknowledgements"]

MAX_REASONS_KEPT = 16
_STREAM_PRUNE_AT = 4096
_HEAP_SLACK = 1024
_LEASED_AFTER_THE_READ = "at-most-once: leased after the position was read, in use when it was saved"


class ShardManager:
    """Hands out one dataset's shards under leases, with the dataset's delivery semantics.

    Args:
        spec: the dataset.
        clock: the time source for leases and throughput.
        config: lease timeouts, attempts and limits shared by the registry.
    """

    def __init__(self, spec: DatasetSpec, clock: Clock, config: ShardManagerConfig | None = None) -> None:
        self._spec = spec
        self._clock = clock
        self._config = config or ShardManagerConfig()
        self._lease_timeout_s = spec.lease_timeout_s or self._config.lease_timeout_s(spec.task_type)
        self._max_attempts = spec.max_attempts or self._config.max_attempts
        self._stream = isinstance(spec.source, StreamPartitions)
        self._splitter: Splitter | None = None if self._stream else make_splitter(spec)
        # Bounded sources: the newest started epoch, its shard order and how far it has been handed out.
        self._epoch = -1
        self._perm: array[int] | None = None
        self._cursor = 0
        self._books: dict[int, EpochBook] = {}
        self._finished_epochs = 0
        # Every source: re-queued shards (served before fresh ones), leases, failures.
        self._queue: deque[Parked] = deque()
        self._queued: dict[int, Parked] = {}
        self._doing: dict[int, Lease] = {}
        self._by_worker: dict[str, set[int]] = {}
        self._deadlines: list[tuple[float, int, int]] = []
        self._lease_versions = 0
        self._failed: dict[int, FailedShard] = {}
        self._done_total = 0
        self._stats: dict[str, WorkerStats] = {}
        self._replies: dict[str, OrderedDict[tuple[str, str], Any]] = {}
        # Streams: per-partition next offset to cut and the highest offset known to exist.
        self._next_offset: dict[str, int] = {}
        self._watermark: dict[str, int] = {}
        self._next_stream_id = 0
        self._rr = 0
        self._stream_done: set[int] = set()
        self._stream_done_floor = 0
        # Counts changes of the data position (see `position_version`).
        self._position_version = 0
        # A lease changes the position where the export writes a leased shard otherwise than an
        # undispatched one: at-most-once (failed) and streams (cut from the partition's offsets).
        self._lease_moves_position = self._stream or spec.delivery is DeliveryMode.AT_MOST_ONCE
        if isinstance(spec.source, StreamPartitions):
            for p in spec.source.partitions:
                self._next_offset[p] = 0
                self._watermark[p] = 0

    # ------------------------------------------------------------------ properties

    @property
    def spec(self) -> DatasetSpec:
        """The dataset's specification."""
        return self._spec

    @property
    def lease_timeout_s(self) -> float:
        """Seconds a lease lasts without a progress report."""
        return self._lease_timeout_s

    @property
    def max_attempts(self) -> int:
        """Failed dispatches after which a shard goes to the failed set."""
        return self._max_attempts

    @property
    def num_shards_per_epoch(self) -> int | None:
        """Shards in one epoch of a bounded dataset; None for streams."""
        return None if self._splitter is None else self._splitter.num_shards

    # ------------------------------------------------------------------ requests

    def fetch(self, worker: str, count: int = 1, request_id: str = "") -> FetchResult:
        """Lease up to `count` shards to `worker`.

        A retried request (same worker and non-empty `request_id`) gets the shards the first one
        leased, those it still holds, instead of new ones.

        Raises:
            InvalidShardRequestError: bad worker id, request id, or count outside 1..max_fetch_count.
        """
        self._changing("fetch")
        check_worker(worker)
        check_request_id(request_id)
        count = check_int("count", count)
        if not 1 <= count <= self._config.max_fetch_count:
            raise InvalidShardRequestError(f"count must be in 1..{self._config.max_fetch_count}, got {count}")
        now = self._now_expiring()
        if request_id:
            cached = self._cached(worker, "fetch", request_id)
            if isinstance(cached, FetchResult):
                held = tuple(
                    self._doing[s.shard_id].parked.to_shard(self._spec.name)
                    for s in cached.shards
                    if s.shard_id in self._doing and self._doing[s.shard_id].worker == worker
                )
                return FetchResult(held, cached.finished, f"retried request {request_id!r}: {cached.reason}")
        self._stats_of(worker, now).last_seen = now
        shards: list[Shard] = []
        while len(shards) < count:
            parked = self._next_todo()
            if parked is None:
                break
            shards.append(self._lease(parked, worker, now))
        # A leased shard keeps the dataset unfinished, so `finished` only needs working out
        # when nothing was leased.
        finished = False if shards else self.finished
        result = FetchResult(tuple(shards), finished, self._fetch_reason(len(shards), count, finished))
        if request_id:
            self._remember(worker, "fetch", request_id, result)
        return result

    def report_progress(
        self, worker: str, shard_id: int, consumed: int, request_id: str = "", *, attempt: int | None = None
    ) -> ReportResult:
        """Record that `worker` has used the first `consumed` units of a shard, and renew its lease.

        Under exactly-once this acknowledges those samples: if the worker fails, only the rest is
        dispatched again. Positions only move forward, so a repeated or reordered report is
        harmless.

        Args:
            attempt: the dispatch of the shard the worker means (`Shard.attempt`), or None for
                whichever it holds. A lease that ended and went to the same worker again is
                another dispatch: a report about an earlier one is refused, so a worker never
                takes the newer lease for the one it lost.

        Raises:
            InvalidShardRequestError: `consumed` outside 0..shard size, or a bad id.
            UnknownShardError: no such shard.
            ShardStateError: `worker` does not hold the shard's lease (or not that dispatch of it).
        """
        self._changing("a progress report")
        check_worker(worker)
        check_request_id(request_id)
        shard_id = check_int("shard_id", shard_id)
        consumed = check_int("consumed", consumed)
        if attempt is not None:
            attempt = check_int("attempt", attempt)
        now = self._now_expiring()
        lease = self._held(worker, shard_id, "progress")
        parked = lease.parked
        if attempt is not None and attempt < parked.dispatches:
            # (A later dispatch than the service knows is the worker's own lease, after the service's
            # state went back in time: a restart that lost the journal's tail, a restore of leases.)
            raise ShardStateError(
                f"progress for shard {shard_id} rejected: worker {worker!r} holds its dispatch {parked.dispatches}, "
                f"not dispatch {attempt} (that lease ended)"
            )
        if not 0 <= consumed <= parked.size:
            raise InvalidShardRequestError(f"consumed must be in 0..{parked.size} for shard {shard_id}, got {consumed}")
        lease.deadline = now + self._lease_timeout_s
        stats = self._stats_of(worker, now)
        stats.last_seen = now
        if consumed <= parked.consumed:
            return ReportResult(
                False, f"lease renewed; shard {shard_id} was already at {parked.consumed} >= {consumed}"
            )
        stats.samples += consumed - parked.consumed
        parked.consumed = consumed
        self._position_version += 1
        return ReportResult(True, f"shard {shard_id} at {consumed}/{parked.size}; lease renewed")

    def report_done(self, worker: str, shard_id: int, request_id: str = "") -> ReportResult:
        """Record that `worker` has used every unit of a shard.

        Raises:
            InvalidShardRequestError: a bad id.
            UnknownShardError: no such shard.
            ShardStateError: `worker` does not hold the shard (including a second `done`).
        """
        self._changing("a done report")
        check_worker(worker)
        check_request_id(request_id)
        shard_id = check_int("shard_id", shard_id)
        now = self._now_expiring()
        cached = self._cached(worker, "done", request_id)
        if isinstance(cached, ReportResult):
            return cached
        lease = self._held(worker, shard_id, "done")
        parked = lease.parked
        self._unlease(lease)
        stats = self._stats_of(worker, now)
        stats.samples += parked.size - parked.consumed
        stats.shards_done += 1
        stats.last_seen = now
        parked.consumed = parked.size
        self._mark_done(parked)
        result = ReportResult(True, f"shard {shard_id} done by {worker}")
        self._remember(worker, "done", request_id, result)
        return result

    def acknowledge(
        self, worker: str, acknowledged: Sequence[tuple[int, int, bool]], request_id: str = ""
    ) -> ReportResult:
        """Apply several acknowledgements of `worker` at once: `(shard_id, consumed, done)` each, a
        progress report at `consumed` or, with `done`, a done report (one request instead of one per
        shard, for a trainer that acknowledges in batches).

        Every entry is checked before any is applied, so a batch with a bad entry changes nothing. A
        retried request (same worker and `request_id`) is answered with the first reply.

        Raises:
            InvalidShardRequestError: a bad id or position, or a shard named twice.
            UnknownShardError: no such shard.
            ShardStateError: `worker` does not hold one of the shards.
        """
        self._changing("an acknowledgement")
        check_worker(worker)
        check_request_id(request_id)
        cached = self._cached(worker, "ack", request_id)
        if isinstance(cached, ReportResult):
            return cached
        entries = check_acknowledgements(acknowledged)
        now = self._now_expiring()
        for shard_id, consumed, done in entries:
            lease = self._held(worker, shard_id, "done" if done else "progress")
            if not done and not 0 <= consumed <= lease.parked.size:
                raise InvalidShardRequestError(
                    f"consumed must be in 0..{lease.parked.size} for shard {shard_id}, got {consumed}"
                )
        stats = self._stats_of(worker, now)
        stats.last_seen = now
        finished = 0
        for shard_id, consumed, done in entries:
            lease = self._doing[shard_id]
            parked = lease.parked
            if done:
                self._unlease(lease)
                stats.samples += parked.size - parked.consumed
                stats.shards_done += 1
                parked.consumed = parked.size
                self._mark_done(parked)
                finished += 1
                continue
            lease.deadline = now + self._lease_timeout_s
            if consumed > parked.consumed:
                stats.samples += consumed - parked.consumed
                parked.consumed = consumed
                self._position_version += 1
        result = ReportResult(True, f"{len(entries)} acknowledgement(s) by {worker}, {finished} shard(s) done")
        self._remember(worker, "ack", request_id, result)
        return result

    def report_failure(
        self, worker: str, shard_id: int, reason: str, consumed: int | None = None, request_id: str = ""
    ) -> ReportResult:
        """Record that `worker` could not finish a shard; it goes back to the queue or to the failed set.

        Args:
            worker: the worker holding the shard.
            shard_id: the shard.
            reason: why, kept with the shard.
            consumed: a last acknowledged position, as in `report_progress`.
            request_id: makes a retried report harmless.

        Raises:
            InvalidShardRequestError: a bad id, reason or position.
            UnknownShardError: no such shard.
            ShardStateError: `worker` does not hold the shard.
        """
        self._changing("a failure report")
        check_worker(worker)
        check_request_id(request_id)
        shard_id = check_int("shard_id", shard_id)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidShardRequestError(f"a failure needs a reason, got {reason!r}")
        now = self._now_expiring()
        cached = self._cached(worker, "fail", request_id)
        if isinstance(cached, ReportResult):
            return cached
        lease = self._held(worker, shard_id, "failure")
        if consumed is not None:
            consumed = check_int("consumed", consumed)
            if not 0 <= consumed <= lease.parked.size:
                raise InvalidShardRequestError(
                    f"consumed must be in 0..{lease.parked.size} for shard {shard_id}, got {consumed}"
                )
            if consumed > lease.parked.consumed:
                self._stats_of(worker, now).samples += consumed - lease.parked.consumed
                lease.parked.consumed = consumed
        outcome = self._release(lease, f"worker {worker} reported failure: {reason.strip()}")
        result = ReportResult(True, outcome)
        self._remember(worker, "fail", request_id, result)
        return result

    def remove_worker(self, worker: str, reason: str = "worker left", *, charge: bool = True) -> list[int]:
        """Return every shard `worker` holds to the queue (or the failed set); forget its replies.

        Args:
            worker: the worker.
            reason: why, kept in the history of each shard charged, and of each at-most-once shard
                set aside (which is never handed out again, charged or not).
            charge: count the removal as a failed attempt of each shard it held (`max_attempts`).
                False where the cause cannot be the data (a lost node, a preemption, a peer's
                failure, a planned round): such removals alone never send a shard to the failed set.

        Returns:
            The ids of the shards it held.
        """
        self._changing("removing a worker")
        check_worker(worker)
        if not isinstance(charge, bool):
            raise InvalidShardRequestError(f"charge must be a bool, got {charge!r}")
        self.expire_leases()
        ids = sorted(self._by_worker.get(worker, ()))
        for sid in ids:
            self._release(self._doing[sid], f"worker {worker} removed: {reason}", charge=charge)
        self._replies.pop(worker, None)
        return ids

    def expire_leases(self) -> list[int]:
        """Take back every lease whose deadline has passed; returns their shard ids in expiry order.

        Deadlines sit in a min-heap, so this costs O(log n) per lease that ended or was renewed
        since its entry was filed, and O(1) when nothing is due: every request calls it.
        """
        return self._expire(self._clock.now())

    def _changing(self, what: str) -> None:
        """Refuse a change its registry's change log would miss (see `RequestClock.check_in_call`)."""
        if isinstance(self._clock, RequestClock):
            self._clock.check_in_call(f"{what} of dataset {self._spec.name!r}")

    def _now_expiring(self) -> float:
        """The time of the request being handled, after taking back the leases due by then."""
        now = self._clock.now()
        if self._deadlines and self._deadlines[0][0] <= now:
            self._expire(now)
        return now

    def _expire(self, now: float) -> list[int]:
        expired: list[int] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, sid, version = heapq.heappop(self._deadlines)
            lease = self._doing.get(sid)
            if lease is None or lease.version != version:
                continue  # that lease ended; its entry was left behind
            if lease.deadline != deadline:
                # Renewed since the entry was pushed: renewals only move the deadline, and the
                # entry is re-filed here, so the heap holds about one entry per lease. It is
                # re-filed even when the new deadline has passed too, so that leases expire
                # (and their shards are re-queued) in deadline order.
                heapq.heappush(self._deadlines, (lease.deadline, sid, version))
                continue
            expired.append(sid)
            self._release(
                lease, f"lease of worker {lease.worker} expired after {self._lease_timeout_s:g}s without a report"
            )
        return expired

    def advance_stream(self, partition: str, end_offset: int) -> ReportResult:
        """Tell a stream dataset that records [0, end_offset) of `partition` exist.

        Raises:
            InvalidShardRequestError: the dataset is not a stream, the partition is unknown or the
                offset negative.
        """
        self._changing("advancing a stream")
        if not self._stream:
            raise InvalidShardRequestError(f"dataset {self._spec.name!r} is not a stream")
        if partition not in self._watermark:
            raise InvalidShardRequestError(
                f"dataset {self._spec.name!r} has no partition {partition!r}; it has {sorted(self._watermark)}"
            )
        end_offset = check_int("end_offset", end_offset)
        if end_offset < 0:
            raise InvalidShardRequestError(f"end_offset must not be negative, got {end_offset}")
        if end_offset <= self._watermark[partition]:
            return ReportResult(False, f"partition {partition!r} already known up to {self._watermark[partition]}")
        self._watermark[partition] = end_offset
        self._position_version += 1
        return ReportResult(True, f"partition {partition!r} now known up to {end_offset}")

    # ------------------------------------------------------------------ views

    @property
    def finished(self) -> bool:
        """Nothing will be handed out again: all epochs started and every shard done or failed."""
        if self._stream or self._queue or self._doing:
            return False
        return not self._fresh_left() and not self._more_epochs()

    @property
    def shards_to_hand_out(self) -> int | None:
        """Shards not handed out yet, queued ones and those of epochs not started included; None
        when that is unbounded (a stream, or no epoch limit)."""
        if self._stream or self._splitter is None or self._spec.num_epochs is None:
            return None
        later = self._spec.num_epochs - max(self._epoch + 1, 0)
        return len(self._queue) + self._fresh_count() + later * self._splitter.num_shards

    def status(self) -> DatasetStatus:
        """Counts and per-worker throughput."""
        self.expire_leases()
        workers = []
        for worker in sorted(self._stats):
            st = self._stats[worker]
            span = st.last_seen - st.first_seen
            workers.append(
                WorkerThroughput(
                    worker=worker,
                    samples=st.samples,
                    shards_done=st.shards_done,
                    samples_per_s=st.samples / span if span > 0 else 0.0,
                    leased=len(self._by_worker.get(worker, ())),
                )
            )
        remaining: int | None = None
        if self._spec.num_epochs is not None:
            remaining = self._spec.num_epochs - (self._epoch + 1)
        return DatasetStatus(
            dataset=self._spec.name,
            todo=len(self._queue) + self._fresh_count(),
            doing=len(self._doing),
            done=self._done_total,
            failed=len(self._failed),
            epoch=self._epoch,
            epochs_remaining=remaining,
            finished=self.finished,
            workers=tuple(workers),
            failed_shards=tuple(self._failed[k] for k in sorted(self._failed)),
        )

    def snapshot(self) -> ShardSnapshot:
        """Every shard id of unfinished epochs by state; O(shards), for tests and tools."""
        todo = set(self._queued)
        if self._splitter is not None and self._epoch >= 0:
            base = self._epoch * self._splitter.num_shards
            todo.update(base + self._fresh_index(i) for i in range(self._cursor, self._splitter.num_shards))
        done: set[int] = set(self._stream_done)
        for book in self._books.values():
            done.update(book.done_ids())
        return ShardSnapshot(
            todo=frozenset(todo),
            doing={sid: lease.worker for sid, lease in self._doing.items()},
            done=frozenset(done),
            failed=frozenset(self._failed),
        )

    @property
    def position_version(self) -> int:
        """A number that changes whenever the data position (`export_state()`, without leases) would
        say something else about the remaining work: a sample acknowledged, a shard done, failed or
        taken back, a new epoch started, a stream grown.

        Leasing a shard of a bounded source does not change it under exactly-once or at-least-once:
        an export taken before the lease, which writes the shard as not yet dispatched (or still
        queued, one dispatch fewer), restores the same remaining work as one taken after it, which
        writes it as re-queued. So an export may be reused while this is unchanged
        (`ShardRegistry.checkpoint` does): every rank reads the position after every step, and
        between the last acknowledgement of a step and the first of the next the ranks only lease.
        """
        return self._position_version

    def leased_shards(self, worker: str) -> list[Shard]:
        """The shards `worker` holds now, by id."""
        return [self._doing[sid].parked.to_shard(self._spec.name) for sid in sorted(self._by_worker.get(worker, ()))]

    # ------------------------------------------------------------------ checkpoint support

    def export_state(self, *, include_leases: bool = False, exact: bool = False) -> dict[str, Any]:
        """The remaining work as JSON-ready data (see `dlrover.shard.progress` for the format).

        Leased shards are written as re-queued at their acknowledged positions (exactly-once),
        from the start (at-least-once), or into the failed set (at-most-once: they may have been
        partly used and are never dispatched twice).

        Args:
            include_leases: write the leases as they are instead (with their holders, and each
                worker's last fetch, done and failure reply), for a service that restarts and
                must keep the workers that outlived it training on what they hold. A user's data
                position never includes them: it would hand shards to workers of another run.
            exact: with `include_leases`, also write each lease's deadline on this manager's
                clock and every remembered reply, in order: what a later call depends on, so that
                calls replayed onto the restored state decide as they did here (a registry's
                change log, `ShardRegistry.journal_base`).
        """
        if exact and not include_leases:
            raise ValueError("an exact export includes the leases")
        self.expire_leases()
        queue = [self._parked_json(p) for p in self._queue]
        failed = [self._failed_json(f) for _, f in sorted(self._failed.items())]
        books = {e: (b.bitmap(), b.done_count, b.failed) for e, b in self._books.items()}
        in_flight = sorted(self._doing)
        if include_leases:
            state = self._export_core(queue, failed, books, self._finished_epochs, in_flight)
            leases = []
            for sid in in_flight:
                lease = self._doing[sid]
                entry: dict[str, Any] = {"worker": lease.worker, "shard": self._parked_json(lease.parked)}
                if exact:
                    entry["deadline"] = lease.deadline
                leases.append(entry)
            state["leases"] = leases
            state["replies"] = self._export_replies(every=exact)
            return state
        for sid in in_flight:
            parked = self._doing[sid].parked
            if self._spec.delivery is DeliveryMode.AT_MOST_ONCE:
                if parked.epoch in books:
                    bitmap, done_count, failed_count = books[parked.epoch]
                    books[parked.epoch] = (bitmap, done_count, failed_count + 1)
                entry = self._parked_json(parked)
                del entry["failures"]  # failed entries carry their history in "reasons"
                entry["reasons"] = [*parked.reasons, "at-most-once: leased when the checkpoint was taken"]
                failed.append(entry)
            else:
                entry = self._parked_json(parked)
                if self._spec.delivery is DeliveryMode.AT_LEAST_ONCE:
                    entry["consumed"] = 0
                queue.append(entry)
        failed.sort(key=lambda f: int(f["shard_id"]))
        finished_epochs = self._finished_epochs
        for e, (_, done_count, failed_count) in list(books.items()):
            # Failing in-flight at-most-once shards can complete an epoch; write it as finished,
            # the same as the manager would have recorded it.
            if done_count + failed_count >= self._books[e].total:
                del books[e]
                finished_epochs += 1
        return self._export_core(queue, failed, books, finished_epochs, in_flight)

    def _export_core(
        self,
        queue: list[dict[str, Any]],
        failed: list[dict[str, Any]],
        books: dict[int, tuple[bytes, int, int]],
        finished_epochs: int,
        in_flight: list[int],
    ) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "cursor": self._cursor,
            "finished_epochs": finished_epochs,
            "done_total": self._done_total,
            "epochs": {
                str(e): {"done_bitmap": bitmap_text(bitmap), "failed": nfail}
                for e, (bitmap, _, nfail) in sorted(books.items())
            },
            "in_flight": in_flight,
            "queue": queue,
            "failed": failed,
            "stream": {
                "next_offset": dict(sorted(self._next_offset.items())),
                "watermark": dict(sorted(self._watermark.items())),
                "next_shard_id": self._next_stream_id,
                "round_robin": self._rr,
                "done": sorted(self._stream_done),
                "done_floor": self._stream_done_floor,
            },
        }

    @classmethod
    def from_state(
        cls,
        spec: DatasetSpec,
        state: dict[str, Any],
        clock: Clock,
        config: ShardManagerConfig | None = None,
        *,
        exact: bool = False,
    ) -> tuple[ShardManager, int]:
        """A manager holding exactly the remaining work `state` (from `export_state`) describes.

        Args:
            spec: the dataset.
            state: the exported state.
            clock: the new manager's clock.
            config: the new manager's settings.
            exact: `state` is an exact export (`export_state(exact=True)`) on `clock`'s time:
                its leases keep their deadlines (a lease without one, and every lease of a state
                loaded otherwise, runs a whole lease period from now).

        Returns:
            The manager and how many shards were in flight when the state was exported.

        Raises:
            InvalidShardRequestError: the state is malformed or does not fit `spec`; the message
                names the field.
        """
        return load_manager_state(cls(spec, clock, config), state, exact=exact)

    # ------------------------------------------------------------------ internals used by progress.py

    def _settle_acknowledgements(self, entries: Sequence[tuple[int, int, bool]]) -> None:
        """Apply checked acknowledgements made after this manager's state was read (a state loaded
        from a data position, `apply_acknowledged`), each as `_settle_acknowledged`; then, under
        at-most-once, set aside the shards the batch passed on the way (`_set_aside_passed`)."""
        queued_at_the_read = set(self._queued)
        for shard_id, consumed, done in entries:
            self._settle_acknowledged(shard_id, consumed, done)
        self._set_aside_passed(queued_at_the_read)

    def _settle_acknowledged(self, shard_id: int, consumed: int, done: bool) -> None:
        """Apply an acknowledgement made after this manager's state was read, when nobody holds a
        lease (a state loaded from a data position, `apply_acknowledged`): a shard queued there
        moves to `consumed` or is done; a shard not handed out yet then is taken in dispatch order,
        the fresh shards passed on the way queued as leased ones are in a data position (they were
        leased by others meanwhile); a shard already done stays done. As the delivery mode writes
        a shard leased when the position was read: at-least-once keeps only done shards (one not
        finished starts again from its start), at-most-once sets aside in the failed set one
        acknowledged in part (and, `_set_aside_passed`, those passed on the way), as it does a
        shard leased when a position is read. A shard in the failed set stays there.

        Raises:
            InvalidShardRequestError: the shard is not one of this dataset's, or `consumed` is
                outside its size.
        """
        if self._stream or self._splitter is None:
            raise InvalidShardRequestError("acknowledgements are applied to index and record-file datasets only")
        if not self._known(shard_id):
            raise InvalidShardRequestError(f"dataset {self._spec.name!r} has no shard {shard_id}")
        delivery = self._spec.delivery
        if shard_id in self._failed:
            # At-most-once sets aside a shard leased when the position was read; otherwise the service
            # gave up on it (its lease ended past max_attempts) while its holder still trained some of
            # it. Either way it is never handed out again, and it stays listed among the failed: the
            # position must still restore (the model trained those samples).
            return
        if not done and delivery is DeliveryMode.AT_LEAST_ONCE:
            return  # a shard not finished is handed out again from its start: its progress is not kept
        if shard_id in self._doing:
            raise InvalidShardRequestError(f"shard {shard_id} is leased: its holder acknowledges it")
        if self._is_done(shard_id):
            return
        parked = self._queued.pop(shard_id, None)
        if parked is not None:
            self._queue.remove(parked)
        else:
            parked = self._dispatch_fresh_until(shard_id)
        if not 0 <= consumed <= parked.size:
            raise InvalidShardRequestError(f"consumed must be in 0..{parked.size} for shard {shard_id}, got {consumed}")
        if done:
            parked.consumed = parked.size
            self._mark_done(parked)
            return
        parked.consumed = max(parked.consumed, consumed)
        if delivery is DeliveryMode.AT_MOST_ONCE:
            # As a shard leased at the read: in use when the position was saved, never handed out again.
            self._mark_failed(parked, _LEASED_AFTER_THE_READ)
            return
        self._queue.append(parked)
        self._queued[shard_id] = parked

    def _dispatch_fresh_until(self, shard_id: int) -> Parked:
        """Take fresh shards in dispatch order up to `shard_id` (one nobody holds and not done, failed
        or queued, so it is ahead), queueing the others taken; returns its shard."""
        passed: list[Parked] = []
        while True:
            parked = self._next_fresh()
            if parked is None:  # pragma: no cover (a known shard nobody holds is done, failed, queued or ahead)
                raise AssertionError(
                    f"shard {shard_id} is neither queued, done, failed nor ahead in the dispatch order"
                )
            if parked.shard_id == shard_id:
                break
            passed.append(parked)
        for other in passed:
            self._queue.append(other)
            self._queued[other.shard_id] = other
        return parked

    def _set_aside_passed(self, queued_at_the_read: set[int]) -> None:
        """Under at-most-once, once every acknowledgement is settled: the shards queued now and not
        at the read were passed on the way to acknowledged ones, so leased after the read and in use
        or used when the position was saved: set aside, as a shard leased at a read is. (Only at the
        end: a shard passed by one acknowledgement may be done by a later one of the same batch.)"""
        if self._spec.delivery is not DeliveryMode.AT_MOST_ONCE:
            return
        passed = [parked for parked in self._queue if parked.shard_id not in queued_at_the_read]
        for parked in passed:
            self._queue.remove(parked)
            del self._queued[parked.shard_id]
            self._mark_failed(parked, _LEASED_AFTER_THE_READ)

    def _restore_internals(
        self,
        *,
        epoch: int,
        cursor: int,
        finished_epochs: int,
        done_total: int,
        perm: array[int] | None,
        books: dict[int, EpochBook],
        queue: list[Parked],
        failed: list[FailedShard],
        next_offset: dict[str, int],
        watermark: dict[str, int],
        next_shard_id: int,
        round_robin: int,
        stream_done: set[int],
        stream_done_floor: int,
    ) -> None:
        self._epoch = epoch
        self._perm = perm
        self._cursor = cursor
        self._finished_epochs = finished_epochs
        self._done_total = done_total
        self._books.update(books)
        for e in sorted(books):
            self._close_epoch_if_complete(e)
        for parked in queue:
            self._queue.append(parked)
            self._queued[parked.shard_id] = parked
        for f in failed:
            self._failed[f.shard.shard_id] = f
        self._next_offset.update(next_offset)
        self._watermark.update(watermark)
        self._next_stream_id = next_shard_id
        self._rr = round_robin
        self._stream_done = stream_done
        self._stream_done_floor = stream_done_floor

    def _restore_leases(
        self,
        leases: list[tuple[str, Parked, float | None]],
        replies: list[tuple[str, str, str, Any]],
    ) -> None:
        """Hold `leases` again, and the replies that go with them.

        A restarted service calls this so that workers which outlived it report on the shards
        they hold, and a report it applied but could not answer is answered, not refused, when
        the worker sends it again. A lease runs a whole lease period from now, or until its
        deadline where one is given (an exact export, `_restart_leases` follows).
        """
        now = self._clock.now()
        for worker, parked, deadline in leases:
            self._lease_versions += 1
            ends = now + self._lease_timeout_s if deadline is None else deadline
            lease = Lease(parked, worker, ends, self._lease_versions)
            self._doing[parked.shard_id] = lease
            self._by_worker.setdefault(worker, set()).add(parked.shard_id)
            heapq.heappush(self._deadlines, (lease.deadline, parked.shard_id, lease.version))
            if deadline is None:
                self._stats_of(worker, now)
        for worker, op, request_id, result in replies:
            self._remember(worker, op, request_id, result)

    def _use_config(self, config: ShardManagerConfig) -> None:
        """Decide by `config` from now on (a registry loaded from a journal written under other settings)."""
        self._config = config
        self._lease_timeout_s = self._spec.lease_timeout_s or config.lease_timeout_s(self._spec.task_type)
        self._max_attempts = self._spec.max_attempts or config.max_attempts
        for replies in self._replies.values():
            while len(replies) > config.request_cache_size:
                replies.popitem(last=False)

    def _restart_leases(self) -> None:
        """Give every lease a whole lease period from now and forget the workers' throughput, as a
        restarted service does: its clock is not the one the deadlines were set on, and its holders
        need time to find it again."""
        now = self._clock.now()
        self._stats = {}
        self._deadlines = []
        for sid, lease in self._doing.items():
            lease.deadline = now + self._lease_timeout_s
            self._deadlines.append((lease.deadline, sid, lease.version))
            self._stats_of(lease.worker, now)
        heapq.heapify(self._deadlines)

    def _export_replies(self, *, every: bool = False) -> list[dict[str, Any]]:
        """Each worker's newest fetch, done and failure reply (what a retry across a restart asks
        again), or, with `every`, every reply remembered, oldest first."""
        out: list[dict[str, Any]] = []
        for worker in sorted(self._replies):
            newest: dict[str, tuple[str, Any]] = {}
            remembered = [(op, (request_id, result)) for (op, request_id), result in self._replies[worker].items()]
            if not every:
                for op, reply in remembered:
                    newest[op] = reply
                remembered = sorted(newest.items())
            for op, (request_id, result) in remembered:
                entry: dict[str, Any] = {"worker": worker, "op": op, "request_id": request_id, "reason": result.reason}
                if isinstance(result, FetchResult):
                    entry["shard_ids"] = [sh.shard_id for sh in result.shards]
                    entry["finished"] = result.finished
                else:
                    entry["changed"] = result.changed
                out.append(entry)
        return out

    # ------------------------------------------------------------------ internals

    def _stats_of(self, worker: str, now: float) -> WorkerStats:
        st = self._stats.get(worker)
        if st is None:
            st = self._stats[worker] = WorkerStats(now)
        return st

    def _cached(self, worker: str, op: str, request_id: str) -> Any:
        if not request_id:
            return None
        replies = self._replies.get(worker)
        return None if replies is None else replies.get((op, request_id))

    def _remember(self, worker: str, op: str, request_id: str, result: Any) -> None:
        if not request_id:
            return
        replies = self._replies.get(worker)
        if replies is None:
            replies = self._replies[worker] = OrderedDict()
        replies[(op, request_id)] = result
        while len(replies) > self._config.request_cache_size:
            replies.popitem(last=False)

    def _permutation(self, epoch: int) -> array[int] | None:
        if not self._spec.shuffle or self._splitter is None:
            return None
        order = list(range(self._splitter.num_shards))
        random.Random(mix_seed(self._spec.seed, epoch)).shuffle(order)
        return array("q", order)

    def _fresh_index(self, position: int) -> int:
        return position if self._perm is None else self._perm[position]

    def _fresh_left(self) -> bool:
        return self._splitter is not None and self._epoch >= 0 and self._cursor < self._splitter.num_shards

    def _fresh_count(self) -> int:
        if self._splitter is None or self._epoch < 0:
            return 0
        return self._splitter.num_shards - self._cursor

    def _more_epochs(self) -> bool:
        if self._splitter is None:
            return False
        return self._spec.num_epochs is None or self._epoch + 1 < self._spec.num_epochs

    def _next_todo(self) -> Parked | None:
        if self._queue:
            parked = self._queue.popleft()
            del self._queued[parked.shard_id]
            return parked
        if self._splitter is not None:
            return self._next_fresh()
        return self._cut_stream_shard()

    def _next_fresh(self) -> Parked | None:
        """The next shard never dispatched (starting the next epoch when this one has none left)."""
        if self._splitter is not None:
            if not self._fresh_left():
                if not self._more_epochs():
                    return None
                self._epoch += 1
                self._perm = self._permutation(self._epoch)
                self._cursor = 0
                self._position_version += 1
                size = self._splitter.num_shards
                self._books[self._epoch] = EpochBook(size, self._epoch * size)
            index = self._fresh_index(self._cursor)
            self._cursor += 1
            start, end = self._splitter.bounds(index)
            order_seed = mix_seed(self._spec.seed, self._epoch, index) if self._spec.shuffle_samples else None
            return Parked(self._epoch * self._splitter.num_shards + index, self._epoch, start, end, order_seed)
        return None

    def _cut_stream_shard(self) -> Parked | None:
        partitions = list(self._watermark)
        for step in range(len(partitions)):
            p = partitions[(self._rr + step) % len(partitions)]
            start = self._next_offset[p]
            if start < self._watermark[p]:
                end = min(start + self._spec.shard_units, self._watermark[p])
                self._next_offset[p] = end
                self._rr = (self._rr + step + 1) % len(partitions)
                sid = self._next_stream_id
                self._next_stream_id += 1
                return Parked(sid, 0, start, end, None, partition=p)
        return None

    def _lease(self, parked: Parked, worker: str, now: float) -> Shard:
        parked.dispatches += 1
        if self._lease_moves_position:
            self._position_version += 1
        self._lease_versions += 1
        lease = Lease(parked, worker, now + self._lease_timeout_s, self._lease_versions)
        self._doing[parked.shard_id] = lease
        self._by_worker.setdefault(worker, set()).add(parked.shard_id)
        heapq.heappush(self._deadlines, (lease.deadline, parked.shard_id, lease.version))
        return parked.to_shard(self._spec.name)

    def _unlease(self, lease: Lease) -> None:
        sid = lease.parked.shard_id
        del self._doing[sid]
        held = self._by_worker[lease.worker]
        held.discard(sid)
        if not held:
            del self._by_worker[lease.worker]
        if len(self._deadlines) > 2 * len(self._doing) + _HEAP_SLACK:
            # Entries of ended leases stay in the heap until their deadline; with long leases and
            # fast dispatch they would pile up, so rebuild from the live leases (amortized O(1)).
            self._deadlines = [(ls.deadline, s, ls.version) for s, ls in self._doing.items()]
            heapq.heapify(self._deadlines)

    def _release(self, lease: Lease, reason: str, *, charge: bool = True) -> str:
        """A lease ended without `done`: re-queue the shard, or fail it (an uncharged end counts no attempt)."""
        self._unlease(lease)
        self._position_version += 1
        parked = lease.parked
        sid = parked.shard_id
        if (
            self._config.done_when_acknowledged
            and self._spec.delivery is DeliveryMode.EXACTLY_ONCE
            and parked.consumed >= parked.size
        ):
            # Every unit was acknowledged and only the done report is missing (its worker died between
            # the two): dispatched again it would yield nothing, and wait out a lease per attempt.
            self._mark_done(parked)
            return f"shard {sid} done: every unit was acknowledged before its lease ended ({reason})"
        at_most_once = self._spec.delivery is DeliveryMode.AT_MOST_ONCE
        if charge:
            parked.failures += 1
        if charge or at_most_once:  # a shard that goes to the failed set keeps why in its history
            parked.reasons.append(reason)
            del parked.reasons[:-MAX_REASONS_KEPT]
        if at_most_once:
            self._mark_failed(parked, "at-most-once: a shard is never dispatched twice")
            return f"shard {sid} moved to the failed set ({reason}); at-most-once never dispatches it again"
        if parked.failures >= self._max_attempts:
            self._mark_failed(parked, f"gave up after {parked.failures} failed attempt(s)")
            return f"shard {sid} moved to the failed set after {parked.failures} failed attempt(s): {reason}"
        if self._spec.delivery is DeliveryMode.AT_LEAST_ONCE:
            parked.consumed = 0
        self._queue.append(parked)
        self._queued[sid] = parked
        return f"shard {sid} back in the queue at {parked.consumed}/{parked.size} ({reason})"

    def _mark_failed(self, parked: Parked, final: str) -> None:
        reasons = (*parked.reasons, final)
        self._failed[parked.shard_id] = FailedShard(parked.to_shard(self._spec.name), reasons)
        book = self._books.get(parked.epoch) if not self._stream else None
        if book is not None:
            book.failed += 1
            self._close_epoch_if_complete(parked.epoch)

    def _mark_done(self, parked: Parked) -> None:
        self._done_total += 1
        self._position_version += 1
        if self._stream:
            self._stream_done.add(parked.shard_id)
            if len(self._stream_done) > _STREAM_PRUNE_AT:
                self._prune_stream_done()
            return
        book = self._books[parked.epoch]
        book.add_done(parked.shard_id)
        self._close_epoch_if_complete(parked.epoch)

    def _close_epoch_if_complete(self, epoch: int) -> None:
        book = self._books[epoch]
        if book.complete:
            del self._books[epoch]
            self._finished_epochs += 1

    def _prune_stream_done(self) -> None:
        # Stream shard ids grow; ids below every outstanding one are all done or failed, so they
        # collapse into a floor and memory stays bounded on an unbounded stream.
        outstanding = [*self._doing, *self._queued, self._next_stream_id]
        floor = min(outstanding)
        self._stream_done = {s for s in self._stream_done if s >= floor}
        self._stream_done_floor = max(self._stream_done_floor, floor)

    def _is_done(self, sid: int) -> bool:
        if self._stream:
            return sid in self._stream_done or (sid < self._stream_done_floor and sid not in self._failed)
        assert self._splitter is not None
        epoch = sid // self._splitter.num_shards
        book = self._books.get(epoch)
        if book is not None:
            return book.is_done(sid)
        return epoch <= self._epoch and sid not in self._failed

    def _known(self, sid: int) -> bool:
        if sid < 0:
            return False
        if self._stream:
            return sid < self._next_stream_id
        assert self._splitter is not None
        epochs = self._spec.num_epochs
        return epochs is None or sid < epochs * self._splitter.num_shards

    def _held(self, worker: str, sid: int, what: str) -> Lease:
        lease = self._doing.get(sid)
        if lease is not None and lease.worker == worker:
            return lease
        name = self._spec.name
        if not self._known(sid):
            raise UnknownShardError(f"dataset {name!r} has no shard {sid}")
        if lease is not None:
            raise ShardStateError(f"{what} for shard {sid} rejected: it is leased to another worker, not {worker!r}")
        if sid in self._failed:
            raise ShardStateError(f"{what} for shard {sid} rejected: it is in the failed set")
        if self._is_done(sid):
            raise ShardStateError(f"{what} for shard {sid} rejected: it is already done")
        if sid in self._queued:
            raise ShardStateError(
                f"{what} for shard {sid} rejected: worker {worker!r} does not hold it (its lease ended; it is queued)"
            )
        raise ShardStateError(f"{what} for shard {sid} rejected: worker {worker!r} does not hold it (not dispatched)")

    def _fetch_reason(self, got: int, asked: int, finished: bool) -> str:
        if got == asked:
            return f"leased {got} shard(s)"
        if finished:
            return f"leased {got} of {asked}: dataset {self._spec.name!r} is finished"
        if self._stream:
            return f"leased {got} of {asked}: no more stream records yet; ask again later"
        return (
            f"leased {got} of {asked}: the last epoch is handed out and {len(self._doing)} shard(s) are leased; "
            "ask again later in case one comes back"
        )

    def _parked_json(self, parked: Parked) -> dict[str, Any]:
        return {
            "shard_id": parked.shard_id,
            "epoch": parked.epoch,
            "start": parked.start,
            "end": parked.end,
            "consumed": parked.consumed,
            "order_seed": parked.order_seed,
            "partition": parked.partition,
            "dispatches": parked.dispatches,
            "failures": parked.failures,
            "reasons": list(parked.reasons),
        }

    @staticmethod
    def _failed_json(f: FailedShard) -> dict[str, Any]:
        s = f.shard
        return {
            "shard_id": s.shard_id,
            "epoch": s.epoch,
            "start": s.start,
            "end": s.end,
            "consumed": s.consumed,
            "order_seed": s.order_seed,
            "partition": s.partition,
            "dispatches": s.attempt,
            "reasons": list(f.reasons),
        }


def check_acknowledgements(acknowledged: Sequence[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
    """Checked `(shard_id, consumed, done)` entries, each shard at most once.

    Raises:
        InvalidShardRequestError: an entry is not of that shape, or a shard is named twice.
    """
    entries: list[tuple[int, int, bool]] = []
    seen: set[int] = set()
    for i, entry in enumerate(acknowledged):
        if not isinstance(entry, (tuple, list)) or len(entry) != 3 or not isinstance(entry[2], bool):
            raise InvalidShardRequestError(f"acknowledgement {i} must be (shard_id, consumed, done), got {entry!r}")
        shard_id = check_int("shard_id", entry[0])
        consumed = check_int("consumed", entry[1])
        if shard_id in seen:
            raise InvalidShardRequestError(f"shard {shard_id} is acknowledged twice in one request")
        seen.add(shard_id)
        entries.append((shard_id, consumed, entry[2]))
    return entries
