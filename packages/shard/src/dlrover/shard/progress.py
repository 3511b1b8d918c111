"""The progress checkpoint: a dataset's whole remaining work as a versioned JSON document.

Format (version 1)::

    {
      "format": "dlrover.shard.progress",
      "version": 1,
      "dataset": "<name>",
      "spec": {...},                 # the DatasetSpec, see spec_to_json
      "state": {
        "epoch": 3,                  # newest started epoch, -1 before the first fetch
        "cursor": 120,               # shards of that epoch handed out fresh so far
        "finished_epochs": 3,        # epochs whose every shard is done or failed
        "done_total": 1200,          # shards done, all epochs together
        "epochs": {"3": {"done_bitmap": "<base64>", "failed": 0}},   # epochs not finished yet:
                                     # bit k set = shard 3 * shards_per_epoch + k is done
        "in_flight": [ids],          # shards leased when the checkpoint was taken (informative)
        "queue": [shard, ...],       # waiting shards in dispatch order, leased ones last
        "failed": [shard + "reasons", ...],
        "stream": {"next_offset": {p: n}, "watermark": {p: n}, "next_shard_id": n,
                   "round_robin": i, "done": [ids], "done_floor": n}
      }
    }

A shard entry is {"shard_id", "epoch", "start", "end", "consumed", "order_seed", "partition",
"dispatches", "failures", "reasons"}. No RNG state is stored because there is none to store: the
shard order of epoch e is a permutation seeded by (spec.seed, e), and the sample order within a
shard by (spec.seed, e, shard number), so the seed plus `epoch` and `cursor` give the rest of the
current epoch and every later one exactly.

Leases are not stored: a shard leased when the checkpoint was taken is written into the queue,
at its acknowledged position under exactly-once and from its start under at-least-once, or into
the failed set under at-most-once. So restoring gives exactly the remaining work, and a model
checkpoint saved with this document resumes without repeating or skipping an acknowledged sample.

Version 2 is the same document with the leases kept, written only for a service that journals
its own state (`encode_progress(manager, include_leases=True)`): a restarted master must let the
workers that outlived it finish and acknowledge what they hold. Leased shards are then in
neither the queue nor the failed set but in::

        "leases": [{"worker": "<id>", "shard": shard}, ...],
        "replies": [{"worker", "op": "fetch" | "done" | "fail" | "ack", "request_id", "reason",
                     "changed" (done, fail, ack) | "shard_ids", "finished" (fetch)}, ...]

`replies` holds each worker's newest reply of each kind, so a report the old service applied
but never answered is answered when it is sent again. A restored lease runs a whole lease period
from the restore. Builds that read only version 1 refuse a version 2 document instead of losing
its leased shards.
"""

from __future__ import annotations

import json
import math
from array import array
from typing import TYPE_CHECKING, Any

from dlrover.shard._bookkeeping import EpochBook, Parked, check_request_id, check_worker
from dlrover.shard.config import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    RecordFile,
    RecordFileSource,
    RecordUnit,
    StreamPartitions,
    TaskType,
)
from dlrover.shard.errors import InvalidShardRequestError
from dlrover.shard.results import FailedShard, FetchResult, ReportResult
from dlrover.shard.shard import Shard, bitmap_bytes
from dlrover.shard.splitter import make_splitter

if TYPE_CHECKING:
    from dlrover.shard.manager import ShardManager

__all__ = [
    "PROGRESS_FORMAT",
    "PROGRESS_VERSION",
    "LEASES_VERSION",
    "spec_to_json",
    "spec_from_json",
    "encode_progress",
    "decode_progress",
    "check_progress_document",
    "progress_document",
    "load_manager_state",
]

PROGRESS_FORMAT = "dlrover.shard.progress"
PROGRESS_VERSION = 1
LEASES_VERSION = 2
"""The version of a document that keeps the leases (see the module docstring)."""


def _bad(message: str) -> InvalidShardRequestError:
    return InvalidShardRequestError(f"progress checkpoint: {message}")


