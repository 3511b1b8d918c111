"""TensorFlow adapter (optional extra `tf`): `tf.data` pipelines that draw sample indices from ShardService.

TensorFlow is imported only when a `tf.data.Dataset` is built, never when this module is.

`ShardTFDataset` is the exactly-once source. Its dataset yields `(index, cursor)` pairs; map the
index to a sample, batch, prefetch, and after each training step pass the batch's cursors to
`commit`. Samples are acknowledged only then, not when the pipeline pulled them (tf.data runs
ahead of the model), and `state_dict()` is the dataset's progress checkpoint at the committed
position, so storing it with the model checkpoint and calling `load_state_dict()` on resume
neither repeats nor skips a sample (use `DeliveryMode.EXACTLY_ONCE` for the dataset)::

    feed = ShardTFDataset(client)
    ds = feed.dataset().map(lambda i, c: (load(i), c)).batch(32).prefetch(2)
    while not feed.finished:
        for samples, cursors in ds:
            train_step(samples)
            feed.commit(cursors)

One iteration over the dataset is one *pass*. A pass ends when the dataset is finished, or when
no shard is available right now while samples of this feed are uncommitted (its own leases may be
what everybody waits for, so blocking would deadlock). Each pass first yields again the
uncommitted rest of the shards this feed holds, so samples a previous, interrupted pass pulled
but never delivered are not lost; commit each pass's batches before starting the next.

Acknowledging a position acknowledges every sample of the shard before it, so the pipeline must
keep each shard's samples in order between the source and `commit`: no `shuffle` after the
source, no `map(..., deterministic=False)`. `commit` checks this and raises `ConfigError` for a
cursor out of order instead of acknowledging samples that were not trained.

`make_tf_dataset` is the plain alternative: a dataset of indices that reports each shard done
once all of its indices were handed to TensorFlow. It needs no commits, but a worker that dies
loses what tf.data had pulled and not yet trained (at-most-once with respect to the model).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from dlrover.common import ConfigError
from dlrover.shard._data_state import check_state, make_state
from dlrover.shard.client import ShardClient
from dlrover.shard.shard import Shard

__all__ = ["ShardTFDataset", "make_tf_dataset", "shard_indices", "STATE_FORMAT", "STATE_VERSION"]

STATE_FORMAT = "dlrover.shard.tf"
STATE_VERSION = 1


def _import_tf() -> Any:
    try:
        import tensorflow as tf  # the optional extra, imported only here
    except ImportError as exc:
        raise ImportError(
            f"TensorFlow is needed for tf.data datasets: pip install 'dlrover-shard[tf]' ({exc})"
        ) from exc
    return tf


class _Open:
    """A shard this feed holds: how far it has been committed and how far yielded."""

    __slots__ = ("committed", "shard", "yielded")

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.committed = shard.consumed
        self.yielded = shard.consumed


class _Tracker:
    """Per-shard committed and yielded positions; shared by the pipeline's thread and the trainer's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}

    def open(self, shard: Shard) -> None:
        with self._lock:
            self._open[shard.shard_id] = _Open(shard)

    def yielded(self, shard_id: int, position: int) -> None:
        with self._lock:
            entry = self._open.get(shard_id)
            if entry is not None and position > entry.yielded:
                entry.yielded = position

    def committed(self, shard: Shard) -> int:
        """How far `shard` is committed (its acknowledged position when this feed does not hold it)."""
        with self._lock:
            entry = self._open.get(shard.shard_id)
            return shard.consumed if entry is None else entry.committed

    def pending(self) -> int:
        """Samples yielded and not committed."""
        with self._lock:
            return sum(e.yielded - e.committed for e in self._open.values())

    def rewind(self) -> list[Shard]:
        """Forget what was yielded and not committed; returns the shards with a rest to yield again."""
        with self._lock:
            for e in self._open.values():
                e.yielded = e.committed
            return [e.shard for e in self._open.values() if e.committed < e.shard.size]

    def check(self, rows: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """Validate a batch of cursors; returns shard id -> (new committed position, shard size).

        Raises:
            ConfigError: a cursor of a shard this feed does not hold, or out of order.
        """
        with self._lock:
            acks: dict[int, tuple[int, int]] = {}
            for shard_id, position in rows:
                entry = self._open.get(shard_id)
                if entry is None:
                    raise ConfigError(
                        f"cursor ({shard_id}, {position}) is of a shard this feed does not hold: committed "
                        "already, or from before load_state_dict"
                    )
                expected = acks[shard_id][0] + 1 if shard_id in acks else entry.committed + 1
                if position != expected or position > entry.yielded:
                    raise ConfigError(
                        f"cursor ({shard_id}, {position}) is out of order: the next sample of shard {shard_id} "
                        f"to commit is at position {expected} (yielded up to {entry.yielded}). Committing it "
                        "would acknowledge samples that were not trained; keep the pipeline order-preserving "
                        "(no shuffle after the source, no map(deterministic=False)) and commit every batch once"
                    )
                acks[shard_id] = (position, entry.shard.size)
            return acks

    def apply(self, acks: dict[int, tuple[int, int]]) -> None:
        with self._lock:
            for shard_id, (position, size) in acks.items():
                entry = self._open.get(shard_id)
                if entry is None:
                    continue
                entry.committed = max(entry.committed, position)
                if entry.committed >= size:
                    del self._open[shard_id]

    def clear(self) -> None:
        with self._lock:
            self._open.clear()


def _cursor_rows(cursors: Any) -> list[tuple[int, int]]:
    """(shard id, position) rows from a batch of cursors: a tensor, an array or nested lists."""
    if hasattr(cursors, "numpy"):
        cursors = cursors.numpy()
    if hasattr(cursors, "tolist"):
        cursors = cursors.tolist()
    rows = list(cursors)
    if len(rows) == 2 and all(isinstance(x, int) for x in rows):
        rows = [rows]  # a single, unbatched cursor
    out = []
    for row in rows:
        if len(row) != 2:
            raise ConfigError(f"a cursor is (shard_id, position), got {row!r}")
        out.append((int(row[0]), int(row[1])))
    return out


class ShardTFDataset:
    """A `tf.data` source of sample indices whose samples are acknowledged when the training loop commits.

    Args:
        client: the shard client (its dataset must be an index source); owned by the caller, and
            used both by the pipeline's thread and by `commit`.
        wait_s: while samples are uncommitted, how long to wait for a next shard before ending
            the pass (see the module's notes on passes).

    Raises:
        ConfigError: `wait_s` is not positive.
    """

    def __init__(self, client: ShardClient, wait_s: float = 1.0) -> None:
        if not wait_s > 0:
            raise ConfigError(f"wait_s must be positive, got {wait_s!r}")
        self._client = client
        self._wait_s = wait_s
        self._tracker = _Tracker()
        self._finished = False
        self._pass = 0
        self._pass_lock = threading.Lock()

    @property
    def finished(self) -> bool:
        """The service said the dataset is finished: no pass will yield anything again."""
        return self._finished

    def pending(self) -> int:
        """Samples yielded to the pipeline and not committed yet."""
        return self._tracker.pending()

    def samples(self) -> Iterator[tuple[int, tuple[int, int]]]:
        """One pass as a Python iterator of `(index, (shard_id, position))`; `dataset()` wraps it.

        Starting a pass ends any earlier pass that is still open, so two live iterators never
        hand out the same samples.
        """
        with self._pass_lock:
            self._pass += 1
            mine = self._pass
        tracker = self._tracker
        for held in tracker.rewind():
            yield from self._shard_samples(held, mine)
        while self._pass == mine:
            try:
                shard = self._client.next_shard(timeout_s=self._wait_s)
            except TimeoutError:
                if tracker.pending():
                    return  # end the pass so the training loop can commit what it holds
                # Holding nothing uncommitted, waiting cannot deadlock: keep waiting for a shard
                # or the end, in bounded steps so a pass that was replaced notices and stops.
                continue
            if shard is None:
                self._finished = True
                return
            tracker.open(shard)
            yield from self._shard_samples(shard, mine)

    def _shard_samples(self, shard: Shard, mine: int) -> Iterator[tuple[int, tuple[int, int]]]:
        """The shard's samples after its committed position, while pass `mine` is the current one."""
        order = shard.sample_order()
        for position in range(self._tracker.committed(shard) + 1, shard.size + 1):
            if self._pass != mine:
                return
            self._tracker.yielded(shard.shard_id, position)
            yield order[position - 1], (shard.shard_id, position)

    def dataset(self) -> Any:
        """A `tf.data.Dataset` of `(index, cursor)`: an int64 scalar and an int64 vector of 2.

        Each iteration is one pass (`samples()`). Map the index to a sample and keep the cursor
        next to it through `batch`, then hand the batch's cursors to `commit`.

        Raises:
            ImportError: TensorFlow is not installed (`pip install 'dlrover-shard[tf]'`).
        """
        tf = _import_tf()
        return tf.data.Dataset.from_generator(
            self.samples,
            output_signature=(tf.TensorSpec(shape=(), dtype=tf.int64), tf.TensorSpec(shape=(2,), dtype=tf.int64)),
        )

    def commit(self, cursors: Any) -> None:
        """Acknowledge trained samples, given their cursors (a batch's `[n, 2]` tensor, or one cursor).

        A shard whose last sample is committed is reported done; others report their new
        position, which also renews their leases.

        Raises:
            ConfigError: a malformed cursor, a cursor of a shard this feed does not hold, or one
                out of order (nothing is acknowledged then).
            RpcError: the service could not be reached within the client's retry bounds.
        """
        acks = self._tracker.check(_cursor_rows(cursors))
        for shard_id, (position, size) in acks.items():
            if position >= size:
                self._client.report_done(shard_id)
            else:
                self._client.report_progress(shard_id, position)
            # Recorded shard by shard: when a later report fails, the ones the service already
            # acknowledged are not reported again by a retried commit.
            self._tracker.apply({shard_id: (position, size)})

    def state_dict(self) -> dict[str, Any]:
        """The data position to store in the model checkpoint (the committed samples)."""
        return make_state(STATE_FORMAT, STATE_VERSION, self._client.dataset, self._client.checkpoint())

    def load_state_dict(self, state: dict[str, Any], restore: bool = True) -> None:
        """Resume from `state_dict()` output; ends any open pass.

        Args:
            state: what `state_dict()` returned.
            restore: restore the service's dataset from it; with several trainers sharing a
                dataset, let exactly one of them restore (e.g. the chief) before the others fetch.

        Raises:
            ConfigError: the state is of another format, version or dataset.
        """
        document = check_state(STATE_FORMAT, STATE_VERSION, state, self._client.dataset)
        with self._pass_lock:
            self._pass += 1
        self._tracker.clear()
        self._finished = False
        if restore:
            self._client.restore(document)
        else:
            self._client.discard_buffered()  # the trainer that restores drops every lease


def shard_indices(client_factory: Callable[[], ShardClient]) -> Iterator[int]:
    """Every index of every shard a fresh client leases, reporting each shard done after its last index.

    This is the generator behind `make_tf_dataset`, usable without TensorFlow.
    """
    client = client_factory()
    try:
        while (shard := client.next_shard()) is not None:
            yield from shard.remaining_samples()
            client.report_done(shard.shard_id)
    finally:
        client.close()


def make_tf_dataset(client_factory: Callable[[], ShardClient]) -> Any:
    """A `tf.data.Dataset` of int64 sample indices that acknowledges each shard when handed out.

    Args:
        client_factory: makes a `ShardClient`; called once per iteration of the dataset, so
            each pass (and each `tf.distribute` replica) has its own connection.

    Returns:
        A `tf.data.Dataset` with element spec `tf.TensorSpec((), tf.int64)`. See the module's
        notes: for exactly-once with respect to the model, use `ShardTFDataset`.

    Raises:
        ImportError: TensorFlow is not installed (`pip install 'dlrover-shard[tf]'`).
    """
    tf = _import_tf()
    return tf.data.Dataset.from_generator(
        lambda: shard_indices(client_factory),
        output_signature=tf.TensorSpec(shape=(), dtype=tf.int64),
    )
