"""The worker side of ShardService: deadlines, bounded retries and background prefetch.

Every call is retried (on UNAVAILABLE and DEADLINE_EXCEEDED, within the retry policy's bounds)
because every call is safe to repeat: fetch, done, failure and restore send a fresh request id
that is reused by each retry of the same call, so the server answers a repeat with its first
reply; progress carries an absolute position; reads change nothing. A master journals its
leases and each worker's newest replies, so a retry that reaches a *restarted* master is
answered as the first one was.

A master restart does not fail a step. Under `dlrover-run` every call retries an unreachable
master as long as the agent keeps its node training without one (`master_retry_policy`).
Reports (progress, done, failure) are tried once and, when the master cannot be reached, queued
and delivered in order by a background thread, so training goes on with the shards it holds and
prefetched; a call that reads the master's state (a checkpoint, a restore, the status, removing
a worker, registering) first waits until the queue is delivered, so it sees every report made
before it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
import grpc

from dlrover.common import (
    RETRYABLE_CODES,
    ChannelConfig,
    Clock,
    ConfigError,
    RetryPolicy,
    RpcError,
    SystemClock,
    call_unary,
    create_channel,
    master_channel_config,
    master_retry_policy,
)
from dlrover.common.validators import non_negative, positive
from dlrover.shard._report_queue import ReportQueue
from dlrover.shard.config import DatasetSpec
from dlrover.shard.convert import shard_from_proto, spec_to_proto, status_from_proto
from dlrover.shard.results import (
    DatasetStatus,
    FetchResult,
    RegisterResult,
    ReportResult,
    RestoreResult,
    SyncResult,
)
from dlrover.shard.shard import Shard
from dlrover.shard.v1 import shard_pb2 as pb
from dlrover.shard.v1 import shard_pb2_grpc

__all__ = ["ShardClient", "ShardClientConfig"]

_log = logging.getLogger(__name__)


@attrs.frozen
class ShardClientConfig:
    """How a worker talks to ShardService.

    Attributes:
        retry: deadline per attempt and retry bounds of every call. The default waits for an
            unreachable master as long as the node's agent does (see `master_retry_policy`).
        channel: how to dial; None (the default): `master_channel_config()` when the client is
            made, i.e. TLS as the ``DLROVER_MASTER_TLS_*`` variables say (`dlrover-run` sets them
            for its workers), else plaintext.
        fetch_count: shards asked for per fetch.
        prefetch_shards: shards kept leased ahead in a background thread; 0 fetches on demand.
            Buffered shards are leased, so keep this small.
        poll_interval_s: wait before asking again when no shard is available yet.
        renew_interval_s: how often the prefetch thread renews the leases of buffered shards, and
            the longest a shard handed out (in use) goes without a report before a background
            thread renews its lease (an evaluation or a save between two commits); keep it well
            under the lease timeout.
        keep_alive_s: how long a shard in use is kept leased without a report of this worker;
            past it the lease is left to run out, so the rest of a shard a trainer abandoned (a
            pass ended early) or that a stuck trainer holds goes back to the queue. 0: never
            renewed, the lease alone decides.
        queue_reports: queue a report the master cannot take now and deliver it in the
            background (in order), instead of waiting for the master in the caller's thread.
    """

    retry: RetryPolicy = attrs.field(factory=master_retry_policy)
    channel: ChannelConfig | None = None
    fetch_count: int = attrs.field(default=1, validator=positive)
    prefetch_shards: int = attrs.field(default=1, validator=non_negative)
    poll_interval_s: float = attrs.field(default=0.2, validator=positive)
    renew_interval_s: float = attrs.field(default=10.0, validator=positive)
    keep_alive_s: float = attrs.field(default=1800.0, validator=non_negative)
    queue_reports: bool = True


class ShardClient:
    """One worker's connection to the shard service for one dataset.

    Args:
        target: `host:port` of the service.
        token: the job token.
        dataset: the dataset this client reads.
        worker: this worker's id (leases are held in its name).
        config: deadlines, retries and prefetch.
        clock: time source for retry back-off and on-demand polling.

    Use as a context manager, or call `close()`.
    """

    def __init__(
        self,
        target: str,
        token: str,
        dataset: str,
        worker: str,
        *,
        config: ShardClientConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not dataset or not worker:
            raise ConfigError(f"a shard client needs a dataset and a worker id, got {dataset!r} and {worker!r}")
        self._config = config or ShardClientConfig()
        self._clock = clock or SystemClock()
        self._dataset = dataset
        self._worker = worker
        channel = self._config.channel if self._config.channel is not None else master_channel_config()
        self._channel = create_channel(target, token, channel)
        self._stub: Any = shard_pb2_grpc.ShardServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._cond = threading.Condition()
        self._buffer: deque[Shard] = deque()
        # Grows with every restore or discard of the buffer: a fetch the prefetch thread sent before one
        # may have been served before it (its leases dropped by it) or after it (leases of the restored
        # state), so its shards are checked before they are handed out.
        self._buffer_generation = 0
        # When shards leased ahead by `checkpoint(lease_next=True)` were leased: an on-demand client
        # has no thread renewing them, so one kept past `renew_interval_s` is renewed when taken.
        # The keep-alive thread renews them meanwhile (for `keep_alive_s` at most), as it renews
        # shards in use: (last renewed, first leased) by (shard id, dispatch).
        self._leased_at: dict[tuple[int, int], tuple[float, float]] = {}
        self._finished = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # `lease_ahead`'s fetch, out (on a thread kept for it) while training goes on; whatever next
        # touches the buffer waits for it.
        self._ahead_out = False
        self._ahead_error: BaseException | None = None
        self._ahead_thread: threading.Thread | None = None
        # Shards handed out and not yet reported done or failed: the shard, when this worker last
        # reported on it (or took it) and when its lease was last renewed. The keep-alive thread
        # renews one left idle too long, so a pause between commits longer than the lease does not
        # give the shard to another worker (for `keep_alive_s` at most).
        self._in_use: dict[int, tuple[Shard, float, float]] = {}
        self._keepalive: threading.Thread | None = None
        self._closed = False
        # Request ids: one random prefix per client and a counter, unique without a syscall per call.
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()
        self._reports = ReportQueue(_sender(self._config.retry, self._clock), f"shard-reports-{worker}", self._clock)
        # A script that exits without closing still delivers its queued reports first.
        self._deliver_at_exit = weakref.finalize(self, self._reports.close, self._config.retry.total_timeout_s)
        self._first_try = attrs.evolve(self._config.retry, max_attempts=1)

    @property
    def worker(self) -> str:
        """This client's worker id."""
        return self._worker

    @property
    def dataset(self) -> str:
        """The dataset this client reads."""
        return self._dataset

    def _request_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids)}"

    def _call(self, method: Any, request: Any) -> Any:
        return call_unary(method, request, idempotent=True, policy=self._config.retry, clock=self._clock)

    def _read(self, method: Any, request: Any) -> Any:
        """A call that must see every report made before it: queued reports go first."""
        self._reports.drain(None)
        return self._call(method, request)

    def _report(self, method: Any, request: Any, what: str) -> ReportResult:
        # This report is sent or queued first; then an earlier queued report's failure is raised,
        # so the caller hears of it without this one being lost.
        result = self._send_or_queue(method, request, what)
        self._reports.raise_error()
        return result

    def _send_or_queue(self, method: Any, request: Any, what: str) -> ReportResult:
        if not self._config.queue_reports:
            res = self._call(method, request)
            return ReportResult(res.changed, res.reason)
        if self._reports.busy():
            self._reports.put(method, request, what)
            return ReportResult(False, f"{what} queued behind earlier reports", pending=True)
        try:
            res = call_unary(method, request, idempotent=True, policy=self._first_try, clock=self._clock)
        except RpcError as exc:
            if exc.code not in RETRYABLE_CODES:
                raise
            self._reports.put(method, request, what)
            return ReportResult(False, f"{what} queued: {exc.code.name} from the master", pending=True)
        return ReportResult(res.changed, res.reason)

    # ------------------------------------------------------------------ requests

    def register(self, spec: DatasetSpec) -> RegisterResult:
        """Register `spec` (a no-op when the identical spec is registered).

        Raises:
            RpcError: INVALID_ARGUMENT for a bad spec, FAILED_PRECONDITION for a different spec
                under the same name, or a transport failure after retries.
        """
        res = self._read(self._stub.RegisterDataset, pb.RegisterDatasetRequest(spec=spec_to_proto(spec)))
        return RegisterResult(res.created, res.reason)

    def fetch(self, count: int | None = None) -> FetchResult:
        """Lease up to `count` shards now (bypassing the prefetch buffer)."""
        self._reports.raise_error()
        return self._fetch_shards(self._config.fetch_count if count is None else count)

    def _fetch_shards(self, count: int) -> FetchResult:
        req = pb.FetchShardsRequest(
            dataset=self._dataset, worker=self._worker, count=count, request_id=self._request_id()
        )
        res = self._call(self._stub.FetchShards, req)
        return FetchResult(tuple([shard_from_proto(s) for s in res.shards]), res.finished, res.reason)

    def lease_ahead(self) -> bool:
        """Start leasing the next `fetch_count` shards on a background thread, for `next_shard`
        (an on-demand client, `prefetch_shards=0`, holding no buffered shard): the call is out
        while the caller trains, rather than in its way when it needs the next shard.

        For a caller that must decide *when* a lease is asked for, which a prefetch thread does
        not let it: `ShardSampler` with a process group leases the next step's shard only after
        a collective that follows every trainer's lease of this step, so each step's shards are
        the same whatever the trainers' speeds (see `dlrover/shard/torch_data.py`).

        The next `next_shard`, `sync`, `checkpoint`, `restore`, `discard_buffered`, `buffered` and
        `close` first wait for the fetch; its failure is raised by the next `next_shard` (once).
        Shards leased ahead are buffered as `checkpoint(lease_next=True)` buffers them.

        Returns:
            Whether a fetch was started (not by a prefetching or closed client, nor while one is
            out, a shard is buffered or the last one's failure is still to be raised).
        """
        with self._cond:
            busy = self._buffer or self._ahead_out or self._ahead_error is not None
            if self._config.prefetch_shards > 0 or self._closed or busy:
                return False
            self._ahead_out = True
            if self._ahead_thread is None:  # one for the client's life: a thread a step costs 0.1 ms of CPU
                self._ahead_thread = threading.Thread(
                    target=self._lease_ahead_loop, name=f"shard-lease-ahead-{self._worker}", daemon=True
                )
                self._ahead_thread.start()
            self._cond.notify_all()
            return True

    def _lease_ahead_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ahead_out or self._stop.is_set())
                if not self._ahead_out:
                    return  # closed
            leased_at = self._clock.now()
            shards: tuple[Shard, ...] = ()
            error: BaseException | None = None
            try:
                # Not `fetch`: a queued report's failure is the caller's to hear at its next report
                # or read, not this thread's to take.
                shards = self._fetch_shards(self._config.fetch_count).shards
            except BaseException as exc:  # raised to the caller of next_shard, not swallowed
                error = exc
            with self._cond:
                for shard in shards:
                    self._buffer.append(shard)
                    self._leased_at[shard.shard_id, shard.attempt] = (leased_at, leased_at)
                if error is not None:
                    self._ahead_error = error
                self._ahead_out = False
                self._cond.notify_all()

    def settle_lease_ahead(self) -> None:
        """Wait for `lease_ahead`'s fetch, if one is out: once this returns, the service has served
        it (its shards are buffered) or it failed (raised by the next `next_shard`)."""
        self._join_ahead()

    def _join_ahead(self, timeout_s: float | None = None) -> bool:
        """Wait for `lease_ahead`'s fetch (up to `timeout_s`); whether none is out now."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._ahead_out, timeout_s)

    def next_shard(self, timeout_s: float | None = None) -> Shard | None:
        """The next shard to work on, waiting while none is available; None when the dataset is finished.

        Args:
            timeout_s: the longest wait; None waits until a shard comes or the dataset finishes.

        Raises:
            TimeoutError: `timeout_s` passed with no shard.
            RpcError: a call failed for good (also when the prefetch thread's call did).
        """
        if self._config.prefetch_shards == 0:
            give_up = None if timeout_s is None else self._clock.now() + timeout_s
            if not self._join_ahead(timeout_s):
                raise TimeoutError(f"no shard of {self._dataset!r} within {timeout_s}s: a lease asked for ahead is out")
            with self._cond:
                error, self._ahead_error = self._ahead_error, None
                buffered = bool(self._buffer)
            if error is not None:
                if not buffered:
                    raise error
                # A later lease (a sync's) brought a shard: the failure cost nothing, so it is said, not raised.
                _log.warning("a lease asked for ahead failed; a later one brought a shard: %s", error)
            shard = self._next_on_demand(None if give_up is None else max(give_up - self._clock.now(), 0.0))
            if shard is None:
                return None
            with self._cond:
                return self._hand_out(shard)
        self._start_prefetch()
        with self._cond:
            ok = self._cond.wait_for(lambda: self._buffer or self._finished or self._error is not None, timeout_s)
            if self._buffer:
                shard = self._buffer.popleft()
                self._cond.notify_all()
                return self._hand_out(shard)
            if self._error is not None:
                raise self._error
            if self._finished:
                return None
            assert not ok
            raise TimeoutError(f"no shard of {self._dataset!r} within {timeout_s}s")

    def report_progress(self, shard_id: int, consumed: int) -> ReportResult:
        """Renew the shard's lease and record (under exactly-once: acknowledge) `consumed` units.

        Returns a result with `pending` set when the master could not be reached and the report
        was queued (see the module's notes); the error of a queued report that the master
        refuses is raised by this client's next call.
        """
        req = pb.ReportProgressRequest(
            dataset=self._dataset,
            worker=self._worker,
            shard_id=shard_id,
            consumed=consumed,
            request_id=self._request_id(),
        )
        self._renewed(shard_id)
        return self._report(self._stub.ReportProgress, req, f"progress {consumed} of shard {shard_id}")

    def report_done(self, shard_id: int) -> ReportResult:
        """Record that the shard is used up (queued, as `report_progress`, while the master is away)."""
        req = pb.ReportDoneRequest(
            dataset=self._dataset, worker=self._worker, shard_id=shard_id, request_id=self._request_id()
        )
        self._put_down(shard_id)
        return self._report(self._stub.ReportDone, req, f"done of shard {shard_id}")

    def report_failure(self, shard_id: int, reason: str, consumed: int | None = None) -> ReportResult:
        """Give the shard back as failed (with a last acknowledged position, optionally).

        Queued, as `report_progress`, while the master is away.
        """
        req = pb.ReportFailureRequest(
            dataset=self._dataset, worker=self._worker, shard_id=shard_id, reason=reason, request_id=self._request_id()
        )
        if consumed is not None:
            req.consumed = consumed
        self._put_down(shard_id)
        return self._report(self._stub.ReportFailure, req, f"failure of shard {shard_id}")

    def report_each(self, acknowledged: Sequence[tuple[int, int, bool]]) -> None:
        """Report `(shard_id, consumed, done)` acknowledgements one call each: a done report, or a
        progress report at `consumed` (queued, as those are, while the master is away)."""
        for shard_id, consumed, done in acknowledged:
            if done:
                self.report_done(shard_id)
            else:
                self.report_progress(shard_id, consumed)

    def flush_reports(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued report is delivered; True when none is left.

        Raises:
            RpcError: a queued report was refused or could not be delivered in time.
        """
        return self._reports.drain(timeout_s)

    @property
    def buffered(self) -> int:
        """Shards leased ahead and not handed out yet (after `lease_ahead`'s fetch, if one is out)."""
        self._join_ahead()
        with self._cond:
            return len(self._buffer)

    @property
    def queued_reports(self) -> int:
        """Reports waiting for the master."""
        return len(self._reports)

    def remove_worker(self, worker: str | None = None, reason: str = "worker removed") -> dict[str, list[int]]:
        """Take back every shard `worker` (default: this one) holds; returns dataset -> shard ids."""
        res = self._read(self._stub.RemoveWorker, pb.RemoveWorkerRequest(worker=worker or self._worker, reason=reason))
        return {r.dataset: list(r.shard_ids) for r in res.released}

    def checkpoint(self, *, lease_next: bool = False) -> str:
        """The dataset's progress checkpoint (JSON), after every report made before it is delivered.

        Args:
            lease_next: an on-demand client (`prefetch_shards=0`) holding no buffered shard also
                leases its next `fetch_count` shards in the same call, after the read (so the
                document does not hold them, except when a retry is answered from the master's
                reply cache: then it holds them as leased, as a read while a prefetched shard is
                held does, which exactly-once and at-least-once restores hand out again), and
                buffers them for `next_shard`: a training loop that reads its data position after
                every step then needs no call of its own to fetch the next step's shard. A buffered
                shard taken more than `renew_interval_s` after the read is renewed first (leased
                again when its lease ended). Ignored by a prefetching client, whose thread leases
                ahead already. Unused buffered shards go back as `close` says (each counts as one
                failed attempt of that shard).
        """
        self._join_ahead()
        with self._cond:
            lease_next = lease_next and self._config.prefetch_shards == 0 and not self._buffer and not self._closed
        if not lease_next:
            return str(self._read(self._stub.GetCheckpoint, pb.GetCheckpointRequest(dataset=self._dataset)).document)
        req = pb.FetchShardsRequest(
            dataset=self._dataset,
            worker=self._worker,
            count=self._config.fetch_count,
            request_id=self._request_id(),
            with_checkpoint=True,
        )
        leased_at = self._clock.now()
        res = self._read(self._stub.FetchShards, req)
        with self._cond:
            for shard in res.shards:
                self._buffer.append(shard_from_proto(shard))
                self._leased_at[shard.shard_id, shard.attempt] = (leased_at, leased_at)
        if not res.checkpoint:
            # A master older than `with_checkpoint` leased without reading: read it now (the
            # document then holds the lease, as one read while a prefetched shard is held does).
            return str(self._read(self._stub.GetCheckpoint, pb.GetCheckpointRequest(dataset=self._dataset)).document)
        return str(res.checkpoint)

    def note_in_use(self, shard_id: int) -> None:
        """This worker still uses `shard_id` (it acknowledged samples of it that it reports later):
        the keep-alive goes on renewing its lease (see `ShardClientConfig.keep_alive_s`)."""
        self._renewed(shard_id)

    def sync(self, acknowledged: Sequence[tuple[int, int, bool]], lease: int) -> SyncResult:
        """Report a batch of acknowledgements, read the data position after them, and lease up to
        `lease` shards ahead (0: none; a service older than batches refuses 0), in one call (for a
        trainer that acknowledges in batches and saves its position with every step: `ShardSampler`
        with a process group).

        The leased shards are buffered for `next_shard` (as `checkpoint(lease_next=True)` buffers
        them; a buffered shard taken more than `renew_interval_s` later is renewed first); a
        prefetching client, whose thread leases ahead, and a closed one lease nothing here. Queued
        reports are delivered first. A service older than batched acknowledgements ignores them
        (it says so by applying none): they are then reported one by one and the position read again.

        Args:
            acknowledged: `(shard_id, consumed, done)` per shard this worker holds: its first
                `consumed` units used, or (`done`) all of them.
            lease: shards to lease ahead.

        Raises:
            ConfigError: `lease` is not an integer >= 0.
            RpcError: the service refused the batch (a shard this worker does not hold, a bad
                position: nothing of it was applied) or could not be reached.
        """
        if not isinstance(lease, int) or isinstance(lease, bool) or lease < 0:
            raise ConfigError(f"lease must be an integer >= 0, got {lease!r}")
        self._join_ahead()
        with self._cond:
            if self._config.prefetch_shards > 0 or self._closed:
                lease = 0  # the prefetch thread leases ahead (a closed client leases nothing)
        req = pb.FetchShardsRequest(
            dataset=self._dataset,
            worker=self._worker,
            count=lease,
            request_id=self._request_id(),
            with_checkpoint=True,
            acknowledged=[pb.Acknowledgement(shard_id=s, consumed=c, done=d) for s, c, d in acknowledged],
        )
        leased_at = self._clock.now()
        res = self._read(self._stub.FetchShards, req)
        for shard_id, _consumed, done in acknowledged:
            if done:
                self._put_down(shard_id)
            else:
                self._renewed(shard_id)
        with self._cond:
            for shard in res.shards:
                self._buffer.append(shard_from_proto(shard))
                self._leased_at[shard.shard_id, shard.attempt] = (leased_at, leased_at)
        document = str(res.checkpoint)
        if acknowledged and res.acknowledged != len(acknowledged):
            # A service that predates the field: it leased and read, and dropped the batch. Reported
            # one by one now; the read below delivers any the master could not take at once first.
            self.report_each(acknowledged)
            document = ""
        if not document:
            document = str(
                self._read(self._stub.GetCheckpoint, pb.GetCheckpointRequest(dataset=self._dataset)).document
            )
        return SyncResult(document, None if res.todo < 0 else int(res.todo))

    def discard_buffered(self) -> int:
        """Forget buffered shards without reporting them: for a trainer whose data position
        another trainer restored, which dropped every lease and may have made the dataset
        unfinished again. Returns how many were forgotten."""
        return self._forget_leases()

    def _forget_leases(self) -> int:
        """Drop the buffered and in-use shards, whose leases a restore dropped; returns how many were buffered."""
        self._join_ahead()  # a fetch still out would buffer its shards after this
        with self._cond:
            if self._ahead_error is not None:
                # Its lease would have been dropped with the rest: nothing of it is left to raise for.
                _log.warning("a lease asked for ahead failed before its leases were dropped: %s", self._ahead_error)
                self._ahead_error = None
            count = len(self._buffer)
            self._buffer.clear()
            self._leased_at.clear()
            self._in_use.clear()
            self._finished = False
            self._buffer_generation += 1
            self._cond.notify_all()  # a prefetch thread refills now, not at its next renewal
        return count

    def restore(self, document: str) -> RestoreResult:
        """Restore the dataset from a progress checkpoint; drops this client's buffered shards."""
        self._join_ahead()  # its leases, served before the restore, are among those the restore drops
        req = pb.RestoreCheckpointRequest(document=document, dataset=self._dataset, request_id=self._request_id())
        res = self._read(self._stub.RestoreCheckpoint, req)
        self._forget_leases()
        return RestoreResult(res.dataset, res.returned_to_queue, res.reason)

    def status(self) -> DatasetStatus:
        """Counts and per-worker throughput of the dataset."""
        return status_from_proto(self._read(self._stub.GetStatus, pb.GetStatusRequest(dataset=self._dataset)))

    # ------------------------------------------------------------------ lifecycle

    def close(self, return_buffered: bool = True) -> None:
        """Stop prefetching and close the channel; safe to call twice.

        Args:
            return_buffered: report buffered, unused shards as failed so they are re-queued at
                once instead of when their leases expire (each counts as one failed attempt).
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._join_ahead()  # its shards are returned below with the other buffered ones
        if self._ahead_error is not None:  # nobody asked for the next shard to hear of it
            _log.warning("a lease asked for ahead failed before the client closed: %s", self._ahead_error)
            self._ahead_error = None
        if self._ahead_thread is not None:
            self._ahead_thread.join()  # it ends once nothing is out and the client is stopped
        if self._keepalive is not None:
            self._keepalive.join()
        self._deliver_at_exit()
        if return_buffered:
            for shard in list(self._buffer):
                try:
                    self.report_failure(shard.shard_id, "leased ahead and returned unused when the client closed")
                except Exception as exc:  # the lease will expire; say so rather than hide it
                    _log.warning("could not return prefetched shard %d: %s", shard.shard_id, exc)
        self._buffer.clear()
        self._channel.close()

    def __enter__(self) -> ShardClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _next_on_demand(self, timeout_s: float | None) -> Shard | None:
        give_up = None if timeout_s is None else self._clock.now() + timeout_s
        while True:
            with self._cond:
                shard = self._buffer.popleft() if self._buffer else None
                entry = None if shard is None else self._leased_at.pop((shard.shard_id, shard.attempt), None)
                leased_at = None if entry is None else entry[0]
            if shard is not None:
                if leased_at is None or self._still_leased(shard, leased_at):
                    return shard
                continue  # its lease ran out while it waited: another buffered one, or a fetch
            res = self.fetch()
            if res.shards:
                with self._cond:
                    self._buffer.extend(res.shards[1:])
                return res.shards[0]
            if res.finished:
                return None
            if give_up is not None and self._clock.now() + self._config.poll_interval_s > give_up:
                raise TimeoutError(f"no shard of {self._dataset!r} within {timeout_s}s: {res.reason}")
            self._clock.sleep(self._config.poll_interval_s)

    def _still_leased(self, shard: Shard, leased_at: float) -> bool:
        """Renew the lease of a shard leased ahead when it waited past `renew_interval_s` (a save or
        an evaluation between the read that leased it and the step that uses it); False when the
        lease is gone (expired, or restored away), so the shard must not be trained."""
        if self._clock.now() - leased_at < self._config.renew_interval_s:
            return True
        if self._renew_lease(shard):
            return True
        _log.info("shard %d was leased ahead and its lease ended before use", shard.shard_id)
        return False

    def _renew_lease(self, shard: Shard) -> bool:
        """Renew a buffered shard's lease (progress at its own position; waits for the master);
        False when the lease is gone (expired, or restored away): the shard must not be handed out."""
        req = pb.ReportProgressRequest(
            dataset=self._dataset,
            worker=self._worker,
            shard_id=shard.shard_id,
            consumed=shard.consumed,
            request_id=self._request_id(),
            # This dispatch only: a lease that ended and came back to this worker is another one.
            attempt=shard.attempt,
        )
        try:
            self._call(self._stub.ReportProgress, req)
        except RpcError as exc:
            if exc.code is grpc.StatusCode.FAILED_PRECONDITION:
                return False
            raise
        return True

    def holds(self, shard: Shard) -> bool:
        """Whether this worker still holds the lease of `shard`, a shard it was handed out, renewing it if so.

        False when the lease is gone (it expired, or was restored away, and the service may have given the shard
        to another worker): its samples must not be trained here. The renewal is a progress report at the
        position the shard was handed out at, so it acknowledges nothing.

        Raises:
            RpcError: the service could not say (unreachable past the retries, or another refusal).
        """
        if self._renew_lease(shard):
            self._renewed(shard.shard_id, reported=False)
            return True
        self._put_down_dispatch(shard)
        return False

    def _hand_out(self, shard: Shard) -> Shard:
        """Record `shard` as in use (lock held) and see that its lease is kept alive; returns it."""
        now = self._clock.now()
        self._in_use[shard.shard_id] = (shard, now, now)
        if self._keepalive is None and not self._closed and self._config.keep_alive_s > 0:
            self._keepalive = threading.Thread(
                target=self._keepalive_loop, name=f"shard-keepalive-{self._worker}", daemon=True
            )
            self._keepalive.start()
        return shard

    def _renewed(self, shard_id: int, *, reported: bool = True) -> None:
        with self._cond:
            held = self._in_use.get(shard_id)
            if held is not None:
                now = self._clock.now()
                self._in_use[shard_id] = (held[0], now if reported else held[1], now)

    def _put_down(self, shard_id: int) -> None:
        with self._cond:
            self._in_use.pop(shard_id, None)

    def _put_down_dispatch(self, shard: Shard) -> None:
        """Put down `shard` if that dispatch of it is the one in use (not a newer lease of the same shard)."""
        with self._cond:
            entry = self._in_use.get(shard.shard_id)
            if entry is not None and entry[0] is shard:
                del self._in_use[shard.shard_id]

    def _keepalive_loop(self) -> None:
        interval, limit = self._config.renew_interval_s, self._config.keep_alive_s
        while not self._stop.wait(interval / 2):
            now = self._clock.now()
            with self._cond:
                for shard_id, (_shard, reported, _renewed) in list(self._in_use.items()):
                    if now - reported >= limit:
                        del self._in_use[shard_id]  # abandoned or stuck: its lease decides from here
                idle = [shard for shard, _reported, renewed in self._in_use.values() if now - renewed >= interval]
                # Shards leased ahead and not taken yet (a long save or evaluation before the next
                # step): renewed alike, so a pause does not cost them their lease and an attempt.
                ahead = [
                    (shard, entry)
                    for shard in self._buffer
                    if (entry := self._leased_at.get((shard.shard_id, shard.attempt))) is not None
                    and now - entry[0] >= interval
                    and now - entry[1] < limit
                ]
            for shard in idle:
                held = self._renew_in_background(shard, "in use")
                if held:
                    self._renewed(shard.shard_id, reported=False)
                elif held is not None:
                    # Reported done through another client (a DataLoader worker's shard, committed by
                    # the main process), expired, or restored away: nothing more to keep alive.
                    _log.debug("shard %d is no longer leased to %s; its keep-alive ends", shard.shard_id, self._worker)
                    self._put_down_dispatch(shard)
            for shard, picked in ahead:
                held = self._renew_in_background(shard, "leased ahead")
                key = (shard.shard_id, shard.attempt)
                with self._cond:
                    # The same lease, not a newer one under the same key (a restore returned the
                    # shard and a lease after it got it again as the same attempt): the master's
                    # answer was about the lease picked.
                    if held is None or self._leased_at.get(key) is not picked:
                        continue  # taken, dropped or leased anew meanwhile, or the master could not say
                    if held:
                        self._leased_at[key] = (self._clock.now(), picked[1])
                    else:  # expired or restored away: never handed out
                        del self._leased_at[key]
                        for index, buffered in enumerate(self._buffer):
                            if buffered is shard:
                                del self._buffer[index]
                                break

    def _renew_in_background(self, shard: Shard, what: str) -> bool | None:
        """Renew `shard`'s lease from the keep-alive thread: whether this worker still holds it, or
        None when the master could not be asked (the next pass tries again)."""
        try:
            # At the position it was handed out at: positions only move forward, so this
            # acknowledges nothing and only renews the lease.
            return self._renew_lease(shard)
        except Exception as exc:
            # Only the master's "not held" (False above) ends a lease here: an overloaded or
            # restarting master, or a defect, says nothing about it, and dropping a lease this
            # worker still holds would leave its shard unserved until the lease expires (an
            # attempt charged) or, for a shard in use, let it be served twice.
            _log.warning("could not renew the lease of shard %d %s: %s", shard.shard_id, what, exc)
            return None

    def _start_prefetch(self) -> None:
        # A thread that ended at the end of the data is started again after a restore.
        if (self._thread is None or not self._thread.is_alive()) and not self._closed and not self._finished:
            self._thread = threading.Thread(
                target=self._prefetch_loop, name=f"shard-prefetch-{self._worker}", daemon=True
            )
            self._thread.start()

    def _prefetch_loop(self) -> None:
        last_renew = self._clock.now()
        try:
            while not self._stop.is_set():
                with self._cond:
                    want = self._config.prefetch_shards - len(self._buffer)
                    finished = self._finished
                    generation = self._buffer_generation
                if self._clock.now() - last_renew >= self._config.renew_interval_s:
                    self._renew_buffered()
                    last_renew = self._clock.now()
                if want > 0 and not finished:
                    res = self.fetch(min(want, max(self._config.fetch_count, 1)))
                    with self._cond:
                        current = generation == self._buffer_generation
                        if current:
                            self._buffer.extend(res.shards)
                            self._finished = res.finished and not res.shards
                            self._cond.notify_all()
                        generation = self._buffer_generation
                    if not current:
                        # A restore or discard came while the fetch was out: keep only the shards
                        # still leased to this worker (leased after it, not dropped by it).
                        held = [s for s in res.shards if self._renew_lease(s)]
                        with self._cond:
                            if generation == self._buffer_generation:  # (another came meanwhile: drop)
                                self._buffer.extend(held)
                                self._cond.notify_all()
                    if res.shards or not current:
                        continue
                    if res.finished:
                        return
                    self._stop.wait(self._config.poll_interval_s)
                    continue
                with self._cond:
                    self._cond.wait_for(
                        lambda: self._stop.is_set() or len(self._buffer) < self._config.prefetch_shards,
                        self._config.renew_interval_s,
                    )
        except BaseException as exc:  # surfaced to the caller of next_shard, not swallowed
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _renew_buffered(self) -> None:
        with self._cond:
            shards = list(self._buffer)
        for shard in shards:
            # Waits for the master in this background thread: a renewal is not worth queuing.
            if not self._renew_lease(shard):
                with self._cond:
                    if shard in self._buffer:
                        self._buffer.remove(shard)


def _sender(policy: RetryPolicy, clock: Clock) -> Any:
    """How queued reports are sent: retried as the client's calls are.

    It must not refer to the client: the exit-time finalizer holds it, and an object its own
    finalizer refers to is never collected.
    """

    def send(method: Any, request: Any) -> Any:
        return call_unary(method, request, idempotent=True, policy=policy, clock=clock)

    return send