def spec_to_json(spec: DatasetSpec) -> dict[str, Any]:
    """A dataset specification as JSON-ready data."""
    src = spec.source
    source: dict[str, Any]
    if isinstance(src, IndexSource):
        source = {"kind": "index", "num_samples": src.num_samples}
    elif isinstance(src, RecordFileSource):
        source = {
            "kind": "record_files",
            "files": [{"path": f.path, "size": f.size} for f in src.files],
            "unit": src.unit.value,
            "record_bytes": src.record_bytes,
            "cross_file_boundaries": src.cross_file_boundaries,
        }
    else:
        source = {"kind": "stream", "partitions": list(src.partitions)}
    return {
        "name": spec.name,
        "source": source,
        "batch_size": spec.batch_size,
        "batches_per_shard": spec.batches_per_shard,
        "num_epochs": spec.num_epochs,
        "shuffle": spec.shuffle,
        "shuffle_samples": spec.shuffle_samples,
        "seed": spec.seed,
        "delivery": spec.delivery.value,
        "task_type": spec.task_type.value,
        "lease_timeout_s": spec.lease_timeout_s,
        "max_attempts": spec.max_attempts,
    }


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise _bad(f"{where} has no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _bad(f"{where}.{key} has the wrong type: {value!r}")
    return value


def spec_from_json(data: dict[str, Any]) -> DatasetSpec:
    """Parse `spec_to_json` output back into a validated `DatasetSpec`.

    Raises:
        InvalidShardRequestError: a field is missing, has the wrong type or an invalid value.
    """
    src = _field(data, "source", dict, "spec")
    kind = _field(src, "kind", str, "spec.source")
    source: IndexSource | RecordFileSource | StreamPartitions
    try:
        if kind == "index":
            source = IndexSource(_field(src, "num_samples", int, "spec.source"))
        elif kind == "record_files":
            files = tuple(
                RecordFile(_field(f, "path", str, "spec.source.files[]"), _field(f, "size", int, "spec.source.files[]"))
                for f in _field(src, "files", list, "spec.source")
            )
            source = RecordFileSource(
                files=files,
                unit=RecordUnit(_field(src, "unit", str, "spec.source")),
                record_bytes=_field(src, "record_bytes", int, "spec.source"),
                cross_file_boundaries=_field(src, "cross_file_boundaries", bool, "spec.source"),
            )
        elif kind == "stream":
            source = StreamPartitions(tuple(_field(src, "partitions", list, "spec.source")))
        else:
            raise _bad(f"spec.source.kind must be index, record_files or stream, got {kind!r}")
        return DatasetSpec(
            name=_field(data, "name", str, "spec"),
            source=source,
            batch_size=_field(data, "batch_size", int, "spec"),
            batches_per_shard=_field(data, "batches_per_shard", int, "spec"),
            num_epochs=_field(data, "num_epochs", (int, type(None)), "spec"),
            shuffle=_field(data, "shuffle", bool, "spec"),
            shuffle_samples=_field(data, "shuffle_samples", bool, "spec"),
            seed=_field(data, "seed", int, "spec"),
            delivery=DeliveryMode(_field(data, "delivery", str, "spec")),
            task_type=TaskType(_field(data, "task_type", str, "spec")),
            lease_timeout_s=_field(data, "lease_timeout_s", (int, float, type(None)), "spec"),
            max_attempts=_field(data, "max_attempts", (int, type(None)), "spec"),
        )
    except ValueError as exc:  # enum values and spec validation
        if isinstance(exc, InvalidShardRequestError) and str(exc).startswith("progress checkpoint"):
            raise
        raise _bad(f"invalid spec: {exc}") from exc


def encode_progress(manager: ShardManager, *, include_leases: bool = False) -> str:
    """The manager's progress checkpoint as a JSON string (keys sorted, so equal states give equal text).

    Args:
        manager: the dataset's manager.
        include_leases: keep the leases and their holders (version 2, for a restarting service);
            otherwise leased shards are written as the remaining work (version 1).
    """
    return json.dumps(progress_document(manager, include_leases=include_leases), sort_keys=True, separators=(",", ":"))


def progress_document(manager: ShardManager, *, include_leases: bool = False, exact: bool = False) -> dict[str, Any]:
    """The progress checkpoint as JSON-ready data (`encode_progress` before the encoding); `exact`
    as in `ShardManager.export_state`, for a registry's journal base."""
    return {
        "format": PROGRESS_FORMAT,
        "version": LEASES_VERSION if include_leases else PROGRESS_VERSION,
        "dataset": manager.spec.name,
        "spec": spec_to_json(manager.spec),
        "state": manager.export_state(include_leases=include_leases, exact=exact),
    }


def decode_progress(text: str | bytes) -> tuple[DatasetSpec, dict[str, Any]]:
    """Parse and check a progress document's envelope; returns its spec and raw state.

    Raises:
        InvalidShardRequestError: not JSON, not a progress document, another version, or a bad spec.
    """
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"not valid JSON: {exc}") from exc
    return check_progress_document(doc)


