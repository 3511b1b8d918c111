"""The dataset registry: one shard manager per dataset, addressed by name.

This is the object a service hosts. Like the managers, it is a pure state machine with an
injected clock and is not thread-safe. Its changing calls (`register`, `fetch`, the reports,
`remove_worker`, `restore`, `advance_stream`) can be logged, so a host journals each change as a
line instead of exporting everything (see `dlrover.shard.changelog`).
"""

from __future__ import annotations

import gc
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from dlrover.common import Clock, ConfigError
from dlrover.shard.changelog import (
    REGISTRY_BASE_FORMAT,
    REGISTRY_BASE_VERSION,
    LoggedCall,
    RequestClock,
    decode_call,
    encode_base,
    encode_call,
)
from dlrover.shard.config import DatasetSpec, ShardManagerConfig
from dlrover.shard.errors import InvalidShardRequestError, ShardError, ShardStateError, UnknownDatasetError
from dlrover.shard.manager import MAX_REQUEST_ID_CHARS, ShardManager, check_acknowledgements
from dlrover.shard.progress import (
    check_progress_document,
    decode_progress,
    encode_progress,
    progress_document,
    spec_from_json,
    spec_to_json,
)
from dlrover.shard.results import FetchResult, RegisterResult, ReportResult, RestoreResult

__all__ = ["ShardRegistry"]


def _differences(old: DatasetSpec, new: DatasetSpec) -> list[str]:
    return [
        f"{a.name}: {getattr(old, a.name)!r} != {getattr(new, a.name)!r}"
        for a in attrs.fields(DatasetSpec)
        if getattr(old, a.name) != getattr(new, a.name)
    ]


