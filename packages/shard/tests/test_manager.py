"""Unit tests of the pure shard manager: splitting, leases, delivery semantics, failures, status."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ManualClock
from dlrover.shard import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    InvalidShardRequestError,
    RecordFile,
    RecordFileSource,
    RecordUnit,
    ShardManager,
    ShardManagerConfig,
    ShardRegistry,
    ShardStateError,
    StreamPartitions,
    TaskType,
    UnknownDatasetError,
    UnknownShardError,
    record_segments,
)
from dlrover.shard._bookkeeping import EpochBook
from dlrover.shard.progress import encode_progress
from dlrover.shard.shard import bitmap_bytes, bitmap_text, decode_bitmap, encode_bitmap


def _spec(n: int = 10, **kw: object) -> DatasetSpec:
    args: dict[str, object] = {"name": "ds", "source": IndexSource(n), "batch_size": 2, "batches_per_shard": 2}
    args.update(kw)
    return DatasetSpec(**args)  # type: ignore[arg-type]


def _drain(m: ShardManager, worker: str = "w") -> list[tuple[int, int, int]]:
    """Fetch and finish everything; returns (epoch, start, end) in dispatch order."""
    seen = []
    while True:
        res = m.fetch(worker, 4)
        if not res.shards:
            assert res.finished, res.reason
            return seen
        for s in res.shards:
            seen.append((s.epoch, s.start, s.end))
            m.report_done(worker, s.shard_id)


def test_index_source_is_cut_into_shards_of_batch_size_times_batches() -> None:
    m = ShardManager(_spec(10), ManualClock())
    assert m.spec.shard_size == 4
    assert sorted(_drain(m)) == [(0, 0, 4), (0, 4, 8), (0, 8, 10)]
    assert m.finished
    st = m.status()
    assert (st.todo, st.doing, st.done, st.failed) == (0, 0, 3, 0)


def test_epochs_cover_the_data_once_each_and_unbounded_never_finishes() -> None:
    m = ShardManager(_spec(10, num_epochs=3), ManualClock())
    seen = _drain(m)
    assert len(seen) == 9
    for e in range(3):
        assert sorted(x[1:] for x in seen if x[0] == e) == [(0, 4), (4, 8), (8, 10)]
    unbounded = ShardManager(_spec(10, num_epochs=None), ManualClock())
    for _ in range(20):
        res = unbounded.fetch("w", 1)
        assert len(res.shards) == 1
        assert not res.finished
        unbounded.report_done("w", res.shards[0].shard_id)
    assert unbounded.status().epochs_remaining is None


def test_shuffle_is_seeded_and_reproducible() -> None:
    def order(seed: int) -> list[tuple[int, int, int]]:
        return _drain(ShardManager(_spec(200, num_epochs=2, shuffle=True, seed=seed), ManualClock()))

    assert order(7) == order(7)
    assert order(7) != order(8)
    first = order(7)
    assert [x for x in first if x[0] == 0] != [x for x in first if x[0] == 1]  # epochs differ
    m = ShardManager(_spec(20, shuffle_samples=True, seed=3), ManualClock())
    s = m.fetch("w").shards[0]
    assert sorted(s.sample_order()) == list(range(s.start, s.end))
    assert s.sample_order() == s.sample_order()
    assert s.sample_order() != list(range(s.start, s.end))


def test_lease_expires_without_progress_and_progress_renews_it() -> None:
    clock = ManualClock()
    m = ShardManager(_spec(8, lease_timeout_s=10.0), clock)
    a, b = m.fetch("w", 2).shards
    clock.advance(6)
    m.report_progress("w", a.shard_id, 1)
    clock.advance(6)  # b's lease (10 s) has passed, a's was renewed at t=6
    assert m.expire_leases() == [b.shard_id]
    assert [s.shard_id for s in m.leased_shards("w")] == [a.shard_id]
    with pytest.raises(ShardStateError, match="does not hold it"):
        m.report_done("w", b.shard_id)
    assert m.fetch("v").shards[0].shard_id == b.shard_id  # re-queued shards go first


def test_a_report_about_a_dispatch_whose_lease_ended_is_refused_when_the_shard_came_back_to_the_worker() -> None:
    clock = ManualClock()
    registry = ShardRegistry(clock)
    registry.register(_spec(8, lease_timeout_s=10.0))
    registry.start_change_log()
    base = registry.journal_base()
    (first,) = registry.fetch(_spec(8).name, "w", 1).shards
    clock.advance(11)
    registry.manager(_spec(8).name).expire_leases()
    (again,) = registry.fetch(_spec(8).name, "w", 1).shards
    assert (again.shard_id, first.attempt, again.attempt) == (first.shard_id, 1, 2)
    with pytest.raises(ShardStateError, match="holds its dispatch 2, not dispatch 1"):
        registry.report_progress(_spec(8).name, "w", first.shard_id, 1, attempt=first.attempt)
    assert registry.report_progress(_spec(8).name, "w", again.shard_id, 1, attempt=again.attempt).changed
    # A later dispatch than the service knows (its state went back in time) is the worker's lease.
    assert registry.report_progress(_spec(8).name, "w", again.shard_id, 1, attempt=again.attempt + 1).reason
    assert registry.report_progress(_spec(8).name, "w", again.shard_id, 1).reason  # no attempt: whichever it holds
    with pytest.raises(InvalidShardRequestError, match="attempt"):
        registry.report_progress(_spec(8).name, "w", again.shard_id, 1, attempt="2")  # type: ignore[arg-type]
    # The journal replays the checked report as it was made.
    replayed = ShardRegistry(clock)
    replayed.load_journal(base, registry.take_changes(), restart_leases=False)
    assert replayed.checkpoint(_spec(8).name) == registry.checkpoint(_spec(8).name)


def test_leases_expire_in_deadline_order_even_when_renewed_ones_are_overdue_too() -> None:
    # Found by the state machine: a renewed lease's old heap entry comes out first, and its
    # shard must not be re-queued ahead of a lease that was due earlier.
    clock = ManualClock()
    m = ShardManager(_spec(8, lease_timeout_s=5.0), clock)
    a, b = m.fetch("w", 2).shards
    clock.advance(1)
    m.report_progress("w", a.shard_id, 1)  # a due at 6, b at 5
    clock.advance(10)
    assert m.expire_leases() == [b.shard_id, a.shard_id]
    assert [s.shard_id for s in m.fetch("v", 2).shards] == [b.shard_id, a.shard_id]


def test_task_types_have_their_own_lease_timeouts() -> None:
    cfg = ShardManagerConfig(training_lease_timeout_s=5, evaluation_lease_timeout_s=7, prediction_lease_timeout_s=9)
    for task, timeout in [(TaskType.TRAINING, 5), (TaskType.EVALUATION, 7), (TaskType.PREDICTION, 9)]:
        clock = ManualClock()
        m = ShardManager(_spec(task_type=task), clock, cfg)
        m.fetch("w")
        clock.advance(timeout - 0.5)
        assert m.expire_leases() == []
        clock.advance(0.5)
        assert len(m.expire_leases()) == 1


def test_at_least_once_redispatches_the_whole_shard() -> None:
    m = ShardManager(_spec(8), ManualClock())
    s = m.fetch("w").shards[0]
    m.report_progress("w", s.shard_id, 3)
    m.report_failure("w", s.shard_id, "oom")
    again = m.fetch("v").shards[0]
    assert (again.shard_id, again.consumed, again.attempt) == (s.shard_id, 0, 2)


def test_exactly_once_redispatches_only_the_unacknowledged_remainder() -> None:
    m = ShardManager(_spec(8, delivery=DeliveryMode.EXACTLY_ONCE, shuffle_samples=True), ManualClock())
    s = m.fetch("w").shards[0]
    m.report_progress("w", s.shard_id, 3)
    m.report_progress("w", s.shard_id, 2)  # stale: positions only move forward
    m.remove_worker("w", "killed")
    again = m.fetch("v").shards[0]
    assert again.consumed == 3
    assert again.remaining_samples() == s.sample_order()[3:]


def test_exactly_once_a_shard_whose_every_sample_was_acknowledged_is_done_when_its_lease_ends() -> None:
    # The worker reported progress up to the shard's size and died before its done report: dispatched
    # again, the shard would yield nothing and wait out a lease per attempt into the failed set.
    clock = ManualClock()
    m = ShardManager(_spec(8, delivery=DeliveryMode.EXACTLY_ONCE), clock)
    first, second = m.fetch("w", 2).shards
    m.report_progress("w", first.shard_id, first.size)
    m.remove_worker("w", "killed")
    status = m.status()
    assert (status.done, status.failed) == (1, 0)
    again = m.fetch("v", 4).shards
    assert [x.shard_id for x in again] == [second.shard_id], "only the shard with samples left comes back"
    # The same through an expired lease and through a failure report that acknowledged everything.
    m.report_progress("v", second.shard_id, second.size)
    clock.advance(3600.0)
    assert m.expire_leases() == [second.shard_id]
    assert m.status().finished
    at_least = ShardManager(_spec(4, delivery=DeliveryMode.AT_LEAST_ONCE), ManualClock())
    shard = at_least.fetch("w").shards[0]
    at_least.report_failure("w", shard.shard_id, "crash", consumed=shard.size)
    assert at_least.fetch("v").shards[0].shard_id == shard.shard_id, "at-least-once trains it again"


def test_at_most_once_never_redispatches_and_keeps_the_loss_visible() -> None:
    m = ShardManager(_spec(8, delivery=DeliveryMode.AT_MOST_ONCE), ManualClock())
    s = m.fetch("w").shards[0]
    m.report_failure("w", s.shard_id, "crash", consumed=1)
    st = m.status()
    assert st.failed == 1
    assert "crash" in st.failed_shards[0].reasons[0]
    assert st.failed_shards[0].shard.consumed == 1
    assert all(x.shard_id != s.shard_id for x in m.fetch("w", 4).shards)


def test_a_shard_failing_max_attempts_times_goes_to_the_failed_set_with_reasons() -> None:
    clock = ManualClock()
    m = ShardManager(_spec(4, max_attempts=3, lease_timeout_s=1.0), clock)
    sid = m.fetch("a").shards[0].shard_id
    m.report_failure("a", sid, "bad record")
    m.fetch("b")
    clock.advance(2)
    m.expire_leases()
    m.fetch("c")
    m.remove_worker("c", "node lost")
    st = m.status()
    assert st.failed == 1
    assert st.finished
    reasons = st.failed_shards[0].reasons
    assert len(reasons) == 4
    assert "bad record" in reasons[0]
    assert "expired" in reasons[1]
    assert "node lost" in reasons[2]
    assert "3 failed attempt" in reasons[3]


def test_removals_the_data_cannot_have_caused_never_send_a_shard_to_the_failed_set() -> None:
    # A crash loop of the platform (nodes lost or preempted again and again while holding the same
    # shard, which is handed out first each time) must not give good data up as failed.
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(8, max_attempts=2, delivery=DeliveryMode.EXACTLY_ONCE))
    m = reg.manager("ds")
    sid = m.fetch("a").shards[0].shard_id
    m.report_progress("a", sid, 1)
    holder = "a"
    for worker in ("b", "c", "d", "e"):
        assert reg.remove_worker(holder, "node lost", charge=False) == {"ds": [sid]}
        again = m.fetch(worker).shards[0]
        assert (again.shard_id, again.consumed) == (sid, 1), "back from its acknowledged position"
        holder = worker
    assert m.status().failed == 0
    # Removals that may be the data's count as before: two of them and the shard is given up.
    reg.remove_worker(holder, "worker crashed")
    m.fetch("f")
    reg.remove_worker("f", "worker crashed again")
    failed = m.status().failed_shards
    assert [f.shard.shard_id for f in failed] == [sid]
    assert not any("node lost" in r for r in failed[0].reasons), "an uncharged removal is no attempt in its history"
    # A bad flag is refused before anything changes.
    assert m.fetch("g").shards
    before = reg.checkpoint("ds", include_leases=True)
    with pytest.raises(InvalidShardRequestError, match="charge must be a bool"):
        reg.remove_worker("g", "x", charge="no")  # type: ignore[arg-type]
    assert reg.checkpoint("ds", include_leases=True) == before


def test_bad_requests_raise_clear_errors_and_change_nothing() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(10))
    m = reg.manager("ds")
    s = m.fetch("w").shards[0]

    def state() -> str:  # afresh with the leases: a reused read would hide a change left uncounted
        return reg.checkpoint("ds", include_leases=True)

    before = state()
    with pytest.raises(UnknownDatasetError, match="'nope'"):
        reg.manager("nope")
    with pytest.raises(UnknownShardError, match="no shard 999"):
        m.report_done("w", 999)
    with pytest.raises(ShardStateError, match="another worker"):
        m.report_progress("x", s.shard_id, 1)
    with pytest.raises(InvalidShardRequestError, match=r"consumed must be in 0\.\.4"):
        m.report_progress("w", s.shard_id, 5)
    with pytest.raises(InvalidShardRequestError, match=r"consumed must be in 0\.\.4"):
        m.report_progress("w", s.shard_id, -1)
    with pytest.raises(InvalidShardRequestError, match=r"count must be in 1\.\.1024, got 0"):
        m.fetch("w", 0)
    with pytest.raises(InvalidShardRequestError, match="worker id"):
        m.fetch("", 1)
    with pytest.raises(InvalidShardRequestError, match="reason"):
        m.report_failure("w", s.shard_id, " ")
    with pytest.raises(ShardStateError, match="not dispatched"):
        m.report_done("w", s.shard_id + 1)
    assert state() == before
    m.report_done("w", s.shard_id)
    after = state()
    with pytest.raises(ShardStateError, match="already done"):
        m.report_done("w", s.shard_id)
    assert state() == after


def test_spec_rejects_bad_sizes_naming_the_value() -> None:
    with pytest.raises(InvalidShardRequestError, match="batch_size must be a positive integer, got 0"):
        _spec(batch_size=0)
    with pytest.raises(InvalidShardRequestError, match="num_samples must be a positive integer, got -5"):
        IndexSource(-5)
    with pytest.raises(InvalidShardRequestError, match="num_epochs"):
        _spec(num_epochs=0)
    with pytest.raises(InvalidShardRequestError, match="unbounded"):
        DatasetSpec(name="s", source=StreamPartitions(["p"]), batch_size=1)
    with pytest.raises(InvalidShardRequestError, match="unique"):
        StreamPartitions(["p", "p"])
    with pytest.raises(InvalidShardRequestError, match="lease_timeout_s must be positive"):
        _spec(lease_timeout_s=0.0)


def test_retried_requests_with_the_same_id_do_not_act_twice() -> None:
    m = ShardManager(_spec(40), ManualClock())
    first = m.fetch("w", 2, request_id="r1")
    again = m.fetch("w", 2, request_id="r1")
    assert [s.shard_id for s in again.shards] == [s.shard_id for s in first.shards]
    assert m.status().doing == 2
    sid = first.shards[0].shard_id
    assert m.report_done("w", sid, request_id="d1") == m.report_done("w", sid, request_id="d1")
    with pytest.raises(ShardStateError, match="already done"):
        m.report_done("w", sid, request_id="d2")
    assert m.report_failure("w", first.shards[1].shard_id, "x", request_id="f1").changed
    assert m.report_failure("w", first.shards[1].shard_id, "x", request_id="f1").changed
    assert m.status().todo == 9  # 10 shards, one done; the failed one queued once, not twice


def test_registering_is_idempotent_but_a_different_spec_is_refused() -> None:
    reg = ShardRegistry(ManualClock())
    assert reg.register(_spec()).created
    assert not reg.register(_spec()).created
    with pytest.raises(ShardStateError, match="batch_size: 2 != 3"):
        reg.register(_spec(batch_size=3))


def test_status_reports_per_worker_throughput_from_the_injected_clock() -> None:
    clock = ManualClock()
    m = ShardManager(_spec(100, batch_size=5, batches_per_shard=2), clock)
    fast = m.fetch("fast").shards[0]
    slow = m.fetch("slow").shards[0]
    clock.advance(2)
    m.report_done("fast", fast.shard_id)
    m.report_progress("slow", slow.shard_id, 2)
    by = {w.worker: w for w in m.status().workers}
    assert by["fast"].samples == 10
    assert by["fast"].shards_done == 1
    assert by["fast"].samples_per_s == 5.0
    assert by["slow"].samples == 2
    assert by["slow"].leased == 1
    assert by["slow"].samples_per_s == 1.0


def test_record_files_split_by_line_within_files_unless_asked() -> None:
    files = [RecordFile("a", 5), RecordFile("b", 3)]
    within = ShardManager(_spec(source=RecordFileSource(files)), ManualClock())
    assert sorted(x[1:] for x in _drain(within)) == [(0, 4), (4, 5), (5, 8)]
    across = ShardManager(_spec(source=RecordFileSource(files, cross_file_boundaries=True)), ManualClock())
    assert sorted(x[1:] for x in _drain(across)) == [(0, 4), (4, 8)]
    src = RecordFileSource(files, cross_file_boundaries=True)
    assert record_segments(src, 4, 8) == [("a", 4, 5), ("b", 0, 3)]
    with pytest.raises(InvalidShardRequestError, match="outside"):
        record_segments(src, 4, 9)


def test_record_files_split_by_byte_offsets() -> None:
    src = RecordFileSource([RecordFile("a", 100), RecordFile("b", 30)], unit=RecordUnit.BYTE, record_bytes=10)
    m = ShardManager(_spec(source=src), ManualClock())  # 4 records of ~10 bytes = 40 bytes a shard
    assert sorted(x[1:] for x in _drain(m)) == [(0, 40), (40, 80), (80, 100), (100, 130)]
    with pytest.raises(InvalidShardRequestError, match="shuffle_samples"):
        _spec(source=src, shuffle_samples=True)


def test_streams_cut_shards_as_records_arrive_round_robin() -> None:
    spec = DatasetSpec(name="s", source=StreamPartitions(["p0", "p1"]), batch_size=2, num_epochs=None)
    m = ShardManager(spec, ManualClock())
    res = m.fetch("w", 4)
    assert res.shards == ()
    assert not res.finished
    assert "stream" in res.reason
    m.advance_stream("p0", 5)
    m.advance_stream("p1", 1)
    assert not m.advance_stream("p1", 1).changed
    got = [(s.partition, s.start, s.end) for s in m.fetch("w", 10).shards]
    assert got == [("p0", 0, 2), ("p1", 0, 1), ("p0", 2, 4), ("p0", 4, 5)]
    with pytest.raises(InvalidShardRequestError, match="no partition 'p9'"):
        m.advance_stream("p9", 1)
    with pytest.raises(InvalidShardRequestError, match="not a stream"):
        ShardManager(_spec(), ManualClock()).advance_stream("p", 1)


def test_stream_done_ids_are_compacted_so_memory_stays_bounded() -> None:
    spec = DatasetSpec(name="s", source=StreamPartitions(["p"]), batch_size=1, num_epochs=None)
    m = ShardManager(spec, ManualClock())
    m.advance_stream("p", 10_000)
    for _ in range(10_000):
        s = m.fetch("w").shards[0]
        m.report_done("w", s.shard_id)
    state = m.export_state()
    assert len(state["stream"]["done"]) <= 4097
    with pytest.raises(ShardStateError, match="already done"):
        m.report_done("w", 3)


def test_checkpoint_is_versioned_json_and_restores_the_same_remaining_work() -> None:
    clock = ManualClock()
    reg = ShardRegistry(clock)
    reg.register(_spec(30, num_epochs=2, shuffle=True, delivery=DeliveryMode.EXACTLY_ONCE))
    m = reg.manager("ds")
    shards = m.fetch("w", 5).shards
    m.report_done("w", shards[0].shard_id)
    m.report_progress("w", shards[1].shard_id, 2)
    m.report_failure("w", shards[2].shard_id, "x", consumed=1)
    doc = reg.checkpoint("ds")
    parsed = json.loads(doc)
    assert (parsed["format"], parsed["version"], parsed["dataset"]) == ("dlrover.shard.progress", 1, "ds")
    other = ShardRegistry(ManualClock())
    res = other.restore(doc)
    assert res.returned_to_queue == 3
    assert other.checkpoint("ds") == doc.replace(
        f'"in_flight":{parsed["state"]["in_flight"]}'.replace(" ", ""), '"in_flight":[]'
    )
    # Everything the original will still hand out (leases returned), the restored one hands out too.
    m.remove_worker("w")
    a = [(s.shard_id, s.consumed) for s in _fetch_all(reg.manager("ds"))]
    b = [(s.shard_id, s.consumed) for s in _fetch_all(other.manager("ds"))]
    assert sorted(a) == sorted(b)
    assert (shards[1].shard_id, 2) in a
    assert (shards[2].shard_id, 1) in a


def _fetch_all(m: ShardManager) -> list:  # type: ignore[type-arg]
    out = []
    while True:
        res = m.fetch("z", 10)
        if not res.shards:
            return out
        for s in res.shards:
            out.append(s)
            m.report_done("z", s.shard_id)


def test_restore_rejects_other_versions_datasets_and_specs_without_changing_state() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec())
    reg.manager("ds").fetch("w")
    doc = json.loads(reg.checkpoint("ds"))
    before = reg.checkpoint("ds")
    with pytest.raises(InvalidShardRequestError, match="version 3 is not supported"):
        reg.restore(json.dumps({**doc, "version": 3}))
    with pytest.raises(InvalidShardRequestError, match=r"version 2 document needs state\.leases"):
        reg.restore(json.dumps({**doc, "version": 2}))
    with pytest.raises(InvalidShardRequestError, match="of dataset 'ds', not 'other'"):
        reg.restore(json.dumps(doc), dataset="other")
    with pytest.raises(InvalidShardRequestError, match="not valid JSON"):
        reg.restore("{")
    changed = {**doc, "spec": {**doc["spec"], "batch_size": 3}}
    with pytest.raises(ShardStateError, match="different spec"):
        reg.restore(json.dumps(changed))
    bad_state = {**doc, "state": {**doc["state"], "cursor": 99}}
    with pytest.raises(InvalidShardRequestError, match="cursor"):
        reg.restore(json.dumps(bad_state))
    assert reg.checkpoint("ds") == before


def test_restore_with_the_same_request_id_runs_once() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec())
    doc = reg.checkpoint("ds")
    reg.restore(doc, request_id="r")
    s = reg.manager("ds").fetch("w").shards[0]
    reg.restore(doc, request_id="r")  # a retry: must not drop the lease taken since
    assert reg.manager("ds").leased_shards("w")[0].shard_id == s.shard_id
    reg.restore(doc, request_id="r2")
    assert reg.manager("ds").leased_shards("w") == []


@given(ids=st.sets(st.integers(0, 98)), epoch=st.integers(0, 3))
def test_done_bitmaps_round_trip(ids: set[int], epoch: int) -> None:
    base = epoch * 99
    done = {base + i for i in ids}
    assert decode_bitmap(encode_bitmap(done, base, 99), base, 99) == done


@given(ids=st.lists(st.integers(0, 98)), epoch=st.integers(0, 3))
def test_an_epoch_book_keeps_the_bitmap_a_position_writes(ids: list[int], epoch: int) -> None:
    base = epoch * 99
    book = EpochBook(99, base)
    for i in ids:
        book.add_done(base + i)  # a shard done twice counts once
    done = {base + i for i in ids}
    assert book.done_count == len(done)
    assert book.done_ids() == sorted(done)
    assert all(book.is_done(base + i) == (base + i in done) for i in range(99))
    assert not book.is_done(base - 1)
    assert not book.is_done(base + 99)
    assert bitmap_text(book.bitmap()) == encode_bitmap(done, base, 99)
    # A restored book starts from the bitmap a position wrote.
    restored = EpochBook(99, base, bitmap_bytes(encode_bitmap(done, base, 99), 99))
    assert restored.done_count == len(done)
    assert restored.done_ids() == sorted(done)


def test_an_epoch_book_refuses_a_bitmap_of_another_size() -> None:
    with pytest.raises(ValueError, match="a done bitmap of 3 bytes for 10 shards"):
        EpochBook(10, 0, b"\x00\x00\x00")


def test_an_epoch_book_refuses_a_shard_of_another_epoch_and_changes_nothing() -> None:
    book = EpochBook(10, 10)
    book.add_done(12)
    for sid in (9, 20):
        with pytest.raises(ValueError, match=f"shard {sid} is not one of the epoch's shards 10..19"):
            book.add_done(sid)
    assert book.done_ids() == [12]
    assert book.done_count == 1


def test_a_corrupt_done_bitmap_is_refused_by_name() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(40))
    m = reg.manager("ds")
    m.report_done("w", m.fetch("w").shards[0].shard_id)
    doc = json.loads(reg.checkpoint("ds"))
    assert decode_bitmap(doc["state"]["epochs"]["0"]["done_bitmap"], 0, 10) == {0}
    doc["state"]["epochs"]["0"]["done_bitmap"] = "!!"
    with pytest.raises(InvalidShardRequestError, match=r"epochs\[0\]\.done_bitmap"):
        ShardRegistry(ManualClock()).restore(json.dumps(doc))
    doc["state"]["epochs"]["0"]["done_bitmap"] = encode_bitmap({0}, 0, 80)
    with pytest.raises(InvalidShardRequestError, match="expected 2 for 10 shards"):
        ShardRegistry(ManualClock()).restore(json.dumps(doc))
    doc["state"]["epochs"]["0"]["done_bitmap"] = encode_bitmap({0, 12}, 0, 10)  # bit 12 of 16
    with pytest.raises(InvalidShardRequestError, match="sets bits beyond its 10 shards"):
        ShardRegistry(ManualClock()).restore(json.dumps(doc))


def test_a_shard_both_done_and_queued_is_refused() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(40))
    m = reg.manager("ds")
    first, second = m.fetch("w", 2).shards
    m.report_done("w", first.shard_id)
    m.report_failure("w", second.shard_id, "back to the queue")
    doc = json.loads(reg.checkpoint("ds"))
    assert [e["shard_id"] for e in doc["state"]["queue"]] == [second.shard_id]
    doc["state"]["epochs"]["0"]["done_bitmap"] = encode_bitmap({first.shard_id, second.shard_id}, 0, 10)
    with pytest.raises(InvalidShardRequestError, match=f"shard {second.shard_id} appears in more than one state"):
        ShardRegistry(ManualClock()).restore(json.dumps(doc))


def test_lease_heap_stays_bounded_and_still_expires_exactly_the_due_leases() -> None:
    clock = ManualClock()
    m = ShardManager(_spec(10_000, batch_size=1, batches_per_shard=1, lease_timeout_s=100.0), clock)
    held = [s.shard_id for s in m.fetch("holder", 3).shards]
    clock.advance(50)
    m.report_progress("holder", held[0], 1)  # renewed: due at 150, the others at 100
    for _ in range(5000):  # many short leases end; their heap entries are compacted away
        s = m.fetch("busy").shards[0]
        m.report_done("busy", s.shard_id)
    assert len(m._deadlines) <= 2 * 3 + 1024
    clock.advance(60)  # t = 110
    assert sorted(m.expire_leases()) == sorted(held[1:])
    clock.advance(50)  # t = 160
    assert m.expire_leases() == [held[0]]


@pytest.mark.parametrize("delivery", list(DeliveryMode))
def test_a_restart_from_a_checkpoint_with_leases_keeps_them_and_answers_retried_reports(delivery: DeliveryMode) -> None:
    clock = ManualClock()
    reg = ShardRegistry(clock)
    reg.register(_spec(n=12, delivery=delivery, lease_timeout_s=10.0))
    m = reg.manager("ds")
    first = m.fetch("a", 2, request_id="a-1").shards
    m.report_progress("a", first[0].shard_id, 2, request_id="a-2")
    m.report_done("a", first[1].shard_id, request_id="a-3")
    held_b = m.fetch("b", 1, request_id="b-1").shards[0]
    clock.advance(9.0)  # nearly expired: the restart gives every lease a whole period again
    doc = reg.checkpoint("ds", include_leases=True)
    assert json.loads(doc)["version"] == 2
    assert json.loads(reg.checkpoint("ds"))["version"] == 1, "a user's data position never holds leases"

    restarted = ShardRegistry(clock)
    result = restarted.restore(doc)
    assert result.returned_to_queue == 0, result.reason
    r = restarted.manager("ds")
    assert [s.shard_id for s in r.leased_shards("a")] == [first[0].shard_id]
    assert r.leased_shards("a")[0].consumed == 2
    assert [s.shard_id for s in r.leased_shards("b")] == [held_b.shard_id]
    # The done the old master applied (and journaled) but whose answer was lost is answered again.
    assert r.report_done("a", first[1].shard_id, request_id="a-3").changed
    # A retried fetch gets what it leased and still holds, not new shards.
    again = r.fetch("b", 1, request_id="b-1")
    assert [s.shard_id for s in again.shards] == [held_b.shard_id]
    clock.advance(9.0)
    assert r.expire_leases() == []
    r.report_done("a", first[0].shard_id, request_id="a-4")
    clock.advance(1.5)
    assert r.expire_leases() == [held_b.shard_id]


def test_a_checkpoint_with_leases_is_refused_whole_when_a_lease_is_bad() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec())
    reg.manager("ds").fetch("w", 1)
    doc = json.loads(reg.checkpoint("ds", include_leases=True))
    doc["state"]["leases"][0]["worker"] = ""
    with pytest.raises(InvalidShardRequestError, match=r"state.leases\[0\]"):
        ShardRegistry(ManualClock()).restore(json.dumps(doc))
    doc = json.loads(reg.checkpoint("ds", include_leases=True))
    doc["state"]["queue"].append(doc["state"]["leases"][0]["shard"])
    with pytest.raises(InvalidShardRequestError, match="more than one state"):
        ShardRegistry(ManualClock()).restore(json.dumps(doc))


def test_a_checkpoint_holding_a_shard_that_was_never_handed_out_is_refused() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(n=12))  # not shuffled: shards 0..2 of epoch 0 in order
    reg.manager("ds").fetch("a", 1)
    good = json.loads(reg.checkpoint("ds", include_leases=True))
    assert good["state"]["cursor"] == 1
    # Leased to 'a' but still at the cursor: it would be handed to someone else as well.
    fresh = json.loads(json.dumps(good))
    fresh["state"]["leases"][0]["shard"].update({"shard_id": 1, "start": 4, "end": 8})
    with pytest.raises(InvalidShardRequestError, match="leased shard 1 was never handed out"):
        ShardRegistry(ManualClock()).restore(json.dumps(fresh))
    # A lease in an epoch the state records as finished.
    booked = json.loads(json.dumps(good))
    booked["state"]["epochs"] = {}
    with pytest.raises(InvalidShardRequestError, match="which the state records as finished"):
        ShardRegistry(ManualClock()).restore(json.dumps(booked))
    # The same holes in a version 1 document's queue.
    reg.manager("ds").report_failure("a", 0, "give it back")
    queued = json.loads(reg.checkpoint("ds"))
    queued["state"]["cursor"] = 0
    with pytest.raises(InvalidShardRequestError, match="queued shard 0 was never handed out"):
        ShardRegistry(ManualClock()).restore(json.dumps(queued))


@pytest.mark.parametrize("handed_out", [1, 9])  # the cursor below and past half the epoch's 12 shards
def test_a_shuffled_checkpoint_leasing_the_next_fresh_shard_is_refused(handed_out: int) -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(n=48, shuffle=True, seed=7))
    assert len(reg.manager("ds").fetch("a", handed_out).shards) == handed_out
    good = reg.checkpoint("ds", include_leases=True)
    ahead = ShardRegistry(ManualClock())
    ahead.restore(good)
    (fresh,) = ahead.manager("ds").fetch("b", 1).shards  # the shard at the cursor of the order
    doc = json.loads(good)
    doc["state"]["leases"][0]["shard"].update({"shard_id": fresh.shard_id, "start": fresh.start, "end": fresh.end})
    with pytest.raises(InvalidShardRequestError, match=f"leased shard {fresh.shard_id} was never handed out"):
        ShardRegistry(ManualClock()).restore(json.dumps(doc))
    ShardRegistry(ManualClock()).restore(good)  # the untouched position restores


def _samples_after_restore(doc: str) -> list[int]:
    """Every sample a fresh registry restored from `doc` hands out, in order."""
    reg = ShardRegistry(ManualClock())
    reg.restore(doc)
    out: list[int] = []
    while True:
        res = reg.fetch("ds", "w", 1)
        if not res.shards:
            return out
        out += res.shards[0].remaining_samples()
        reg.report_done("ds", "w", res.shards[0].shard_id)


def test_a_position_read_is_reused_while_only_leases_change_and_restores_the_same_work() -> None:
    clock = ManualClock()
    reg = ShardRegistry(clock)
    reg.register(_spec(40, shuffle=True, seed=3, delivery=DeliveryMode.EXACTLY_ONCE))
    first = reg.fetch("ds", "r0", 1).shards[0]
    reg.report_progress("ds", "r0", first.shard_id, 1)
    read = reg.checkpoint("ds")
    reg.fetch("ds", "r1", 1)  # the other ranks lease their next shards: the position is the same
    reg.fetch("ds", "r2", 1)
    assert reg.checkpoint("ds") is read
    fresh = encode_progress(reg.manager("ds"))  # what a read without reuse writes now
    assert fresh != read
    # The same samples remain (an order of re-dispatch may differ: the reused read has the shards
    # leased since as not dispatched, in the epoch's order; the fresh one re-queues them by id).
    remaining = _samples_after_restore(read)
    assert sorted(remaining) == sorted(_samples_after_restore(fresh))
    assert len(remaining) == len(set(remaining)) == 40 - 1
    reg.report_progress("ds", "r0", first.shard_id, 2)  # an acknowledgement changes it
    after = reg.checkpoint("ds")
    assert after != read
    assert after == encode_progress(reg.manager("ds"))
    assert reg.checkpoint("ds") is after


@pytest.mark.parametrize("change", ["done", "failure", "expiry", "removed worker", "restore"])
def test_a_position_read_is_not_reused_once_the_position_changed(change: str) -> None:
    clock = ManualClock()
    reg = ShardRegistry(clock)
    reg.register(_spec(40, delivery=DeliveryMode.EXACTLY_ONCE, lease_timeout_s=10.0))
    sid = reg.fetch("ds", "r0", 1).shards[0].shard_id
    read = reg.checkpoint("ds")
    if change == "done":
        reg.report_done("ds", "r0", sid)
    elif change == "failure":
        reg.report_failure("ds", "r0", sid, "injected")
    elif change == "expiry":
        clock.advance(11.0)
    elif change == "removed worker":
        reg.remove_worker("r0")
    else:
        reg.restore(read)
    assert reg.checkpoint("ds") == encode_progress(reg.manager("ds"))
    if change != "restore":  # a restore of the read itself leaves the same work (in another manager)
        assert reg.checkpoint("ds") != read


def test_at_most_once_a_lease_changes_the_position() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(_spec(40, delivery=DeliveryMode.AT_MOST_ONCE))
    read = reg.checkpoint("ds")
    sid = reg.fetch("ds", "r0", 1).shards[0].shard_id
    after = reg.checkpoint("ds")
    assert after != read
    # The leased shard may have been partly used: a restore must never hand it out again.
    assert sid in {f["shard_id"] for f in json.loads(after)["state"]["failed"]}


def test_a_stream_position_changes_when_the_stream_grows_and_when_a_shard_is_cut() -> None:
    reg = ShardRegistry(ManualClock())
    reg.register(DatasetSpec(name="s", source=StreamPartitions(["p0"]), batch_size=2, num_epochs=None))
    read = reg.checkpoint("s")
    assert not reg.advance_stream("s", "p0", 0).changed  # nothing new: the same position
    assert reg.checkpoint("s") is read
    reg.advance_stream("s", "p0", 4)
    grown = reg.checkpoint("s")
    assert grown != read
    assert json.loads(grown)["state"]["stream"]["watermark"] == {"p0": 4}
    reg.fetch("s", "w", 1)  # a lease cuts records [0, 2) off the partition's next offset
    cut = reg.checkpoint("s")
    assert cut == encode_progress(reg.manager("s"))
    assert json.loads(cut)["state"]["stream"]["next_offset"] == {"p0": 2}