def check_progress_document(doc: Any) -> tuple[DatasetSpec, dict[str, Any]]:
    """`decode_progress` of a document already parsed from JSON.

    Raises:
        InvalidShardRequestError: not a progress document, another version, or a bad spec.
    """
    if not isinstance(doc, dict) or doc.get("format") != PROGRESS_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise _bad(f"format must be {PROGRESS_FORMAT!r}, got {got!r}")
    version = doc.get("version")
    if version not in (PROGRESS_VERSION, LEASES_VERSION) or isinstance(version, bool):
        raise _bad(
            f"version {version!r} is not supported; this build reads versions {PROGRESS_VERSION} and {LEASES_VERSION}"
        )
    spec = spec_from_json(_field(doc, "spec", dict, "document"))
    if doc.get("dataset") != spec.name:
        raise _bad(f"dataset {doc.get('dataset')!r} does not match its spec's name {spec.name!r}")
    state = _field(doc, "state", dict, "document")
    if (version == LEASES_VERSION) != ("leases" in state):
        raise _bad(
            f"a version {version} document {'needs' if version == LEASES_VERSION else 'cannot have'} state.leases"
        )
    return spec, state


def _int(data: dict[str, Any], key: str, where: str, low: int = 0, high: int | None = None) -> int:
    value = _field(data, key, int, where)
    if value < low or (high is not None and value > high):
        raise _bad(f"{where}.{key} = {value} is outside {low}..{high if high is not None else 'inf'}")
    return int(value)


def _parked_from(manager: ShardManager, entry: dict[str, Any], where: str) -> Parked:
    spec = manager.spec
    sid = _int(entry, "shard_id", where)
    epoch = _int(entry, "epoch", where)
    start = _int(entry, "start", where)
    end = _int(entry, "end", where, start + 1)
    order_seed = _field(entry, "order_seed", (int, type(None)), where)
    partition = _field(entry, "partition", str, where)
    n = manager.num_shards_per_epoch
    if n is not None:
        if spec.num_epochs is not None and sid >= n * spec.num_epochs:
            raise _bad(f"{where}: shard {sid} does not exist ({n} shards x {spec.num_epochs} epochs)")
        if epoch != sid // n or (start, end) != make_splitter(spec).bounds(sid % n):
            raise _bad(f"{where}: shard {sid} has bounds [{start}, {end}) or epoch {epoch} that the spec does not give")
    elif isinstance(spec.source, StreamPartitions) and partition not in spec.source.partitions:
        raise _bad(f"{where}: shard {sid} names unknown partition {partition!r}")
    parked = Parked(sid, epoch, start, end, order_seed, partition=partition)
    parked.consumed = _int(entry, "consumed", where, 0, end - start)
    parked.dispatches = _int(entry, "dispatches", where)
    parked.failures = _int(entry, "failures", where) if "failures" in entry else 0
    reasons = _field(entry, "reasons", list, where)
    if not all(isinstance(r, str) for r in reasons):
        raise _bad(f"{where}.reasons must be strings")
    parked.reasons = list(reasons)
    return parked


