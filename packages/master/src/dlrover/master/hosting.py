"""The rendezvous and shard libraries as hosted by the master: one lock each, journaled, tied to node membership.

Each library's core is a plain single-threaded object. Its gRPC servicer already serializes RPCs
with a lock; `HostedRendezvous` and `HostedShards` make that lock the only way in, for the master's
own calls too (its tick exporting state, a failed node leaving). Lock order: the master's lock may
be held while a library lock is taken, never the reverse: after an RPC changed a library's state,
its export is taken under the library lock, released, and only then handed to the master to journal.

Node ids: the master's node id (an int, one per incarnation, never reused) written in decimal is
the node's id in the rendezvous and its worker id in the shard service. A node whose training
processes read shards separately may use `"<node id>/<anything>"` as worker ids (for example
`"3/0"`, `"3/1"` per local rank); all of them are released with the node. A replacement node comes
back under a new id and takes the free rank (the rendezvous gives free ranks lowest first).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import grpc

from dlrover.common import Clock, ConfigError, GrpcServer
from dlrover.master.group_commit import GroupCommit
from dlrover.master.journal import Blob, ChangeLine, JournalError
from dlrover.master.master import LoggedCollaborator, StateChanges, StatefulCollaborator
from dlrover.master.rendezvous_state import export_rendezvous, restore_rendezvous
from dlrover.rendezvous import (
    InvalidRequestError,
    KeyValueStore,
    RendezvousManager,
    RendezvousServicer,
    StoreFullError,
    UnknownNodeError,
)
from dlrover.rendezvous.v1 import rendezvous_pb2 as rpb
from dlrover.rendezvous.v1 import rendezvous_pb2_grpc as rpb_grpc
from dlrover.shard import InvalidShardRequestError, ShardRegistry, ShardServicer, ShardStateError
from dlrover.shard.changelog import REGISTRY_BASE_FORMAT, REGISTRY_BASE_VERSION, LoggedCall, encode_base
from dlrover.shard.v1 import shard_pb2 as spb
from dlrover.shard.v1 import shard_pb2_grpc as spb_grpc

__all__ = [
    "KV_STATE_FORMAT",
    "SHARD_STATE_FORMAT",
    "HostedKeyValueStore",
    "HostedRendezvous",
    "HostedShards",
    "StateSink",
    "node_of_worker",
]

_log = logging.getLogger(__name__)

SHARD_STATE_FORMAT = "dlrover.master.shards"
"""The `shards` blob's format before the change log (an export of every dataset): still read on start."""


class StateSink(Protocol):
    """Where a hosted library sends its state when a change must reach the journal at once (the `Master`)."""

    def journal_collaborator(self, collaborator: StatefulCollaborator | LoggedCollaborator) -> bool:
        """Export `collaborator` and journal what is new; True when something was written."""
        ...


def _registry_base(blob: Blob) -> LoggedCall:
    """A journaled shard blob as a registry base: as written, or converted from an older master's
    `dlrover.master.shards` export (version-2 progress documents, no deadlines, no lines after it).

    Raises:
        JournalError: the blob is neither.
    """
    try:
        doc = json.loads(blob.data)
    except ValueError as exc:
        raise JournalError(f"shard state: not valid JSON: {exc}") from exc
    if isinstance(doc, dict) and doc.get("format") == REGISTRY_BASE_FORMAT:
        return LoggedCall(blob.version, blob.data)
    if not isinstance(doc, dict) or doc.get("format") != SHARD_STATE_FORMAT or doc.get("version") != 1:
        raise JournalError(f"shard state: neither a {REGISTRY_BASE_FORMAT!r} base nor a {SHARD_STATE_FORMAT!r} export")
    datasets = doc.get("datasets")
    if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
        raise JournalError("shard state: datasets must be a list of progress checkpoints")
    try:
        parsed = [json.loads(d) for d in datasets]
    except ValueError as exc:
        raise JournalError(f"shard state: a progress checkpoint is not valid JSON: {exc}") from exc
    base = {
        "format": REGISTRY_BASE_FORMAT,
        "version": REGISTRY_BASE_VERSION,
        "seq": blob.version,
        "time": 0.0,
        "datasets": parsed,
        "restores": [],
    }
    return LoggedCall(blob.version, json.dumps(base, separators=(",", ":")))