class ShardRegistry:
    """Datasets by name, each with its shard manager.

    Args:
        clock: the time source of every manager.
        config: settings shared by every manager.
    """

    def __init__(self, clock: Clock, config: ShardManagerConfig | None = None) -> None:
        self._clock = RequestClock(clock)
        self._config = config or ShardManagerConfig()
        self._managers: dict[str, ShardManager] = {}
        # Per dataset: the manager, its position version and the data position read then (`checkpoint`).
        self._positions: dict[str, tuple[ShardManager, int, str]] = {}
        self._restores: OrderedDict[str, RestoreResult] = OrderedDict()
        self._log: list[LoggedCall] | None = None
        self._seq = 0
        self._calls: dict[str, Callable[[dict[str, Any]], Any]] = {
            "register": lambda a: self._register(spec_from_json(a["spec"])),
            "fetch": lambda a: self.manager(a["dataset"]).fetch(a["worker"], a["count"], a["request_id"]),
            "progress": lambda a: self.manager(a["dataset"]).report_progress(
                a["worker"], a["shard_id"], a["consumed"], a["request_id"], attempt=a.get("attempt")
            ),
            "done": lambda a: self.manager(a["dataset"]).report_done(a["worker"], a["shard_id"], a["request_id"]),
            "acknowledge": lambda a: self.manager(a["dataset"]).acknowledge(
                a["worker"], [tuple(entry) for entry in a["acknowledged"]], a["request_id"]
            ),
            "fail": lambda a: self.manager(a["dataset"]).report_failure(
                a["worker"], a["shard_id"], a["reason"], a["consumed"], a["request_id"]
            ),
            # A line written before `charge` existed charged every removal.
            "remove_worker": lambda a: self._remove_worker(a["worker"], a["reason"], a.get("charge", True)),
            "restore": lambda a: self._restore(a["document"], a["dataset"], a["request_id"]),
            "advance_stream": lambda a: self.manager(a["dataset"]).advance_stream(a["partition"], a["end_offset"]),
        }

    @property
    def logs_changes(self) -> bool:
        """Whether changing calls are recorded for `take_changes` (see `start_change_log`)."""
        return self._log is not None

    def start_change_log(self) -> None:
        """Record every changing call from now on, for `take_changes` (a host that journals them; its
        first entry is a `journal_base`, which holds the calls made before). Idempotent."""
        if self._log is None:
            self._log = []
            self._clock.strict = True

    def _change(self, call: str, args: dict[str, Any]) -> Any:
        """Make a changing call with one clock reading throughout, and log it once it succeeded
        (a refused call changed nothing a later call could not redo: see `dlrover.shard.changelog`).
        Its line is written first, so arguments no line can hold are refused before anything changes.

        Raises:
            InvalidShardRequestError: an argument is not JSON-ready.
        """
        t = self._clock.read()
        line = None
        if self._log is not None:
            try:
                line = encode_call(self._seq + 1, t, call, args)
            except (TypeError, ValueError) as exc:
                raise InvalidShardRequestError(f"{call}: an argument cannot be logged: {exc}") from exc
        with self._clock.pinned(t):
            result = self._calls[call](args)
        if line is not None and self._log is not None:  # (both or neither: mypy sees two names)
            if call == "advance_stream" and not result.changed:
                return result  # reads no clock and changed nothing: nothing to replay
            self._seq += 1
            self._log.append(line)
        return result

    @property
    def config(self) -> ShardManagerConfig:
        """The settings shared by every manager."""
        return self._config

    def datasets(self) -> list[str]:
        """Registered dataset names, sorted."""
        return sorted(self._managers)

    def register(self, spec: DatasetSpec) -> RegisterResult:
        """Register a dataset; registering the identical spec again is a no-op.

        Raises:
            ShardStateError: a dataset of that name exists with a different spec.
        """
        if self._log is None:
            return self._register(spec)
        result: RegisterResult = self._change("register", {"spec": spec_to_json(spec)})
        return result

    def _register(self, spec: DatasetSpec) -> RegisterResult:
        old = self._managers.get(spec.name)
        if old is not None:
            if old.spec == spec:
                return RegisterResult(False, f"dataset {spec.name!r} is already registered with this spec")
            diff = "; ".join(_differences(old.spec, spec))
            raise ShardStateError(f"dataset {spec.name!r} is already registered with a different spec ({diff})")
        self._managers[spec.name] = ShardManager(spec, self._clock, self._config)
        return RegisterResult(True, f"dataset {spec.name!r} registered")

    def manager(self, name: str) -> ShardManager:
        """The manager of dataset `name`.

        Raises:
            UnknownDatasetError: no such dataset.
        """
        try:
            return self._managers[name]
        except KeyError:
            raise UnknownDatasetError(
                f"dataset {name!r} is not registered (registered: {sorted(self._managers)})"
            ) from None

    def fetch(self, dataset: str, worker: str, count: int = 1, request_id: str = "") -> FetchResult:
        """`ShardManager.fetch` of dataset `dataset`, logged.

        Raises:
            UnknownDatasetError: no such dataset.
            InvalidShardRequestError: as `ShardManager.fetch`.
        """
        result: FetchResult = self._change(
            "fetch", {"dataset": dataset, "worker": worker, "count": count, "request_id": request_id}
        )
        return result

    def report_progress(
        self,
        dataset: str,
        worker: str,
        shard_id: int,
        consumed: int,
        request_id: str = "",
        *,
        attempt: int | None = None,
    ) -> ReportResult:
        """`ShardManager.report_progress` of dataset `dataset`, logged."""
        args: dict[str, Any] = {"dataset": dataset, "worker": worker, "shard_id": shard_id, "consumed": consumed}
        if attempt is not None:
            args["attempt"] = attempt  # (a line without it means whichever dispatch the worker held)
        result: ReportResult = self._change("progress", {**args, "request_id": request_id})
        return result

    def report_done(self, dataset: str, worker: str, shard_id: int, request_id: str = "") -> ReportResult:
        """`ShardManager.report_done` of dataset `dataset`, logged."""
        args = {"dataset": dataset, "worker": worker, "shard_id": shard_id, "request_id": request_id}
        result: ReportResult = self._change("done", args)
        return result

    def acknowledge(
        self, dataset: str, worker: str, acknowledged: Sequence[tuple[int, int, bool]], request_id: str = ""
    ) -> ReportResult:
        """`ShardManager.acknowledge` of dataset `dataset`, logged (one line for the batch)."""
        entries = [list(entry) for entry in check_acknowledgements(acknowledged)]
        args = {"dataset": dataset, "worker": worker, "acknowledged": entries, "request_id": request_id}
        result: ReportResult = self._change("acknowledge", args)
        return result

    def report_failure(
        self,
        dataset: str,
        worker: str,
        shard_id: int,
        reason: str,
        *,
        consumed: int | None = None,
        request_id: str = "",
    ) -> ReportResult:
        """`ShardManager.report_failure` of dataset `dataset`, logged."""
        args = {"dataset": dataset, "worker": worker, "shard_id": shard_id, "reason": reason, "consumed": consumed}
        result: ReportResult = self._change("fail", {**args, "request_id": request_id})
        return result

    def advance_stream(self, dataset: str, partition: str, end_offset: int) -> ReportResult:
        """`ShardManager.advance_stream` of dataset `dataset`, logged."""
        args = {"dataset": dataset, "partition": partition, "end_offset": end_offset}
        result: ReportResult = self._change("advance_stream", args)
        return result

    def remove_worker(self, worker: str, reason: str = "worker left", *, charge: bool = True) -> dict[str, list[int]]:
        """Take back every shard `worker` holds in every dataset (`charge`: see `ShardManager.remove_worker`).

        Returns:
            dataset name -> ids of the shards returned.
        """
        args: dict[str, Any] = {"worker": worker, "reason": reason}
        if charge is not True:
            args["charge"] = charge  # only when set: the line of a charged removal reads as it always did
        result: dict[str, list[int]] = self._change("remove_worker", args)
        return result

    def _remove_worker(self, worker: str, reason: str, charge: bool = True) -> dict[str, list[int]]:
        if not isinstance(charge, bool):
            raise InvalidShardRequestError(f"charge must be a bool, got {charge!r}")
        return {name: m.remove_worker(worker, reason, charge=charge) for name, m in sorted(self._managers.items())}

    def checkpoint(self, name: str, *, include_leases: bool = False) -> str:
        """The progress checkpoint of dataset `name` (see `dlrover.shard.progress`).

        Args:
            name: the dataset.
            include_leases: keep the leases and their holders (for a service journaling its own
                state, so that a restart keeps workers training on what they hold).

        Raises:
            UnknownDatasetError: no such dataset.

        A read without leases is reused while the manager's `position_version` is unchanged (only
        leases since): each rank of a job reads the position after every step, and without reuse
        the master would write every open epoch's done bitmap and every lease once per rank and
        step, a cost that grows as ranks x leases.
        """
        manager = self.manager(name)
        if include_leases:
            return encode_progress(manager, include_leases=True)
        manager.expire_leases()  # an expiry changes the position: taken first, so the version says so
        version = manager.position_version
        read = self._positions.get(name)
        if read is not None and read[0] is manager and read[1] == version:
            return read[2]
        document = encode_progress(manager)
        self._positions[name] = (manager, version, document)
        return document

    def restore(self, document: str | bytes, dataset: str = "", request_id: str = "") -> RestoreResult:
        """Replace a dataset's state with a progress checkpoint, registering it if needed.

        Leases held now are dropped: their holders' next reports are rejected. A retried call
        with the same non-empty `request_id` returns the first call's result without restoring
        again, so a retry cannot undo progress made after the first restore.

        Args:
            document: the checkpoint.
            dataset: when not empty, the dataset the caller expects the checkpoint to be for.
            request_id: makes retries harmless.

        Raises:
            InvalidShardRequestError: the document is malformed, of another version, or of another
                dataset than `dataset`.
            ShardStateError: the dataset is registered with a different spec.
        """
        if isinstance(document, bytes | bytearray) and self._log is not None:
            try:
                document = bytes(document).decode(json.detect_encoding(document))
            except UnicodeDecodeError as exc:
                raise InvalidShardRequestError(f"progress checkpoint: not valid JSON: {exc}") from exc
        result: RestoreResult = self._change(
            "restore", {"document": document, "dataset": dataset, "request_id": request_id}
        )
        return result

    def _restore(self, document: str | bytes, dataset: str, request_id: str) -> RestoreResult:
        if not isinstance(request_id, str) or len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidShardRequestError(f"request id must be a string of at most {MAX_REQUEST_ID_CHARS} characters")
        if request_id and request_id in self._restores:
            return self._restores[request_id]
        spec, state = decode_progress(document)
        if dataset and spec.name != dataset:
            raise InvalidShardRequestError(f"the checkpoint is of dataset {spec.name!r}, not {dataset!r}")
        old = self._managers.get(spec.name)
        if old is not None and old.spec != spec:
            raise ShardStateError(
                f"checkpoint of dataset {spec.name!r} has a different spec than the registered one "
                f"({'; '.join(_differences(old.spec, spec))})"
            )
        manager, in_flight = ShardManager.from_state(spec, state, self._clock, self._config)
        self._managers[spec.name] = manager
        self._positions.pop(spec.name, None)  # the replaced manager's read, and the manager with it
        if "leases" in state:
            reason = f"dataset {spec.name!r} restored; {in_flight} shard(s) stay leased to the workers holding them"
            in_flight = 0
        else:
            reason = f"dataset {spec.name!r} restored; {in_flight} shard(s) leased at the checkpoint are queued again"
        result = RestoreResult(spec.name, in_flight, reason)
        if request_id:
            self._restores[request_id] = result
            while len(self._restores) > self._config.request_cache_size:
                self._restores.popitem(last=False)
        return result

    # ------------------------------------------------------------------ change log

    def take_changes(self) -> list[LoggedCall]:
        """The changing calls logged since the last take, oldest first (none unless `log_changes`)."""
        if not self._log:
            return []
        taken, self._log = self._log, []
        return taken

    def journal_base(self) -> LoggedCall:
        """Everything, exported for a change log's base: every dataset exactly (lease deadlines and
        remembered replies included) and the restore replies, numbered after every call logged so far.

        Calls logged before it are in it; `take_changes` still returns those not taken yet.
        """
        return encode_base(*self.journal_base_document())

    def journal_base_document(self) -> tuple[int, dict[str, Any]]:
        """`journal_base` before its encoding: its number and its JSON-ready document, which shares
        nothing with the registry. A host that serves the registry under a lock encodes it
        (`dlrover.shard.changelog.encode_base`) after letting the lock go: the encoding is most of a
        base's cost, which grows with the workers, and calls need not wait for it."""
        t = self._clock.read()
        with self._clock.pinned(t), _collection_paused():
            datasets = [
                progress_document(m, include_leases=True, exact=True) for _, m in sorted(self._managers.items())
            ]
        restores = [
            {"request_id": rid, "dataset": r.dataset, "returned_to_queue": r.returned_to_queue, "reason": r.reason}
            for rid, r in self._restores.items()
        ]
        self._seq += 1
        doc = {
            "format": REGISTRY_BASE_FORMAT,
            "version": REGISTRY_BASE_VERSION,
            "seq": self._seq,
            "time": t,
            "config": attrs.asdict(self._config),
            "datasets": datasets,
            "restores": restores,
        }
        return self._seq, doc

    def load_journal(self, base: LoggedCall, changes: Iterable[LoggedCall] = (), *, restart_leases: bool = True) -> int:
        """Become what the registry that wrote `base` and then logged `changes` was, then give every
        lease a whole lease period from now (as after any restart). Changes numbered at or below the
        base's number are in it and skipped; the rest are replayed in order with the clock readings
        they carry. Later logged calls are numbered after the last one loaded.

        Args:
            base: a `journal_base`.
            changes: lines `take_changes` returned after it (earlier ones are skipped).
            restart_leases: False keeps each lease's deadline on the writer's clock, for a replica
                on that same clock (a test, a simulation); a restarted host's clock is another.

        Returns:
            How many changes were replayed.

        Raises:
            ShardStateError: the registry is not empty.
            InvalidShardRequestError: the base or a change is malformed, or a change fails on the
                state before it (a log that does not belong to the base); the message names it.
                The registry is then in no defined state and must be discarded.
        """
        if self._managers or self._restores:
            raise ShardStateError("a journal loads only into an empty registry")
        t, config, datasets, restores = self._base_fields(base)
        current, self._config = self._config, config or self._config
        try:
            replayed = self._replay(base, t, datasets, restores, changes)
        finally:
            self._config = current
        for manager in self._managers.values():
            manager._use_config(current)  # the writer's settings decided the lines; ours decide from now
            if restart_leases:
                manager._restart_leases()
        return replayed

    def _replay(
        self,
        base: LoggedCall,
        t: float,
        datasets: list[Any],
        restores: list[dict[str, Any]],
        changes: Iterable[LoggedCall],
    ) -> int:
        with self._clock.pinned(t):
            for i, doc in enumerate(datasets):
                try:
                    spec, state = check_progress_document(doc)
                    manager, _ = ShardManager.from_state(spec, state, self._clock, self._config, exact=True)
                except InvalidShardRequestError as exc:
                    raise InvalidShardRequestError(f"journal base {base.seq}, dataset {i}: {exc}") from None
                self._managers[spec.name] = manager
        for r in restores:
            self._restores[r["request_id"]] = RestoreResult(r["dataset"], r["returned_to_queue"], r["reason"])
        self._seq = base.seq
        replayed = 0
        for change in sorted(changes, key=lambda c: c.seq):
            if change.seq <= base.seq:
                continue
            when, call, args = decode_call(change)
            try:
                with self._clock.pinned(when):
                    self._calls[call](args)
            except (ShardError, KeyError, TypeError, ValueError, AttributeError) as exc:
                raise InvalidShardRequestError(
                    f"change {change.seq} ({call}) does not apply to the journal: {type(exc).__name__}: {exc}"
                ) from None
            self._seq = change.seq
            replayed += 1
        return replayed

    @staticmethod
    def _base_fields(base: LoggedCall) -> tuple[float, ShardManagerConfig | None, list[Any], list[dict[str, Any]]]:
        try:
            doc = json.loads(base.text)
        except ValueError as exc:
            raise InvalidShardRequestError(f"journal base {base.seq}: not valid JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != REGISTRY_BASE_FORMAT:
            raise InvalidShardRequestError(f"journal base {base.seq}: not a {REGISTRY_BASE_FORMAT!r} document")
        if doc.get("version") != REGISTRY_BASE_VERSION:
            raise InvalidShardRequestError(
                f"journal base {base.seq}: version {doc.get('version')!r}; this build reads {REGISTRY_BASE_VERSION}"
            )
        if doc.get("seq") != base.seq:
            raise InvalidShardRequestError(f"journal base {base.seq}: it says it is number {doc.get('seq')!r}")
        t, datasets, restores = doc.get("time"), doc.get("datasets"), doc.get("restores")
        if isinstance(t, bool) or not isinstance(t, int | float):
            raise InvalidShardRequestError(f"journal base {base.seq}: time must be a number, got {t!r}")
        if not isinstance(datasets, list) or not isinstance(restores, list):
            raise InvalidShardRequestError(f"journal base {base.seq}: datasets and restores must be lists")
        for i, r in enumerate(restores):
            if not (
                isinstance(r, dict)
                and all(isinstance(r.get(k), str) for k in ("request_id", "dataset", "reason"))
                and isinstance(r.get("returned_to_queue"), int)
            ):
                raise InvalidShardRequestError(f"journal base {base.seq}: restores[{i}] is malformed")
        config = None
        if "config" in doc:  # (a base converted from an older host's export has none)
            try:
                # A base from before `done_when_acknowledged` existed decided without it.
                config = ShardManagerConfig(**{"done_when_acknowledged": False, **doc["config"]})
            except (TypeError, ValueError, ConfigError) as exc:
                raise InvalidShardRequestError(f"journal base {base.seq}: config: {exc}") from None
        return float(t), config, datasets, restores


@contextmanager
def _collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a block that allocates many acyclic objects.

    A base builds a few dicts per lease. Those allocations trigger full collections, each a walk
    over the whole heap, which grows with the leases too: at 80,000 leases they were most of the
    document's cost (0.41 to 0.64 s with the collector, 0.15 to 0.22 s without), paid under the
    lock every shard call waits on. Nothing in the block makes a cycle, so nothing is left for
    the collector; it runs again as usual afterwards. A block that finds the collector paused
    leaves it to whoever paused it.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
