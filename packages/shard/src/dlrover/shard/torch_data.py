"""PyTorch adapters: a `Sampler` and an `IterableDataset` that draw sample indices from ShardService.

Both acknowledge samples only when the training loop says they were trained (`commit`), not when
they were handed to the `DataLoader`: with `num_workers>0` the loader runs batches ahead, and an
acknowledgement at hand-out would let a crash skip the batches that were loaded but never trained.
`state_dict()` returns the dataset's progress checkpoint at the committed position, so saving it
with the model checkpoint and calling `load_state_dict()` on resume neither repeats nor skips a
sample (use `DeliveryMode.EXACTLY_ONCE` for the dataset).

- `ShardSampler` runs in the main process (the `DataLoader` always draws indices there), so it
  works with any `num_workers` and start method; the workers only load `dataset[index]`.
- `ShardIterableDataset` fetches shards inside each loader worker, each with its own client and
  worker id (`<worker>/loader-<i>`), and yields `(sample, cursor)`; pass the batch's cursors to
  `commit`. A gRPC channel must not cross `fork()`, so with `num_workers>0` pass a "forkserver"
  (or "spawn") `multiprocessing_context`; `ctx.set_forkserver_preload(["torch"])` makes workers
  start fast.

One iteration over a `DataLoader` is one *pass*. A pass ends when the dataset is finished, or
when no shard is available right now while samples of this trainer are still uncommitted (its
own leases are what everybody waits for, so blocking would deadlock). Loop until `finished`::

    while not sampler.finished:
        for batch in loader:
            train(batch)
            sampler.commit(len(batch))

`ShardSampler.commit` acknowledges the oldest yielded samples first, so commit what you trained
before you start the next pass: a new pass first hands out again what the last one yielded and
nobody committed (what a `DataLoader` with `drop_last=True` dropped at the pass's end, or had
prefetched when the loop broke out), then the rest of the shard it was in, then new shards; samples
of a shard whose lease ended meanwhile (a pause past the client's keep-alive) are left to the service,
which hands that shard out again. At the end of the data, the samples a `drop_last=True` loader
drops again and again are acknowledged as dropped only if the sampler was told
(`ShardSampler(..., drop_last=True)`); otherwise each pass starts with a warning saying so, and
`finished` never comes. Only the newest pass hands out indices: an older iterator, left suspended
by the loader, ends when a new pass or `load_state_dict` comes.

torch is an optional extra; this module imports it at import time, `dlrover.shard` does not.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import attrs
import torch
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from dlrover.common import ConfigError
from dlrover.common.step_slots import optional_reporter
from dlrover.shard._data_state import acknowledged_in, check_state, make_state
from dlrover.shard._group_acks import GroupAcks
from dlrover.shard.acknowledged import apply_acknowledged
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.errors import ShardError
from dlrover.shard.shard import Shard

__all__ = ["ShardSampler", "ShardIterableDataset", "STATE_FORMAT", "STATE_VERSION"]

STATE_FORMAT = "dlrover.shard.torch"
STATE_VERSION = 3
"""The newest data state version: 3 carries the acknowledgements exchanged after the document was read
(a sampler with a process group) packed in one string; 2 (the same as a list) and 1 (a document alone)
are still read."""
_READ_VERSIONS = (1, 2, STATE_VERSION)
_T = TypeVar("_T")
_R = TypeVar("_R")
_log = logging.getLogger(__name__)


def _state(dataset: str, document: str) -> dict[str, Any]:
    return make_state(STATE_FORMAT, 1, dataset, document)


def _dispatch(shard: Shard) -> tuple[int, int]:
    """Which lease of which shard: a shard handed out again is another dispatch of it."""
    return shard.shard_id, shard.attempt


def _check_state(state: dict[str, Any], dataset: str) -> str:
    """The progress document of a state of any version read, with its acknowledgements applied."""
    document = check_state(STATE_FORMAT, _READ_VERSIONS, state, dataset)
    acknowledged = acknowledged_in(state)
    if not acknowledged:
        return document
    try:
        return apply_acknowledged(document, acknowledged)
    except ShardError as exc:
        raise ConfigError(f"data state of dataset {dataset!r}: {exc}") from exc


class _Acks:
    """Positions reached per (worker, shard), reported as progress, and done at the shard's end."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], tuple[int, int]] = {}

    def add(self, worker: str, shard_id: int, position: int, size: int) -> None:
        key = (worker, shard_id)
        old = self._pending.get(key)
        if old is None or position > old[0]:
            self._pending[key] = (position, size)

    def flush(self, client_for: Callable[[str], ShardClient]) -> None:
        pending, self._pending = self._pending, {}
        for (worker, shard_id), (position, size) in sorted(pending.items()):
            client = client_for(worker)
            if position >= size:
                client.report_done(shard_id)
            else:
                client.report_progress(shard_id, position)