def load_manager_state(
    manager: ShardManager, state: dict[str, Any], *, exact: bool = False
) -> tuple[ShardManager, int]:
    """Fill a fresh manager with `state`; returns it and the number of shards in flight at the checkpoint.

    With `exact`, every lease must carry its deadline (see `ShardManager.from_state`).

    Raises:
        InvalidShardRequestError: the state is malformed or contradicts the manager's spec.
    """
    spec = manager.spec
    n = manager.num_shards_per_epoch
    high_epoch = None if spec.num_epochs is None else spec.num_epochs - 1
    epoch = _int(state, "epoch", "state", -1, high_epoch if n is not None else -1)
    cursor = _int(state, "cursor", "state", 0, n if (n is not None and epoch >= 0) else 0)
    queue = [_parked_from(manager, e, f"state.queue[{i}]") for i, e in enumerate(_field(state, "queue", list, "state"))]
    failed: list[FailedShard] = []
    for i, e in enumerate(_field(state, "failed", list, "state")):
        parked = _parked_from(manager, e, f"state.failed[{i}]")
        shard = Shard(
            spec.name, parked.shard_id, parked.epoch, parked.start, parked.end, parked.consumed,
            parked.order_seed, parked.partition, max(parked.dispatches, 1),
        )  # fmt: skip
        failed.append(FailedShard(shard, tuple(parked.reasons)))
    # The done shards stay a bitmap (one bit each) from the document to the manager's books: a
    # restore of an epoch with millions of shards takes no Python loop over them.
    books: dict[int, EpochBook] = {}
    size = n or 0
    for key, entry in _field(state, "epochs", dict, "state").items():
        if not key.isdigit() or int(key) > epoch:
            raise _bad(f"state.epochs has key {key!r}, not a started epoch")
        bitmap = _field(entry, "done_bitmap", str, f"state.epochs[{key}]")
        try:
            book = EpochBook(size, int(key) * size, bitmap_bytes(bitmap, size))
        except ValueError as exc:
            raise _bad(f"state.epochs[{key}].done_bitmap: {exc}") from exc
        book.failed = _int(entry, "failed", f"state.epochs[{key}]")
        books[int(key)] = book
    stream = _field(state, "stream", dict, "state")
    next_offset = _field(stream, "next_offset", dict, "state.stream")
    watermark = _field(stream, "watermark", dict, "state.stream")
    partitions = set(spec.source.partitions) if isinstance(spec.source, StreamPartitions) else set()
    if set(next_offset) != partitions or set(watermark) != partitions:
        raise _bad(f"state.stream partitions {sorted(next_offset)} do not match the spec's {sorted(partitions)}")
    for p in partitions:
        if (
            not isinstance(next_offset[p], int)
            or not isinstance(watermark[p], int)
            or not 0 <= next_offset[p] <= watermark[p]
        ):
            raise _bad(f"state.stream offsets of partition {p!r} are invalid")
    stream_done = _field(stream, "done", list, "state.stream")
    leases = _leases_from(manager, state, exact=exact)
    replies = _replies_from(state) if "leases" in state else []
    seen: set[int] = set()
    held = [p.shard_id for p in queue] + [f.shard.shard_id for f in failed] + [p.shard_id for _, p, _ in leases]
    for sid in held + list(stream_done):
        if sid in seen:
            raise _bad(f"shard {sid} appears in more than one state")
        seen.add(sid)
    for sid in held:
        if size and sid // size in books and books[sid // size].is_done(sid):
            raise _bad(f"shard {sid} appears in more than one state")
    # Computed once: shuffling a million shard ids takes most of a second in Python.
    perm = manager._permutation(epoch) if epoch >= 0 else None
    if n is not None:
        _check_dispatched(
            epoch=epoch, cursor=cursor, n=n, perm=perm, queue=queue, failed=failed, leases=leases, books=books
        )
    manager._restore_internals(
        epoch=epoch,
        cursor=cursor,
        finished_epochs=_int(state, "finished_epochs", "state"),
        done_total=_int(state, "done_total", "state"),
        perm=perm,
        books=books,
        queue=queue,
        failed=failed,
        next_offset={str(k): int(v) for k, v in next_offset.items()},
        watermark={str(k): int(v) for k, v in watermark.items()},
        next_shard_id=_int(stream, "next_shard_id", "state.stream"),
        round_robin=_int(stream, "round_robin", "state.stream"),
        stream_done=set(stream_done),
        stream_done_floor=_int(stream, "done_floor", "state.stream"),
    )
    manager._restore_leases(leases, replies)
    in_flight = _field(state, "in_flight", list, "state")
    return manager, len(in_flight)


