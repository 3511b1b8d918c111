"""The TensorFlow adapter: commits, passes and resume; real tf.data pipelines over a real ShardService.

Tests marked `tensorflow` need TensorFlow (conftest skips them where it is missing, and fails them
when DLROVER_REQUIRE_TENSORFLOW=1, as in the TensorFlow CI session). The others exercise the same
feed without TensorFlow, through `ShardTFDataset.samples()`, the generator `dataset()` wraps.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, deque
from typing import Any

import grpc
import pytest

from dlrover.common import ConfigError, RetryPolicy, RpcError
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, Shard
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.tf_data import ShardTFDataset, make_tf_dataset

N = 200
CFG = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=1)


def _spec() -> DatasetSpec:
    return DatasetSpec(
        name="ds",
        source=IndexSource(N),
        batch_size=8,
        batches_per_shard=2,
        shuffle=True,
        shuffle_samples=True,
        seed=5,
        delivery=DeliveryMode.EXACTLY_ONCE,
        lease_timeout_s=120.0,
    )


def _client(server: Any, token: str, worker: str) -> ShardClient:
    return ShardClient(server.address, token, "ds", worker, config=CFG)


def _exactly_once(trained: list[int]) -> None:
    counts = Counter(trained)
    assert sorted(counts) == list(range(N)), f"missing: {sorted(set(range(N)) - set(counts))[:10]}"
    assert [i for i, c in counts.items() if c > 1] == [], "some indices were trained twice"


# ---------------------------------------------------------------------- without TensorFlow: a fake client


class _FakeClient:
    """The few `ShardClient` calls the feed makes, in memory."""

    dataset = "ds"

    def __init__(self, shards: list[Shard], *, more_later: bool = False) -> None:
        self._shards = deque(shards)
        self._more_later = more_later
        self.reports: list[tuple[str, int, int]] = []
        self.discards = 0

    def discard_buffered(self) -> int:
        self.discards += 1
        return 0

    def next_shard(self, timeout_s: float | None = None) -> Shard | None:
        if self._shards:
            return self._shards.popleft()
        if self._more_later:
            raise TimeoutError("nothing yet")
        return None

    def report_progress(self, shard_id: int, consumed: int) -> None:
        self.reports.append(("progress", shard_id, consumed))

    def report_done(self, shard_id: int) -> None:
        self.reports.append(("done", shard_id, -1))


STATE = {"format": "dlrover.shard.tf", "version": 1, "dataset": "ds"}


def _shards() -> list[Shard]:
    return [Shard("ds", 0, 0, 0, 4), Shard("ds", 1, 0, 4, 8, order_seed=3)]


def test_commits_acknowledge_positions_and_report_a_finished_shard_done() -> None:
    client = _FakeClient(_shards())
    feed = ShardTFDataset(client)  # type: ignore[arg-type]
    got = list(feed.samples())
    assert [i for i, _ in got[:4]] == [0, 1, 2, 3]
    assert sorted(i for i, _ in got[4:]) == [4, 5, 6, 7]
    assert [i for i, _ in got[4:]] == _shards()[1].sample_order()
    assert feed.finished
    assert feed.pending() == 8
    feed.commit([c for _, c in got[:3]])
    feed.commit([c for _, c in got[3:6]])
    assert client.reports == [("progress", 0, 3), ("done", 0, -1), ("progress", 1, 2)]
    assert feed.pending() == 2
    feed.commit(got[6][1])  # one unbatched cursor
    feed.commit([got[7][1]])
    assert client.reports[-2:] == [("progress", 1, 3), ("done", 1, -1)]
    assert feed.pending() == 0


def test_a_commit_cut_short_by_a_failed_report_keeps_what_the_service_acknowledged() -> None:
    class FlakyClient(_FakeClient):
        fail_on = 1  # the report of shard 1 fails once

        def report_progress(self, shard_id: int, consumed: int) -> None:
            if shard_id == self.fail_on:
                self.fail_on = -1
                raise RpcError("ReportProgress", grpc.StatusCode.UNAVAILABLE, "the service is restarting", 3)
            super().report_progress(shard_id, consumed)

    client = FlakyClient(_shards())
    feed = ShardTFDataset(client)  # type: ignore[arg-type]
    cursors = [c for _, c in feed.samples()]
    batch = cursors[:6]  # shard 0 whole, then two samples of shard 1
    with pytest.raises(RpcError):
        feed.commit(batch)
    assert client.reports == [("done", 0, -1)]
    # Retrying the rest commits shard 1 only; shard 0 is not reported done twice.
    with pytest.raises(ConfigError, match="does not hold"):
        feed.commit(batch)
    feed.commit(batch[4:])
    assert client.reports == [("done", 0, -1), ("progress", 1, 2)]
    assert feed.pending() == 2


def test_out_of_order_foreign_or_malformed_cursors_are_refused_and_acknowledge_nothing() -> None:
    client = _FakeClient(_shards())
    feed = ShardTFDataset(client)  # type: ignore[arg-type]
    got = list(feed.samples())
    cursors = [c for _, c in got]
    with pytest.raises(ConfigError, match=r"cursor \(0, 2\) is out of order: the next sample of shard 0 .* 1"):
        feed.commit([cursors[1], cursors[0]])
    with pytest.raises(ConfigError, match="out of order"):
        feed.commit([cursors[0], cursors[2]])  # a gap: position 2 was skipped
    with pytest.raises(ConfigError, match=r"cursor \(7, 1\) is of a shard this feed does not hold"):
        feed.commit([cursors[0], (7, 1)])
    with pytest.raises(ConfigError, match=r"a cursor is \(shard_id, position\)"):
        feed.commit([(0, 1, 2)])
    assert client.reports == []
    assert feed.pending() == 8
    feed.commit(cursors[:4])
    with pytest.raises(ConfigError, match="does not hold"):
        feed.commit(cursors[:1])  # committing a batch twice
    assert client.reports == [("done", 0, -1)]


def test_a_new_pass_yields_again_what_an_interrupted_pass_pulled_but_never_delivered() -> None:
    client = _FakeClient(_shards(), more_later=True)
    feed = ShardTFDataset(client, wait_s=0.01)  # type: ignore[arg-type]
    first = feed.samples()
    pulled = [next(first) for _ in range(6)]  # the pipeline ran ahead of the model
    feed.commit([c for _, c in pulled[:2]])  # only two were trained
    second = feed.samples()  # the interrupted pass is over
    again = list(second)  # ends when nothing is available while samples are uncommitted
    assert [c for _, c in again] == [(0, 3), (0, 4), (1, 1), (1, 2), (1, 3), (1, 4)]
    assert list(first) == [], "an earlier pass stops once a newer one started"
    feed.commit([c for _, c in again])
    trained = [i for i, _ in pulled[:2]] + [i for i, _ in again]
    assert sorted(trained) == list(range(8))
    assert feed.pending() == 0
    assert not feed.finished


def test_with_nothing_uncommitted_a_pass_keeps_waiting_and_stops_once_replaced() -> None:
    client = _FakeClient([])
    feed = ShardTFDataset(client, wait_s=0.01)  # type: ignore[arg-type]
    waits: list[float | None] = []

    def next_shard(timeout_s: float | None = None) -> Shard | None:
        waits.append(timeout_s)
        if len(waits) == 3:
            return Shard("ds", 0, 0, 0, 2)
        if len(waits) == 6:  # meanwhile the trainer resumed from a checkpoint: this pass is over
            feed.load_state_dict({**STATE, "progress": "{}"}, restore=False)
        raise TimeoutError("nothing yet")

    client.next_shard = next_shard  # type: ignore[method-assign]
    it = feed.samples()
    first = [next(it), next(it)]  # two bounded waits, then a shard
    assert len(waits) == 3
    feed.commit([c for _, c in first])
    assert list(it) == []  # waits on with nothing uncommitted, until the pass is replaced
    assert waits == [0.01] * 6
    assert not feed.finished
    assert client.discards == 1, "a feed that does not restore forgets the shards its client buffered"


def test_wait_s_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="wait_s must be positive, got 0"):
        ShardTFDataset(_FakeClient([]), wait_s=0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- a real service, no TensorFlow


@pytest.mark.integration
def test_feed_over_the_service_acknowledges_every_index_once_and_resumes_from_state(
    shard_server: Any, token: str
) -> None:
    server, _ = shard_server
    trained: list[int] = []
    with _client(server, token, "a") as client:
        client.register(_spec())
        feed = ShardTFDataset(client)
        it = feed.samples()
        for _ in range(5):  # 5 batches of 7: the interruption falls inside a shard
            batch = [next(it) for _ in range(7)]
            trained += [i for i, _ in batch]
            feed.commit([c for _, c in batch])
        state = feed.state_dict()
        with pytest.raises(ConfigError, match=r"not a dlrover\.shard\.tf data state"):
            feed.load_state_dict({**state, "format": "dlrover.shard.torch"})
        with pytest.raises(ConfigError, match="version 2"):
            feed.load_state_dict({**state, "version": 2})
        with pytest.raises(ConfigError, match="not 'ds'"):
            feed.load_state_dict({**state, "dataset": "other"})
    with _client(server, token, "b") as client:
        feed = ShardTFDataset(client)
        feed.load_state_dict(state)
        for _pass in range(50):
            batch: list[tuple[int, tuple[int, int]]] = []
            for sample in feed.samples():
                batch.append(sample)
                if len(batch) == 7:
                    trained += [i for i, _ in batch]
                    feed.commit([c for _, c in batch])
                    batch = []
            trained += [i for i, _ in batch]
            feed.commit([c for _, c in batch])
            if feed.finished:
                break
        assert feed.finished
        assert client.status().finished
    _exactly_once(trained)


# ---------------------------------------------------------------------- real tf.data pipelines


def _train(feed: ShardTFDataset, ds: Any, trained: list[int], *, batches: int | None = None) -> None:
    """The training loop: a pass at a time until the dataset is finished (or `batches` were trained)."""
    done = 0
    for _pass in range(100):
        for samples, cursors in ds:
            trained.extend(int(x) for x in samples.numpy())
            feed.commit(cursors)
            done += 1
            if batches is not None and done == batches:
                return
        if feed.finished:
            return
    raise AssertionError("the dataset did not finish within 100 passes")


def _pipeline(feed: ShardTFDataset, tf: Any) -> Any:
    return (
        feed.dataset()
        .map(lambda i, c: (i * 1, c), num_parallel_calls=2)  # order-preserving (deterministic) by default
        .batch(8)
        .prefetch(2)
    )


@pytest.mark.integration
@pytest.mark.tensorflow
@pytest.mark.timeout(120)
def test_tf_pipeline_trains_every_index_exactly_once_across_two_workers(shard_server: Any, token: str, tf: Any) -> None:
    server, _ = shard_server
    with _client(server, token, "setup") as c:
        c.register(_spec())
    trained: dict[str, list[int]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with _client(server, token, name) as client:
                feed = ShardTFDataset(client, wait_s=0.5)
                _train(feed, _pipeline(feed, tf), trained[name])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in trained]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not any(t.is_alive() for t in threads), "a worker did not finish"
    assert errors == []
    _exactly_once(trained["a"] + trained["b"])
    with _client(server, token, "check") as c:
        status = c.status()
    assert status.finished
    assert status.done == -(-N // 16)


@pytest.mark.integration
@pytest.mark.tensorflow
@pytest.mark.timeout(120)
def test_tf_training_interrupted_and_resumed_from_state_dict_trains_each_index_once(
    shard_server: Any, token: str, tf: Any
) -> None:
    server, _ = shard_server
    trained: list[int] = []
    with _client(server, token, "a") as client:
        client.register(_spec())
        feed = ShardTFDataset(client)
        ds = _pipeline(feed, tf)
        _train(feed, ds, trained, batches=5)  # 40 samples; prefetch pulled more that are never trained
        state = feed.state_dict()
        assert feed.pending() > 0
    # A new process would build everything again; a new client and feed stand in for it.
    with _client(server, token, "b") as client:
        feed = ShardTFDataset(client)
        feed.load_state_dict(state)
        _train(feed, _pipeline(feed, tf), trained)
        assert client.status().finished
    assert len(trained) == N
    _exactly_once(trained)


@pytest.mark.integration
@pytest.mark.tensorflow
@pytest.mark.timeout(120)
def test_tf_pass_broken_off_and_iterated_again_in_the_same_process_loses_nothing(
    shard_server: Any, token: str, tf: Any
) -> None:
    server, _ = shard_server
    trained: list[int] = []
    with _client(server, token, "a") as client:
        client.register(_spec())
        feed = ShardTFDataset(client)
        ds = _pipeline(feed, tf)
        _train(feed, ds, trained, batches=3)  # leaves the iterator (and its prefetched samples) behind
        _train(feed, ds, trained)
        assert client.status().finished
    _exactly_once(trained)


@pytest.mark.integration
@pytest.mark.tensorflow
@pytest.mark.timeout(120)
def test_tf_shuffle_after_the_source_is_refused_at_commit_and_acknowledges_nothing(
    shard_server: Any, token: str, tf: Any
) -> None:
    server, _ = shard_server
    with _client(server, token, "a") as client:
        client.register(_spec())
        feed = ShardTFDataset(client)
        ds = feed.dataset().shuffle(64, seed=3).batch(8)
        _samples, cursors = next(iter(ds))
        with pytest.raises(ConfigError, match="out of order"):
            feed.commit(cursors)
        state = json.loads(client.checkpoint())["state"]
        assert state["done_total"] == 0
        assert state["queue"], "the shuffle buffer pulled (leased) shards"
        assert [q["consumed"] for q in state["queue"]] == [0] * len(state["queue"]), "nothing acknowledged"


@pytest.mark.integration
@pytest.mark.tensorflow
@pytest.mark.timeout(120)
def test_make_tf_dataset_hands_out_every_index_once(shard_server: Any, token: str, tf: Any) -> None:
    server, _ = shard_server
    with _client(server, token, "setup") as c:
        c.register(_spec())
        ds = make_tf_dataset(lambda: _client(server, token, "tf")).map(lambda i: i + 0).batch(16)
        trained = [int(x) for batch in ds for x in batch.numpy()]
        _exactly_once(trained)
        assert c.status().finished