@attrs.frozen
class _Yielded:
    """A sample handed out: its index, and the shard `position` its acknowledgement reaches (1-based)."""

    shard: Shard
    position: int
    index: int


@attrs.define
class _Pass:
    """What a pass did, read when the next one starts: the commit count when it started, whether it handed out
    only samples an earlier pass had yielded, and whether it ended because no shard came in `wait_s`."""

    commits_at_start: int
    replay_only: bool = True
    timed_out: bool = False


class ShardSampler(Sampler[int]):
    """Yields the sample indices of the shards leased to `client`, in shard order.

    Args:
        client: the shard client (its dataset must be an index source); owned by the caller.
        wait_s: while samples are uncommitted, how long to wait for a next shard before ending
            the pass (see the module's notes on passes).
        drop_last: the `DataLoader` drops a pass's last, partial batch: at the end of the data, the
            samples it keeps dropping are acknowledged as dropped (see the module's notes).
        process_group: the trainers that call `state_dict` at the same steps (a DDP job's
            data-parallel group, e.g. ``torch.distributed.group.WORLD``). Given, commits are not
            reported one call each: every `state_dict` all-gathers the group's acknowledgements
            since the last one (a collective, so every trainer of the group must call it), and
            every `sync_every` calls one call per trainer reports its own, reads the data position
            and leases the next shard when one is needed; in the other calls an on-demand client
            (`prefetch_shards=0`) leases the next shard, when one is needed, in the background
            after the exchange (`ShardClient.lease_ahead`), so the call is out while the step's
            checkpoint is saved. Either way every step's shards are the service's next ones
            whichever trainer asks first. The state then carries the position read and the
            acknowledgements since (version 3, packed); a restore applies them. Commits reach the service
            within `2 * sync_every` commits even without a `state_dict`, and at once near the
            data's end.
        sync_every: with a process group, `state_dict` calls between two calls to the service.
    """

    def __init__(
        self,
        client: ShardClient,
        wait_s: float = 1.0,
        *,
        drop_last: bool = False,
        process_group: Any = None,
        sync_every: int = 8,
    ) -> None:
        if not wait_s > 0:
            raise ConfigError(f"wait_s must be positive, got {wait_s!r}")
        self._group = GroupAcks(process_group, sync_every) if process_group is not None else None
        self._commits_unsent = 0
        self._client = client
        self._wait_s = wait_s
        self._drop_last = drop_last
        # Committed samples reach the agent's step reports (and so the master) under dlrover-run.
        self._steps = optional_reporter()
        self._inflight: deque[_Yielded] = deque()
        self._shard: Shard | None = None  # the shard being handed out
        self._unyielded: deque[int] = deque()  # its samples not handed out yet
        self._commits = 0  # commit() calls that acknowledged something
        # The most samples committed between two `state_dict` calls (a round: several commits under
        # gradient accumulation) and the most a shard had (the data's last shard may be shorter):
        # how many shards a trainer of a group takes between two syncs (0: none seen yet).
        self._round_samples = 0
        self._widest_round = 0
        self._widest_shard = 0
        # Each pass (and each load_state_dict) takes the next number: a pass's iterator that the loader left
        # suspended stops handing out once a newer one exists, so two never interleave.
        self._generation = 0
        self._last_pass: _Pass | None = None
        self._finished = False

    @property
    def _next_index_needs_a_shard(self) -> bool:
        """The shard being handed out is used up and the dataset is not finished."""
        return not self._unyielded and not self._finished

    @property
    def finished(self) -> bool:
        """The service said the dataset is finished: no pass will yield anything again."""
        return self._finished

    def __iter__(self) -> Iterator[int]:
        self._generation += 1
        generation = self._generation
        self._forget_lost_leases()
        if self._left_by_the_loader():
            self._drop_what_the_loader_left()
        this_pass = self._last_pass = _Pass(commits_at_start=self._commits)
        # What an earlier pass yielded and nobody committed was not trained: hand it out again first. (A
        # snapshot: commits pop from the front of `_inflight` while this pass runs.)
        for item in list(self._inflight):
            yield item.index
            if self._generation != generation:
                return
        while True:
            shard = self._shard
            while shard is not None and self._unyielded:
                item = _Yielded(shard, shard.size - len(self._unyielded) + 1, self._unyielded.popleft())
                self._inflight.append(item)
                this_pass.replay_only = False
                yield item.index
                if self._generation != generation:
                    return
            try:
                # Holding nothing uncommitted, waiting cannot deadlock: wait for a shard or the end.
                shard = self._next_shard()
            except TimeoutError:
                this_pass.timed_out = True
                return  # end the pass so the training loop can commit what it holds
            if shard is None:
                self._finished = True
                return
            if self._group is not None:
                self._group.taken_since_sync += 1
                self._widest_shard = max(self._widest_shard, shard.size)
            self._shard, self._unyielded = shard, deque(shard.remaining_samples())

    def _next_shard(self) -> Shard | None:
        if self._inflight:
            return self._client.next_shard(timeout_s=self._wait_s)
        if self._group is not None and self._group.unsent:
            # A lease asked for ahead is a shard on its way: waited for, not taken for none to be
            # had (which would send the unsent reports, one call each, from the training thread).
            self._client.settle_lease_ahead()
            try:
                return self._client.next_shard(timeout_s=0.0)
            except TimeoutError:
                # None to be had now: what it waits for may be the end of the data, which the
                # service sees only once every trainer reported its last commits; its own go first.
                self._report_unsent(self._group)
        return self._client.next_shard(timeout_s=None)

    def _forget_lost_leases(self) -> None:
        """Leave out of the next pass the samples of shards whose leases ended while they waited (a loop paused
        past the client's keep-alive): the service hands those shards out again, perhaps to another worker, and
        training them here too would train them twice."""
        # By dispatch, not by shard: a lease that ended may have come back to this worker as a new
        # dispatch of the same shard, which starts from the last committed position again.
        shards = {_dispatch(item.shard): item.shard for item in self._inflight}
        if self._shard is not None and self._unyielded:
            shards[_dispatch(self._shard)] = self._shard
        lost = {key for key, shard in shards.items() if not self._client.holds(shard)}
        if not lost:
            return
        dropped = sum(1 for item in self._inflight if _dispatch(item.shard) in lost)
        self._inflight = deque(item for item in self._inflight if _dispatch(item.shard) not in lost)
        if self._shard is not None and _dispatch(self._shard) in lost:
            dropped += len(self._unyielded)
            self._shard, self._unyielded = None, deque()
        _log.warning(
            "the leases of shards %s of dataset %r ended before %d of their samples were trained; the service hands "
            "them out again from their last committed position",
            sorted({shard_id for shard_id, _attempt in lost}),
            self._client.dataset,
            dropped,
        )

    def _left_by_the_loader(self) -> bool:
        """Whether the uncommitted samples are what a `drop_last` loader drops at the end of the data: the last
        pass handed out only them, found no shard to follow, the loop committed nothing since it started, and the
        dataset has nothing left to hand out. (Judged when the next pass starts, once the loop has trained all
        the last one gave it: a loader with workers draws indices ahead of the batches it trains.)"""
        last = self._last_pass
        if last is None or not self._inflight:
            return False
        if not (last.replay_only and last.timed_out and last.commits_at_start == self._commits):
            return False
        status = self._client.status()
        return status.todo == 0 and status.epochs_remaining == 0

    def _drop_what_the_loader_left(self) -> None:
        count = len(self._inflight)
        if not self._drop_last:
            _log.warning(
                "%d uncommitted samples are all that is left of dataset %r and a pass handed them out again without "
                "a commit: a DataLoader with drop_last=True drops them; give ShardSampler drop_last=True to "
                "acknowledge them as dropped, or commit what was trained",
                count,
                self._client.dataset,
            )
            return
        _log.warning("acknowledging %d samples of dataset %r as dropped (drop_last) at the end of the data", count,
                     self._client.dataset)  # fmt: skip
        self._acknowledge(count)
        if self._group is not None:
            self._report_unsent(self._group)  # the service says `finished` only once it has them

    def commit(self, num_samples: int) -> None:
        """Acknowledge the next `num_samples` yielded indices as trained (call after each step).

        Raises:
            ConfigError: more samples committed than were yielded.
        """
        if num_samples > len(self._inflight) or num_samples < 0:
            raise ConfigError(
                f"cannot commit {num_samples} samples; {len(self._inflight)} were yielded and not committed"
            )
        self._acknowledge(num_samples)
        if num_samples:
            self._commits += 1
            self._round_samples += num_samples
            if self._steps is not None:
                self._steps.add_samples(num_samples)

    def _acknowledge(self, num_samples: int) -> None:
        acks = _Acks()
        for _ in range(num_samples):
            item = self._inflight.popleft()
            if self._group is not None:
                self._group.add(item.shard.shard_id, item.position, item.shard.size)
                self._client.note_in_use(item.shard.shard_id)  # not abandoned: its report waits for a sync
            else:
                acks.add(self._client.worker, item.shard.shard_id, item.position, item.shard.size)
        if self._group is None:
            acks.flush(lambda _worker: self._client)
            return
        self._commits_unsent += 1
        # Reported as a sampler without a group reports them: near the data's end (a trainer
        # waiting there for the last shards waits for its peers' acknowledgements, which must not
        # wait for a sync its peers reach only after the next collective), or after no
        # state_dict for a while (the service's bookkeeping of a lost worker's shards and of
        # throughput stays current).
        if self._group.near_end or self._commits_unsent >= 2 * self._group.sync_every:
            self._report_unsent(self._group)

    def _report_unsent(self, group: GroupAcks) -> None:
        """Report this trainer's acknowledgements not reported yet, one call a shard, as a sampler
        without a group reports them. (Reported at any time they keep the saved states exact: see
        `dlrover/shard/_group_acks.py`; each sync first delivers what the client still queues.)"""
        self._client.report_each(group.unsent)
        group.mark_sent()
        self._commits_unsent = 0

    def state_dict(self) -> dict[str, Any]:
        """The data position to store in the model checkpoint (the committed samples).

        With an on-demand client (`ShardClientConfig(prefetch_shards=0)`), when the next index
        needs a new shard the same call leases it (see `ShardClient.checkpoint`): a loop that
        commits and saves after every step makes two calls per step, not three.
        """
        if self._group is not None:
            return self._group_state_dict(self._group)
        lease_next = self._next_index_needs_a_shard
        return _state(self._client.dataset, self._client.checkpoint(lease_next=lease_next))

    def _group_state_dict(self, group: GroupAcks) -> dict[str, Any]:
        self._widest_round = max(self._widest_round, self._round_samples)
        self._round_samples = 0
        if group.near_end:
            # Every commit is reported at once here, so after the exchange (a collective that
            # follows every trainer's commit) the position read holds the whole group's progress;
            # the fence keeps every trainer from its next commit until all have read. The state is
            # then the position alone, as without a group (the same bytes whatever was read when).
            self._client.flush_reports(None)  # delivered, not queued, before the others read
            group.exchange()
            lease_next = self._next_index_needs_a_shard
            document = self._client.checkpoint(lease_next=lease_next)
            group.fence()
            group.read_exactly(document)
            return make_state(STATE_FORMAT, STATE_VERSION, self._client.dataset, document, [])
        if group.sync_due:
            # Leases the next shard in the same call when the next index needs one, as a read
            # without a group does; otherwise each shard is leased when it is needed, in the order
            # the trainers need them (so a restore hands them out again in the same order).
            # (Not when the last round leased it ahead and no step drew it since.)
            lease = 1 if self._next_index_needs_a_shard and not self._client.buffered else 0
            result = self._client.sync(group.unsent, lease=lease)
            self._note_the_data_end(group, result.shards_to_hand_out)
            group.synced(result.document)
            self._commits_unsent = 0
        group.exchange()
        if not group.near_end and self._next_index_needs_a_shard:
            # The next step's shard, leased while this step's checkpoint is saved rather than when
            # the step needs it. Only now: every trainer of the group leased this step's shard
            # before it trained the step, and this trainer passed the exchange after the step, so
            # every step's shards are the next ones in the service's order, whichever trainer
            # asks first (as leasing on demand keeps them). Near the data's end every round reads
            # the position and leases in that call.
            self._client.lease_ahead()
        assert group.document is not None
        return make_state(STATE_FORMAT, STATE_VERSION, self._client.dataset, group.document, group.acknowledged())

    def _note_the_data_end(self, group: GroupAcks, left: int | None) -> None:
        """Near the data's end (fewer shards left than twice what the group takes until the next
        sync) every commit is reported at once and every round reads the position, as without a
        group, from the round after the group agreed on it (see `_acknowledge` and
        `_group_state_dict`), so the last shards are handed out and the data ends without waiting
        for a sync. (A trainer that finds no shard earlier reports its own commits before it waits,
        so the data's end is reached either way; this keeps that wait from happening.)

        What a trainer takes until the next sync: `sync_every` rounds of its widest round (the
        samples committed between two `state_dict` calls), in shards of the most samples a shard had
        (the data's last shard may hold fewer), and no fewer than it took since the last sync; one
        shard a round before it committed anything. (Counting one shard a round whatever the shards'
        size put a job whose shards hold eight batches near the end for its whole last half: a call
        to the service and a fence every round.)"""
        if self._widest_round and self._widest_shard:
            ahead = -(-group.sync_every * self._widest_round // self._widest_shard)  # ceil
        else:
            ahead = group.sync_every
        need = max(group.taken_since_sync, ahead)
        if left is not None and left < 2 * need * group.size:
            group.low_todo_seen = True  # the group agrees in this round's exchange

    def _checked(self, state: dict[str, Any]) -> str:
        """The state's progress document, checked but not completed (a trainer that does not restore)."""
        acknowledged_in(state)
        return check_state(STATE_FORMAT, _READ_VERSIONS, state, self._client.dataset)

    def _agreed(self, do: Callable[[], _R], peer_failed: Callable[[], Exception]) -> _R:
        """`do()`, after which every trainer of the group knows whether any one's failed (a
        collective): a trainer whose `do` raised raises that, the others `peer_failed()`, rather
        than wait in the next collective for one that left."""
        try:
            result = do()
        except Exception:
            if self._group is not None:
                self._group.fence(failed=True)
            raise
        if self._group is not None and self._group.fence():
            raise peer_failed()
        return result

    def load_state_dict(self, state: dict[str, Any], restore: bool = True) -> None:
        """Resume from `state_dict()` output.

        Args:
            state: what `state_dict()` returned.
            restore: restore the service's dataset from it; with several trainers sharing a
                dataset, let exactly one of them restore (e.g. rank 0) before the others fetch.

        With a process group this is a collective, as `state_dict` is: every trainer of the group
        calls it. Each first waits for the next shard it may be leasing in the background, and none
        restores before all have, so the restore drops that lease too (one served after it would
        stay leased to a trainer that forgets it); none returns before the restore is done, so no
        lease is asked for before it (the restore would drop that one too). A refusal on one trainer
        is raised on all of them.

        Raises:
            ConfigError: the state is of another format, version or dataset, or (restoring) its
                acknowledgements do not fit its document; with a group, also when another trainer
                refused its state (nothing changed).
            ShardError: with a group, another trainer's restore failed (its own error is raised
                there, and its position is then unknown: the service may have applied the restore);
                this trainer changed nothing.
        """
        if self._group is not None:
            self._client.settle_lease_ahead()
            self._group.fence()
        document = self._agreed(
            lambda: _check_state(state, self._client.dataset) if restore else self._checked(state),
            lambda: ConfigError("another trainer of the group refused its state (its error says why); nothing changed"),
        )
        # None leases before the restore reached the service (it would drop that lease and hand
        # the shard out again), and none forgets its leases unless the restore dropped them.
        self._agreed(
            lambda: self._client.restore(document) if restore else None,
            lambda: ShardError(
                "another trainer of the group could not restore the data position (its error says why); "
                "this trainer's position and leases are unchanged"
            ),
        )
        if not restore:
            self._client.discard_buffered()  # the trainer that restored dropped every lease
        self._generation += 1  # a pass the loader left suspended hands out nothing of the old position
        if self._group is not None:
            self._group.reset()
            self._commits_unsent = 0
            self._round_samples = 0
        self._last_pass = None
        self._inflight.clear()
        self._shard, self._unyielded = None, deque()
        self._finished = False


class ShardIterableDataset(IterableDataset[tuple[_T, list[int]]], Generic[_T]):
    """Yields `(load(index), cursor)` for the samples of shards fetched inside each loader worker.

    Args:
        target: `host:port` of the shard service.
        token: the job token.
        dataset: the dataset (an index source).
        worker: this trainer's id; loader worker i leases shards as `<worker>/loader-<i>`.
        load: turns an index into a sample (default: the index itself).
        config: client settings (deadlines, retries); loader workers fetch one shard at a time
            on demand (the DataLoader already prefetches batches).
        wait_s: how long a loader worker waits for a shard before ending its part of the pass.
    """

    def __init__(
        self,
        target: str,
        token: str,
        dataset: str,
        worker: str,
        *,
        load: Callable[[int], _T] | None = None,
        config: ShardClientConfig | None = None,
        wait_s: float = 2.0,
    ) -> None:
        if not wait_s > 0:
            raise ConfigError(f"wait_s must be positive, got {wait_s!r}")
        self._wait_s = wait_s
        self._target = target
        self._token = token
        self._dataset = dataset
        self._worker = worker
        self._load = load
        self._config = config or ShardClientConfig()
        # No prefetch in loader workers: a buffered lease would outlive a pass that ends.
        self._worker_config = attrs.evolve(self._config, prefetch_shards=0, fetch_count=1)
        self._clients: dict[str, ShardClient] = {}

    def __iter__(self) -> Iterator[tuple[_T, list[int]]]:
        info = get_worker_info()
        slot = -1 if info is None else int(info.id)
        worker = self._worker if slot < 0 else f"{self._worker}/loader-{slot}"
        with ShardClient(self._target, self._token, self._dataset, worker, config=self._worker_config) as client:
            while True:
                try:
                    shard = client.next_shard(timeout_s=self._wait_s)
                except TimeoutError:
                    return  # the main process may hold our uncommitted samples: end the pass
                if shard is None:
                    return
                for offset, index in enumerate(shard.remaining_samples(), start=shard.consumed + 1):
                    sample = self._load(index) if self._load is not None else index
                    yield sample, [slot, shard.shard_id, offset, shard.size]  # type: ignore[misc]

    def _client(self, worker: str) -> ShardClient:
        client = self._clients.get(worker)
        if client is None:
            client = self._clients[worker] = ShardClient(
                self._target, self._token, self._dataset, worker, config=self._config
            )
        return client

    def commit(self, cursors: Sequence[Any]) -> None:
        """Acknowledge a trained batch, given the batch's cursors (as collated by the DataLoader).

        Accepts the default-collated form (four tensors or lists: loader slot, shard id,
        position, shard size) or a list of per-sample `[slot, shard_id, position, size]`.
        """
        rows = _cursor_rows(cursors)
        acks = _Acks()
        for slot, shard_id, position, size in rows:
            worker = self._worker if slot < 0 else f"{self._worker}/loader-{slot}"
            acks.add(worker, shard_id, position, size)
        acks.flush(self._client)

    def finished(self) -> bool:
        """Whether the service says the dataset is finished (asked from the main process)."""
        return self._client(self._worker).status().finished

    def state_dict(self) -> dict[str, Any]:
        """The data position to store in the model checkpoint (the committed samples)."""
        return _state(self._dataset, self._client(self._worker).checkpoint())

    def load_state_dict(self, state: dict[str, Any], restore: bool = True) -> None:
        """Resume from `state_dict()` output; see `ShardSampler.load_state_dict`."""
        document = _check_state(state, self._dataset)
        if restore:
            self._client(self._worker).restore(document)

    def close(self) -> None:
        """Close the main-process clients used by `commit` and `state_dict`."""
        for client in self._clients.values():
            client.close(return_buffered=False)
        self._clients.clear()

    def __getstate__(self) -> dict[str, Any]:
        # Loader workers get the settings, never the main process's open clients.
        state = dict(self.__dict__)
        state["_clients"] = {}
        return state


def _cursor_rows(cursors: Sequence[Any]) -> list[tuple[int, int, int, int]]:
    if len(cursors) == 4 and all(isinstance(c, torch.Tensor) and c.dim() == 1 for c in cursors):
        cols = [c.tolist() for c in cursors]
        return [(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(*cols, strict=True)]
    return [(int(r[0]), int(r[1]), int(r[2]), int(r[3])) for r in cursors]