class _Fresh:
    """Which of an epoch's shards are still undispatched: those at or past `cursor` in `perm`
    (in id order without one). Keeps a set of the smaller side of the cursor only."""

    def __init__(self, cursor: int, n: int, perm: array[int] | None) -> None:
        self._cursor = cursor
        self._fresh: set[int] | None = None
        self._dispatched: set[int] | None = None
        if perm is not None:
            if 2 * cursor >= n:
                self._fresh = set(perm[cursor:])
            else:
                self._dispatched = set(perm[:cursor])

    def holds(self, index: int) -> bool:
        if self._fresh is not None:
            return index in self._fresh
        if self._dispatched is not None:
            return index not in self._dispatched
        return index >= self._cursor


def _check_dispatched(
    *,
    epoch: int,
    cursor: int,
    n: int,
    perm: array[int] | None,
    queue: list[Parked],
    failed: list[FailedShard],
    leases: list[tuple[str, Parked, float | None]],
    books: dict[int, EpochBook],
) -> None:
    """Refuse a bounded dataset's state whose queued, failed or leased shard was never handed out.

    Such a shard is still in the fresh permutation `perm` of `epoch` (a later epoch, or at or past
    the cursor of the current one), so it would be handed out a second time; a queued or leased
    one must also belong to an epoch that is not finished (one with a book).
    """
    fresh_now = _Fresh(cursor, n, perm)
    for where, sid, shard_epoch, needs_book in (
        *(("queued", p.shard_id, p.epoch, True) for p in queue),
        *(("leased", p.shard_id, p.epoch, True) for _, p, _ in leases),
        *(("failed", f.shard.shard_id, f.shard.epoch, False) for f in failed),
    ):
        if shard_epoch > epoch or (shard_epoch == epoch and fresh_now.holds(sid % n)):
            raise _bad(f"{where} shard {sid} was never handed out (epoch {epoch}, cursor {cursor})")
        if needs_book and shard_epoch not in books:
            raise _bad(f"{where} shard {sid} belongs to epoch {shard_epoch}, which the state records as finished")


def _leases_from(
    manager: ShardManager, state: dict[str, Any], *, exact: bool
) -> list[tuple[str, Parked, float | None]]:
    if "leases" not in state:
        if exact:
            raise _bad("an exact state needs state.leases")
        return []
    leases: list[tuple[str, Parked, float | None]] = []
    for i, entry in enumerate(_field(state, "leases", list, "state")):
        where = f"state.leases[{i}]"
        worker = _field(entry, "worker", str, where)
        try:
            check_worker(worker)
        except InvalidShardRequestError as exc:
            raise _bad(f"{where}: {exc}") from None
        deadline: float | None = None
        if exact and "deadline" in entry:
            value = _field(entry, "deadline", (int, float), where)
            if isinstance(value, bool) or math.isnan(value) or value == -math.inf:
                raise _bad(f"{where}.deadline must be a time or infinity (no lease timeout), got {value!r}")
            deadline = float(value)
        leases.append((worker, _parked_from(manager, _field(entry, "shard", dict, where), f"{where}.shard"), deadline))
    return leases


def _replies_from(state: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    replies: list[tuple[str, str, str, Any]] = []
    for i, entry in enumerate(_field(state, "replies", list, "state")):
        where = f"state.replies[{i}]"
        worker = _field(entry, "worker", str, where)
        op = _field(entry, "op", str, where)
        request_id = _field(entry, "request_id", str, where)
        reason = _field(entry, "reason", str, where)
        try:
            check_worker(worker)
            check_request_id(request_id)
        except InvalidShardRequestError as exc:
            raise _bad(f"{where}: {exc}") from None
        result: Any
        if op == "fetch":
            ids = _field(entry, "shard_ids", list, where)
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
                raise _bad(f"{where}.shard_ids must be integers")
            # Only the ids matter: a retried fetch is answered with those of them the worker still holds.
            shards = tuple(Shard("", sid, 0, 0, 1) for sid in ids)
            result = FetchResult(shards, _field(entry, "finished", bool, where), reason)
        elif op in ("done", "fail", "ack"):
            result = ReportResult(_field(entry, "changed", bool, where), reason)
        else:
            raise _bad(f"{where}.op must be fetch, done, fail or ack, got {op!r}")
        replies.append((worker, op, request_id, result))
    return replies