def node_of_worker(worker: str) -> int | None:
    """The master node id a shard worker id (`"<node id>"` or `"<node id>/<suffix>"`) belongs to, if any."""
    head = worker.split("/", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else None


def _journal_or_abort(after: Callable[[], None], context: grpc.ServicerContext) -> None:
    """Journal a library's change before its answer leaves; a journal failure answers UNAVAILABLE.

    The library has changed in memory already (its core is not transactional): the caller learns
    that the change is not durable, and retries; the change reaches the journal with the next
    export that succeeds.
    """
    try:
        after()
    except JournalError as exc:
        context.abort(grpc.StatusCode.UNAVAILABLE, f"the change could not be journaled yet; retry later: {exc}")


class _VersionedText:
    """A state's latest export and its version, which grows whenever the text changes."""

    def __init__(self) -> None:
        self.version = 0
        self.text = ""

    def update(self, text: str) -> tuple[int, str]:
        if text != self.text:
            self.version += 1
            self.text = text
        return self.version, self.text


# ---------------------------------------------------------------------------------- rendezvous


class _RendezvousServicer(RendezvousServicer):
    """The library's servicer, telling its host after every call that may have formed or ended a round."""

    def __init__(self, manager: RendezvousManager, kv: KeyValueStore, clock: Clock, after: Callable[[], None]) -> None:
        super().__init__(manager, kv, clock)
        self._after = after
        self.kv_writes = 0
        """Calls that may have changed the key-value store, counted after each returns."""

    def _count_kv_write(self) -> None:
        with self.lock:  # gRPC threads count concurrently
            self.kv_writes += 1

    def KvSet(self, request: rpb.KvSetRequest, context: grpc.ServicerContext) -> rpb.KvSetResponse:
        """See `RendezvousServicer.KvSet`."""
        response = super().KvSet(request, context)
        self._count_kv_write()
        return response

    def KvAdd(self, request: rpb.KvAddRequest, context: grpc.ServicerContext) -> rpb.KvAddResponse:
        """See `RendezvousServicer.KvAdd`."""
        response = super().KvAdd(request, context)
        self._count_kv_write()
        return response

    def KvCompareSet(self, request: rpb.KvCompareSetRequest, context: grpc.ServicerContext) -> rpb.KvCompareSetResponse:
        """See `RendezvousServicer.KvCompareSet`."""
        response = super().KvCompareSet(request, context)
        self._count_kv_write()
        return response

    def KvDelete(self, request: rpb.KvDeleteRequest, context: grpc.ServicerContext) -> rpb.KvDeleteResponse:
        """See `RendezvousServicer.KvDelete`."""
        response = super().KvDelete(request, context)
        self._count_kv_write()
        return response

    def Join(self, request: rpb.JoinRequest, context: grpc.ServicerContext) -> rpb.JoinResponse:
        """See `RendezvousServicer.Join`."""
        response = super().Join(request, context)
        _journal_or_abort(self._after, context)
        return response

    def Poll(self, request: rpb.PollRequest, context: grpc.ServicerContext) -> rpb.PollResponse:
        """See `RendezvousServicer.Poll`."""
        response = super().Poll(request, context)
        _journal_or_abort(self._after, context)
        return response

    def Heartbeat(self, request: rpb.HeartbeatRequest, context: grpc.ServicerContext) -> rpb.HeartbeatResponse:
        """See `RendezvousServicer.Heartbeat`."""
        response = super().Heartbeat(request, context)
        _journal_or_abort(self._after, context)
        return response

    def NumNodesWaiting(
        self, request: rpb.NumNodesWaitingRequest, context: grpc.ServicerContext
    ) -> rpb.NumNodesWaitingResponse:
        """See `RendezvousServicer.NumNodesWaiting`."""
        response = super().NumNodesWaiting(request, context)
        _journal_or_abort(self._after, context)
        return response

    def Leave(self, request: rpb.LeaveRequest, context: grpc.ServicerContext) -> rpb.LeaveResponse:
        """See `RendezvousServicer.Leave`."""
        response = super().Leave(request, context)
        _journal_or_abort(self._after, context)
        return response

    def Close(self, request: rpb.CloseRequest, context: grpc.ServicerContext) -> rpb.CloseResponse:
        """See `RendezvousServicer.Close`."""
        response = super().Close(request, context)
        _journal_or_abort(self._after, context)
        return response


class HostedRendezvous:
    """The job's rendezvous as the master hosts it: served, journaled, and told about departed nodes.

    Journaled as the `rendezvous` blob (see `dlrover.master.rendezvous_state`): whenever a round
    forms or dissolves or the rendezvous closes, before any call that saw the change is answered;
    on the master's export cadence otherwise (which catches changes of the waiting list). The
    key-value store served beside it is journaled separately, as the `rendezvous_kv` blob of
    `kv_state`, on the export cadence and at shutdown (agents publish the torch store address
    there; a write made less than `state_export_interval_s` before a SIGKILL is lost).

    Args:
        manager: the rendezvous core (fresh; a restarted master restores into it).
        clock: the time source of every call.
        kv: the key-value store served beside it.
    """

    state_name = "rendezvous"

    def __init__(self, manager: RendezvousManager, clock: Clock, kv: KeyValueStore | None = None) -> None:
        self._manager = manager
        self._clock = clock
        self._kv = kv if kv is not None else KeyValueStore()
        self._servicer = _RendezvousServicer(manager, self._kv, clock, self._after_call)
        self._kv_state = HostedKeyValueStore(self._kv, self._servicer)
        self._state = _VersionedText()
        self._journaled = self._round_fingerprint()  # the round state the journal is known to hold
        self._sink: StateSink | None = None

    @property
    def servicer(self) -> RendezvousServicer:
        """The servicer registered on the master's server."""
        return self._servicer

    @property
    def kv_state(self) -> HostedKeyValueStore:
        """The key-value store as a journaled collaborator (hand it to the master with this one)."""
        return self._kv_state

    @contextmanager
    def locked(self) -> Iterator[RendezvousManager]:
        """The manager, under the lock every RPC holds: the only safe way to touch it while serving."""
        with self._servicer.lock:
            yield self._manager

    def attach(self, sink: StateSink) -> None:
        """Journal round changes through `sink` from now on."""
        self._sink = sink

    def register(self, server: GrpcServer) -> None:
        """Add the RendezvousService to `server` (before it starts)."""
        server.add(rpb_grpc.add_RendezvousServiceServicer_to_server, self._servicer)

    def _round_fingerprint(self) -> tuple[int, bool, bool]:
        m = self._manager
        return (m.round_number, m.current_round is not None, m.closed)

    def _after_call(self) -> None:
        # A call that saw a round change answers only once that change is journaled, whichever
        # thread made it: a caller never learns of a round a restarted master would not know.
        with self._servicer.lock:
            fingerprint = self._round_fingerprint()
        if fingerprint == self._journaled or self._sink is None:
            return
        self._sink.journal_collaborator(self)  # skipped when a newer export is journaled already
        # The export above was taken after `fingerprint` was seen, so the journal holds at least
        # that. A racing thread may write an older fingerprint here: that costs one needless
        # export later, never a missed one.
        self._journaled = fingerprint

    # StatefulCollaborator

    def export_state(self) -> tuple[int, str]:
        """The rendezvous state and its version (grows with each change)."""
        with self._servicer.lock:
            return self._state.update(export_rendezvous(self._manager))

    def import_state(self, version: int, data: str) -> None:
        """Resume from a journaled export (before serving).

        Raises:
            JournalError: the blob is corrupt; nothing changed.
        """
        with self._servicer.lock:
            restore_rendezvous(self._manager, data, self._clock.now())
            self._state.version = version
            self._state.text = export_rendezvous(self._manager)
            self._journaled = self._round_fingerprint()

    # NodeMembership

    def node_departed(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        """Take the node out of the rendezvous; a round holding it dissolves and its members are told why."""
        with self._servicer.lock:
            try:
                what = self._manager.leave(str(node_id), self._clock.now())
            except UnknownNodeError:
                return  # it never joined, or already left: nothing to undo
        # The master journals the rendezvous right after telling it about departures.
        _log.info("rendezvous: %s (%s)", what, reason)

    def processes_restarted(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        """Nothing to do: the restarted processes join again, which reopens the round by itself."""

    def round_broken(self, node_id: int, reason: str) -> None:
        """The node's processes restart for a cause of their own: until they join again, the round
        remembers why its other members' collectives break (`left_behind`)."""
        with self._servicer.lock:
            self._manager.processes_restarting(str(node_id), reason)

    def left_behind(self, node_id: int) -> str | None:
        """Why the node's workers run in a round that is over, or None (`RendezvousManager.left_behind`)."""
        with self._servicer.lock:
            return self._manager.left_behind(str(node_id))

    def node_finished(self, node_id: int, reason: str) -> None:
        """Keep the node in its round without heartbeats, so its silence never dissolves it under its peers."""
        with self._servicer.lock:
            try:
                what = self._manager.finish(str(node_id), self._clock.now())
            except UnknownNodeError:
                return  # not in the round in force (it never trained, or the round is gone)
        _log.info("rendezvous: %s (%s)", what, reason)

    def job_finished(self, reason: str) -> None:
        """Close the rendezvous: waiting nodes learn on their next poll that no round will form."""
        with self._servicer.lock:
            self._manager.close(self._clock.now())

    # PlannedRoundAware

    def round_planned(self, node_ids: frozenset[int], reason: str) -> None:
        """Form the next round as soon as `node_ids` all joined, waiting for a slow one
        (`RendezvousManager.expect_round`) rather than forming one without it and another after."""
        with self._servicer.lock:
            what = self._manager.expect_round((str(n) for n in node_ids), self._clock.now())
        _log.info("rendezvous: %s (%s)", what, reason)

    # SpareAware

    def spares_changed(self, node_ids: frozenset[int]) -> None:
        """Hold the master's warm spares out of every round (`RendezvousManager.set_spares`); a spare
        given a rank waits for the next round like any node that joins."""
        with self._servicer.lock:
            what = self._manager.set_spares((str(n) for n in node_ids), self._clock.now())
        _log.info("rendezvous spares: %s", what)


KV_STATE_FORMAT = "dlrover.master.kv"


class HostedKeyValueStore:
    """The rendezvous key-value store as a journaled collaborator: the `rendezvous_kv` blob.

    `{"format": "dlrover.master.kv", "version": 1, "items": {key: base64 of the value}}`, bounded
    by the store's own `max_total_bytes` (a third more for base64). Exported only after a call that
    may have written the store, so an idle store costs nothing per tick. Keys of old rounds are not
    pruned: the store does not know which keys belong to a round (the names are the clients').

    Args:
        kv: the store.
        servicer: the servicer serving it (its lock guards the store, its counter tells writes).
    """

    state_name = "rendezvous_kv"

    def __init__(self, kv: KeyValueStore, servicer: _RendezvousServicer) -> None:
        self._kv = kv
        self._servicer = servicer
        self._exported_writes = -1
        self._state = _VersionedText()

    def export_state(self) -> tuple[int, str]:
        """The store's content and its version (grows with each change)."""
        writes = self._servicer.kv_writes
        if writes == self._exported_writes:
            return self._state.version, self._state.text
        with self._servicer.lock:
            items = self._kv.items()
        doc = {
            "format": KV_STATE_FORMAT,
            "version": 1,
            "items": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(items.items())},
        }
        self._exported_writes = writes
        return self._state.update(json.dumps(doc, separators=(",", ":")))

    def import_state(self, version: int, data: str) -> None:
        """Resume from a journaled export (before serving).

        Raises:
            JournalError: the blob is corrupt or does not fit the store's limits; nothing changed.
        """
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != KV_STATE_FORMAT or doc.get("version") != 1:
                raise ValueError(f"not a {KV_STATE_FORMAT!r} version 1 document")
            encoded = doc.get("items")
            if not isinstance(encoded, dict):
                raise ValueError("items must be an object")
            items = {str(k): base64.b64decode(v, validate=True) for k, v in encoded.items()}
        except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
            raise JournalError(f"key-value store state: {exc}") from exc
        with self._servicer.lock:
            try:
                self._kv.restore(items)
            except (InvalidRequestError, StoreFullError) as exc:
                raise JournalError(f"key-value store state: {exc}") from exc
        self._state.version = version
        self._state.text = data
        self._exported_writes = self._servicer.kv_writes


# -------------------------------------------------------------------------------------- shards


class _ShardServicer(ShardServicer):
    """The library's servicer, telling its host after every request that changed the registry."""

    def __init__(self, registry: ShardRegistry, after: Callable[[], None]) -> None:
        super().__init__(registry)
        self._after = after

    def RegisterDataset(
        self, request: spb.RegisterDatasetRequest, context: grpc.ServicerContext
    ) -> spb.RegisterDatasetResponse:
        """See `ShardServicer.RegisterDataset`."""
        response = super().RegisterDataset(request, context)
        _journal_or_abort(self._after, context)
        return response

    def FetchShards(self, request: spb.FetchShardsRequest, context: grpc.ServicerContext) -> spb.FetchShardsResponse:
        """See `ShardServicer.FetchShards`."""
        response = super().FetchShards(request, context)
        _journal_or_abort(self._after, context)
        return response

    def ReportProgress(
        self, request: spb.ReportProgressRequest, context: grpc.ServicerContext
    ) -> spb.ReportProgressResponse:
        """See `ShardServicer.ReportProgress`."""
        response = super().ReportProgress(request, context)
        _journal_or_abort(self._after, context)
        return response

    def ReportDone(self, request: spb.ReportDoneRequest, context: grpc.ServicerContext) -> spb.ReportDoneResponse:
        """See `ShardServicer.ReportDone`."""
        response = super().ReportDone(request, context)
        _journal_or_abort(self._after, context)
        return response

    def ReportFailure(
        self, request: spb.ReportFailureRequest, context: grpc.ServicerContext
    ) -> spb.ReportFailureResponse:
        """See `ShardServicer.ReportFailure`."""
        response = super().ReportFailure(request, context)
        _journal_or_abort(self._after, context)
        return response

    def RemoveWorker(self, request: spb.RemoveWorkerRequest, context: grpc.ServicerContext) -> spb.RemoveWorkerResponse:
        """See `ShardServicer.RemoveWorker`."""
        response = super().RemoveWorker(request, context)
        _journal_or_abort(self._after, context)
        return response

    def RestoreCheckpoint(
        self, request: spb.RestoreCheckpointRequest, context: grpc.ServicerContext
    ) -> spb.RestoreCheckpointResponse:
        """See `ShardServicer.RestoreCheckpoint`."""
        response = super().RestoreCheckpoint(request, context)
        _journal_or_abort(self._after, context)
        return response


class HostedShards:
    """The job's datasets as the master hosts them: served, journaled, and released with departed nodes.

    Journaled as a log (`LoggedCollaborator`): the `shards` blob is a base of the whole registry
    (`ShardRegistry.journal_base`, every lease and its deadline), and each changing call after it
    is one change line (`dlrover.shard.changelog`), so journaling a request costs its own line, not
    an export that grows with the workers (25 MB and a second of CPU at 80,000 leased workers). A
    new base is written once the lines journaled since the last one outgrow it
    (`compaction_ratio` times its size, at least `min_compaction_bytes`), which bounds both the
    log a restart replays and the cost per line; after a restart the first write is a base. With
    `journal_every_change`, a request that changed a dataset is journaled before its answer is
    sent, so an acknowledged sample survives a master restart; requests that change the state
    while one write is under way share the next (`GroupCommit`).
    A restarted master replays the lines onto the base, so it decides every later request as the
    old one would have, then keeps each shard leased to the worker that held it for a whole lease
    period from the restart: workers that kept training while it was away report what they
    trained and nothing is handed out twice. A lease whose worker does not come back expires as
    any other; a node the lifecycle finds gone has its shards released at once. A blob an older
    master wrote (`{"format": "dlrover.master.shards", "version": 1, ...}`) is still read.

    Args:
        registry: the shard core; fresh when a restarted master loads into it. Its change log is
            started here (`ShardRegistry.start_change_log`).
        journal_every_change: journal after every changing request (else on the export cadence only).
        compaction_ratio: a new base is due once the lines journaled since the last one are this
            many times its size.
        min_compaction_bytes: ... and at least this many bytes.

    Raises:
        ConfigError: a compaction setting is not positive.
    """

    state_name = "shards"

    def __init__(
        self,
        registry: ShardRegistry,
        *,
        journal_every_change: bool = True,
        compaction_ratio: float = 1.0,
        min_compaction_bytes: int = 1 << 20,
    ) -> None:
        if not compaction_ratio > 0 or not min_compaction_bytes > 0:
            raise ConfigError(
                f"compaction_ratio and min_compaction_bytes must be positive, got {compaction_ratio!r}, "
                f"{min_compaction_bytes!r}"
            )
        registry.start_change_log()
        self._servicer = _ShardServicer(registry, self.changed_by_request)
        self._every_change = journal_every_change
        self._group = GroupCommit(self._write)
        self._sink: StateSink | None = None
        self._ratio = compaction_ratio
        self._min_bytes = min_compaction_bytes
        # Under the servicer's lock: lines taken from the registry and not yet durable, the bytes of
        # lines made durable since the newest base, that base's size, and whether a base is due.
        self._pending: list[LoggedCall] = []
        self._lines_bytes = 0
        self._base_bytes = 0
        self._base_due = True

    @property
    def servicer(self) -> ShardServicer:
        """The servicer registered on the master's server."""
        return self._servicer

    @property
    def journals_every_change(self) -> bool:
        """Whether a request that changed a dataset is journaled before its answer is sent."""
        return self._every_change

    @contextmanager
    def locked(self) -> Iterator[ShardRegistry]:
        """The registry, under the lock every RPC holds: the only safe way to touch it while serving.
        Make changes through the registry's own calls (`fetch`, `report_done`, ...), which log them."""
        with self._servicer.locked() as registry:
            yield registry

    def attach(self, sink: StateSink) -> None:
        """Journal changes through `sink` from now on."""
        self._sink = sink

    def register(self, server: GrpcServer) -> None:
        """Add the ShardService to `server` (before it starts)."""
        server.add(spb_grpc.add_ShardServiceServicer_to_server, self._servicer)

    def changed_by_request(self) -> None:
        """A request changed the registry: return once that is journaled, as the service does
        before it answers (with `journal_every_change`; else at once)."""
        if self._every_change and self._sink is not None:
            self._group.changed()

    def _write(self) -> None:
        if self._sink is not None:
            self._sink.journal_collaborator(self)

    # LoggedCollaborator

    def export_changes(self) -> StateChanges:
        """The lines not yet durable, or a new base in their place when one is due."""
        with self._servicer.locked() as registry:
            self._pending.extend(registry.take_changes())
            waiting = sum(len(line.text) for line in self._pending)
            if not (
                self._base_due or self._lines_bytes + waiting > max(self._ratio * self._base_bytes, self._min_bytes)
            ):
                return StateChanges(lines=tuple(ChangeLine(line.seq, line.text) for line in self._pending))
            # Holds every pending line: all are numbered below it.
            seq, document = registry.journal_base_document()
        # Encoded with the lock let go (most of a base's cost: 80,000 leased workers make seconds of
        # it), so shard calls go on meanwhile; their lines are numbered after the base.
        base = encode_base(seq, document)
        return StateChanges(blob=Blob(base.seq, base.text))

    def changes_journaled(self, through: int, blob: Blob | None) -> None:
        """Forget the lines now durable; a base written starts the count towards the next."""
        with self._servicer.locked():
            durable = sum(len(line.text) for line in self._pending if line.seq <= through)
            self._pending = [line for line in self._pending if line.seq > through]
            if blob is not None:
                self._base_due = False
                self._base_bytes = len(blob.data)
                self._lines_bytes = 0
            else:
                self._lines_bytes += durable

    def import_changes(self, blob: Blob, lines: Sequence[ChangeLine]) -> None:
        """Resume from a journaled base and the lines after it (before serving).

        Raises:
            JournalError: the base or a line is corrupt, or a line does not apply to the state
                before it (the master refuses to start either way).
        """
        base = _registry_base(blob)
        with self._servicer.locked() as registry:
            try:
                replayed = registry.load_journal(base, [LoggedCall(line.seq, line.data) for line in lines])
            except (InvalidShardRequestError, ShardStateError) as exc:
                raise JournalError(f"shard state: {exc}") from exc
            self._base_due = True  # the lines' clock was the old master's: the next write is a base
            _log.info(
                "shard state resumed: %d dataset(s) from base %d and %d change(s) after it",
                len(registry.datasets()),
                base.seq,
                replayed,
            )

    # NodeMembership

    def release(self, node_id: int, reason: str, *, charge: bool = True) -> dict[str, list[int]]:
        """Return every shard the node's workers hold to the queue; returns dataset -> shard ids.

        `charge`: count it as a failed attempt of each shard (see `ShardManager.remove_worker`).
        """
        released: dict[str, list[int]] = {}
        with self._servicer.locked() as registry:
            workers = {
                w.worker
                for name in registry.datasets()
                for w in registry.manager(name).status().workers
                if node_of_worker(w.worker) == node_id
            }
            for worker in sorted(workers):
                for dataset, ids in registry.remove_worker(worker, reason, charge=charge).items():
                    released.setdefault(dataset, []).extend(ids)
        released = {d: sorted(ids) for d, ids in released.items() if ids}
        if released:
            _log.info("shards of node %d returned to the queue (%s): %s", node_id, reason, released)
        return released

    def node_departed(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        """Re-dispatch the node's shards (under exactly-once, from their acknowledged positions); an
        attempt is counted against them only when the failure may be the data's (`data_suspect`)."""
        self.release(node_id, reason, charge=data_suspect)

    def processes_restarted(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        """The processes that held the node's shards are gone: re-dispatch them (`data_suspect`: as above)."""
        self.release(node_id, reason, charge=data_suspect)

    def node_finished(self, node_id: int, reason: str) -> None:
        """Nothing to do: its processes succeeded, and what they read is acknowledged or journaled."""

    def job_finished(self, reason: str) -> None:
        """Nothing to do: the datasets' progress stays journaled."""
