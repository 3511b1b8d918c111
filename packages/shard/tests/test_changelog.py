"""The registry's change log: a registry rebuilt from a base and the lines after it is the registry
that wrote them, whatever the calls, clock readings and bases in between.

The state machine drives one registry through every changing call (refused ones too), reads that
take back leases on their own (status, checkpoints), time passing past lease deadlines, and bases
taken now and then, as a host compacting its log does. After every step a second registry on the
same clock loads the newest base and the lines after it, keeping the deadlines, and must hold
exactly the first one's state: leases with their deadlines, queue, failures, remembered replies,
restore replies. A replay that decided one call differently (a lease that ran out, a retry
answered from a reply, a shard handed out in another order) leaves another state. What a restarted
host's load adds (each lease restarted for a whole period on its own clock) is tested below.
"""

from __future__ import annotations

import contextlib
import gc
import json
from typing import Any

import attrs
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dlrover.common import ManualClock
from dlrover.shard import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    InvalidShardRequestError,
    ShardError,
    ShardManagerConfig,
    ShardRegistry,
    ShardStateError,
    StreamPartitions,
)
from dlrover.shard.changelog import LoggedCall, encode_base

LEASE_S = 10.0
WORKERS = ("0", "0/1", "1/0", "2")
REQUEST_IDS = ("", "r1", "r2", "r3")
SPECS = {
    "exact": DatasetSpec(
        name="exact",
        source=IndexSource(23),
        batch_size=2,
        batches_per_shard=2,
        num_epochs=3,
        shuffle=True,
        shuffle_samples=True,
        seed=7,
        delivery=DeliveryMode.EXACTLY_ONCE,
        lease_timeout_s=LEASE_S,
        max_attempts=3,
    ),
    "most": DatasetSpec(
        name="most", source=IndexSource(9), batch_size=3, num_epochs=None, delivery=DeliveryMode.AT_MOST_ONCE
    ),
    "stream": DatasetSpec(
        name="stream",
        source=StreamPartitions(("p0", "p1")),
        batch_size=2,
        num_epochs=None,
        delivery=DeliveryMode.AT_LEAST_ONCE,
        lease_timeout_s=LEASE_S * 2,
    ),
}


class TickingClock(ManualClock):
    """Moves on every reading, as `time.monotonic` moves between two readings inside one call."""

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.ticking = True

    def now(self) -> float:
        t = super().now()
        if self.ticking:
            self.advance(0.37)
        return t


def _state(registry: ShardRegistry) -> dict[str, Any]:
    """Everything the registry would decide later calls by, on its clock now (the base's number aside)."""
    doc: dict[str, Any] = json.loads(registry.journal_base().text)
    del doc["seq"]
    return doc


class ChangeLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = TickingClock(1000.0)
        self.live = ShardRegistry(self.clock)
        self.base: LoggedCall | None = None
        self.lines: list[LoggedCall] = []
        self.documents: list[str] = []
        self.unencoded: tuple[int, dict[str, Any]] | None = None

    @initialize(before_log=st.sets(st.sampled_from(sorted(SPECS))), fetches=st.integers(0, 3))
    def start(self, before_log: set[str], fetches: int) -> None:
        # Made before the log starts: the first base holds them (leases and their deadlines too).
        for name in sorted(before_log):
            self.live.register(SPECS[name])
            self.live.advance_stream("stream", "p0", 8) if name == "stream" else None
            for i in range(fetches):
                self.live.fetch(name, WORKERS[i % len(WORKERS)])
        self.live.start_change_log()
        self.base = self.live.journal_base()
        for name in sorted(set(SPECS) - before_log):
            self._call(self.live.register, SPECS[name])

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(ShardError):  # refused: logs nothing, changes nothing a later call would not redo
            fn(*args, **kwargs)
        self.lines.extend(self.live.take_changes())
        self._encode_base()

    def _encode_base(self) -> None:
        """Encode the base taken last, after whatever call came since (a host encodes it with its
        lock let go): the document must not have changed with the registry."""
        if self.unencoded is not None:
            self.base = encode_base(*self.unencoded)
            self.unencoded = None
            # The host drops the lines the base holds; keeping some must not matter (they are skipped).
            self.lines = [line for line in self.lines if line.seq > self.base.seq - 2]

    def _held(self, dataset: str, worker: str, pick: int) -> int:
        if dataset not in self.live.datasets():
            return pick
        held = self.live.manager(dataset).leased_shards(worker)
        return held[pick % len(held)].shard_id if held else pick

    @rule(name=st.sampled_from(sorted(SPECS)))
    def register(self, name: str) -> None:
        self._call(self.live.register, SPECS[name])

    @rule(
        dataset=st.sampled_from(sorted(SPECS)),
        worker=st.sampled_from(WORKERS),
        count=st.integers(1, 3),
        rid=st.sampled_from(REQUEST_IDS),
    )
    def fetch(self, dataset: str, worker: str, count: int, rid: str) -> None:
        self._call(self.live.fetch, dataset, worker, count, rid)

    @rule(
        dataset=st.sampled_from(sorted(SPECS)),
        worker=st.sampled_from(WORKERS),
        pick=st.integers(0, 5),
        consumed=st.integers(0, 4),
        rid=st.sampled_from(REQUEST_IDS),
    )
    def progress(self, dataset: str, worker: str, pick: int, consumed: int, rid: str) -> None:
        self._call(self.live.report_progress, dataset, worker, self._held(dataset, worker, pick), consumed, rid)

    @rule(
        dataset=st.sampled_from(sorted(SPECS)),
        worker=st.sampled_from(WORKERS),
        pick=st.integers(0, 5),
        rid=st.sampled_from(REQUEST_IDS),
    )
    def done(self, dataset: str, worker: str, pick: int, rid: str) -> None:
        self._call(self.live.report_done, dataset, worker, self._held(dataset, worker, pick), rid)

    @rule(
        dataset=st.sampled_from(sorted(SPECS)),
        worker=st.sampled_from(WORKERS),
        pick=st.integers(0, 5),
        consumed=st.none() | st.integers(0, 4),
        rid=st.sampled_from(REQUEST_IDS),
    )
    def fail(self, dataset: str, worker: str, pick: int, consumed: int | None, rid: str) -> None:
        shard = self._held(dataset, worker, pick)
        self._call(self.live.report_failure, dataset, worker, shard, "boom", consumed=consumed, request_id=rid)

    @rule(worker=st.sampled_from(WORKERS), charge=st.booleans())
    def remove_worker(self, worker: str, charge: bool) -> None:
        self._call(self.live.remove_worker, worker, "node left", charge=charge)

    @rule(partition=st.sampled_from(("p0", "p1", "p2")), end=st.integers(0, 12))
    def advance_stream(self, partition: str, end: int) -> None:
        self._call(self.live.advance_stream, "stream", partition, end)

    @rule(dataset=st.sampled_from(sorted(SPECS)))
    def read_position(self, dataset: str) -> None:
        # A user's data position: its read takes back leases that ran out, and is restored later.
        if dataset in self.live.datasets():
            self.documents.append(self.live.checkpoint(dataset))

    @rule(pick=st.integers(0, 10), rid=st.sampled_from(REQUEST_IDS), as_bytes=st.booleans())
    def restore(self, pick: int, rid: str, as_bytes: bool) -> None:
        if self.documents:
            document = self.documents[pick % len(self.documents)]
            self._call(self.live.restore, document.encode() if as_bytes else document, "", rid)

    @rule(dataset=st.sampled_from(sorted(SPECS)))
    def status(self, dataset: str) -> None:
        if dataset in self.live.datasets():
            self.live.manager(dataset).status()

    @rule(seconds=st.sampled_from((0.5, LEASE_S / 2, LEASE_S, LEASE_S + 0.25, 3 * LEASE_S)))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(seconds=st.sampled_from((LEASE_S / 2, LEASE_S + 0.25)), worker=st.sampled_from(WORKERS))
    def time_passes_then_a_fetch(self, seconds: float, worker: str) -> None:
        # The interleaving a replay must get right: deadlines passing between two calls.
        self.clock.advance(seconds)
        self._call(self.live.fetch, "exact", worker, 1, "")

    @rule()
    def compact(self) -> None:
        self.lines.extend(self.live.take_changes())
        self.unencoded = self.live.journal_base_document()

    @invariant()
    def a_replay_is_the_registry_that_wrote_the_log(self) -> None:
        # From the newest encoded base: one taken since waits for the next call to be encoded.
        assert self.base is not None
        self.clock.ticking = False  # both compared at one reading
        try:
            replica = ShardRegistry(self.clock)
            replica.load_journal(self.base, list(self.lines), restart_leases=False)
            assert _state(replica) == _state(self.live)
        finally:
            self.clock.ticking = True


ChangeLogMachine.TestCase.settings = settings(settings(), max_examples=100, stateful_step_count=40, deadline=None)
TestChangeLogMachine = ChangeLogMachine.TestCase


def _logged() -> tuple[ManualClock, ShardRegistry]:
    clock = ManualClock(50.0)
    registry = ShardRegistry(clock)
    registry.start_change_log()
    registry.register(SPECS["exact"])
    registry.take_changes()  # the bases the tests take hold it
    return clock, registry


def test_a_replay_decides_a_lease_that_ran_out_between_two_calls_as_the_live_registry_did() -> None:
    clock, live = _logged()
    base = live.journal_base()
    [first] = live.fetch("exact", "0").shards
    clock.advance(LEASE_S + 1)  # no call sees the deadline pass: the next one takes the lease back
    [second] = live.fetch("exact", "1").shards
    assert second.shard_id == first.shard_id  # re-queued shards go first
    replica = ShardRegistry(ManualClock(9_000.0))  # another clock: a restarted master's
    assert replica.load_journal(base, live.take_changes()) == 2
    held = replica.manager("exact").leased_shards("1")
    assert [s.shard_id for s in held] == [first.shard_id]
    assert replica.manager("exact").leased_shards("0") == []
    # Restarted: the lease runs a whole period on the new clock, and a retry is answered as before.
    status = replica.manager("exact").status()
    assert [w.leased for w in status.workers] == [1]


def test_a_lease_the_base_holds_runs_out_at_its_own_deadline_in_the_replay() -> None:
    clock, live = _logged()
    [old] = live.fetch("exact", "0").shards  # leased at 50: runs out at 60
    clock.advance(6)
    base = live.journal_base()  # at 56, with the lease
    clock.advance(5)
    [taken] = live.fetch("exact", "1").shards  # at 61: the old lease ran out, its shard goes first
    assert taken.shard_id == old.shard_id
    replica = ShardRegistry(clock)
    replica.load_journal(base, live.take_changes())
    assert [s.shard_id for s in replica.manager("exact").leased_shards("1")] == [old.shard_id]


def test_a_restarted_host_gives_each_lease_a_whole_period_on_its_own_clock() -> None:
    _, live = _logged()
    base = live.journal_base()
    [shard] = live.fetch("exact", "0").shards  # runs out at 60 on the old clock
    new_clock = ManualClock(5.0)  # the restarted master's monotonic clock starts anywhere
    replica = ShardRegistry(new_clock)
    replica.load_journal(base, live.take_changes())
    new_clock.advance(LEASE_S - 0.5)
    assert replica.manager("exact").expire_leases() == []
    new_clock.advance(1.0)
    assert replica.manager("exact").expire_leases() == [shard.shard_id]


def test_a_retried_report_is_answered_from_the_replayed_replies() -> None:
    clock, live = _logged()
    base = live.journal_base()
    [shard] = live.fetch("exact", "0", request_id="f1").shards
    first = live.report_done("exact", "0", shard.shard_id, request_id="d1")
    replica = ShardRegistry(clock)
    replica.load_journal(base, live.take_changes())
    again = replica.report_done("exact", "0", shard.shard_id, request_id="d1")
    assert again == first
    with pytest.raises(ShardStateError, match="already done"):
        replica.report_done("exact", "0", shard.shard_id, request_id="d2")


def test_a_base_keeps_every_remembered_reply_so_an_older_retry_is_answered_as_before() -> None:
    clock, live = _logged()
    live.fetch("exact", "0", request_id="f1")
    live.fetch("exact", "0", request_id="f2")
    base = live.journal_base()  # the worker's newest fetch is f2, but f1 is still remembered
    retried = live.fetch("exact", "0", request_id="f1")
    assert retried.reason.startswith("retried request 'f1'")
    replica = ShardRegistry(clock)
    replica.load_journal(base, live.take_changes(), restart_leases=False)
    assert json.loads(replica.journal_base().text)["datasets"] == json.loads(live.journal_base().text)["datasets"]
    assert replica.fetch("exact", "0", request_id="f1") == live.fetch("exact", "0", request_id="f1")


def test_refused_calls_log_nothing_and_a_registry_logs_nothing_until_asked() -> None:
    registry = ShardRegistry(ManualClock())
    registry.register(SPECS["exact"])
    registry.fetch("exact", "0")
    assert not registry.logs_changes
    assert registry.take_changes() == []
    registry.start_change_log()
    with pytest.raises(ShardError):
        registry.report_done("exact", "0", 10_000)
    with pytest.raises(InvalidShardRequestError):
        registry.fetch("exact", "0", count=0)
    assert registry.take_changes() == []
    registry.fetch("exact", "1")
    [line] = registry.take_changes()
    assert json.loads(line.text)["call"] == "fetch"


def test_a_journal_loads_only_into_an_empty_registry_and_refuses_what_does_not_belong_to_its_base() -> None:
    clock, live = _logged()
    base = live.journal_base()
    live.fetch("exact", "0")
    [line] = live.take_changes()
    with pytest.raises(ShardStateError, match="empty registry"):
        live.load_journal(base, [line])
    corrupt = LoggedCall(line.seq, line.text.replace('"call":"fetch"', '"call":"steal"'))
    with pytest.raises(InvalidShardRequestError, match=f"change {line.seq}: unknown call 'steal'"):
        ShardRegistry(clock).load_journal(base, [corrupt])
    renumbered = LoggedCall(line.seq + 1, line.text)
    with pytest.raises(InvalidShardRequestError, match="it says it is change"):
        ShardRegistry(clock).load_journal(base, [renumbered])
    # A done for a shard the base never leased: a line of another registry.
    other = LoggedCall(
        line.seq, line.text.replace('"call":"fetch"', '"call":"done"').replace('"count":1', '"shard_id":3')
    )
    with pytest.raises(InvalidShardRequestError, match=f"change {line.seq} \\(done\\) does not apply"):
        ShardRegistry(clock).load_journal(base, [other])
    with pytest.raises(InvalidShardRequestError, match=r"not a 'dlrover\.shard\.registry' document"):
        ShardRegistry(clock).load_journal(LoggedCall(base.seq, '{"format": "something else"}'))


def test_a_lease_without_a_timeout_survives_the_journal() -> None:
    clock = ManualClock()
    live = ShardRegistry(clock)
    live.start_change_log()
    live.register(attrs.evolve(SPECS["exact"], lease_timeout_s=float("inf")))
    [shard] = live.fetch("exact", "0").shards
    replica = ShardRegistry(clock)
    replica.load_journal(live.journal_base())
    clock.advance(1e9)
    assert [s.shard_id for s in replica.manager("exact").leased_shards("0")] == [shard.shard_id]


def test_lines_replay_under_the_settings_they_were_written_with_and_later_calls_use_the_new_ones() -> None:
    clock = ManualClock()
    live = ShardRegistry(clock, ShardManagerConfig(max_fetch_count=8, request_cache_size=8))
    live.start_change_log()
    live.register(SPECS["exact"])
    base = live.journal_base()
    for i in range(6):
        live.fetch("exact", "0", count=8 if i == 0 else 1, request_id=f"f{i}")
    upgraded = ShardRegistry(clock, ShardManagerConfig(max_fetch_count=4, request_cache_size=2))
    assert upgraded.load_journal(base, live.take_changes()) == 6  # a fetch of 8 replays as it ran
    assert len(upgraded.manager("exact").leased_shards("0")) == 13
    with pytest.raises(InvalidShardRequestError, match=r"count must be in 1\.\.4"):
        upgraded.fetch("exact", "0", count=8)
    retried = upgraded.fetch("exact", "0", request_id="f5")  # the newest two replies are kept
    assert retried.reason.startswith("retried request 'f5'")
    assert not upgraded.fetch("exact", "0", request_id="f1").reason.startswith("retried")


def test_a_call_whose_arguments_no_line_can_hold_is_refused_before_it_changes_anything() -> None:
    _, live = _logged()
    with pytest.raises(InvalidShardRequestError, match="remove_worker: an argument cannot be logged"):
        live.remove_worker("0", reason=object())  # type: ignore[arg-type]
    assert live.take_changes() == []
    document = live.checkpoint("exact")
    result = live.restore(bytearray(document.encode()))  # read as bytes are
    assert result.dataset == "exact"
    [line] = live.take_changes()
    assert json.loads(line.text)["args"]["document"] == document


def test_a_stream_advance_that_changes_nothing_writes_no_line() -> None:
    registry = ShardRegistry(ManualClock())
    registry.start_change_log()
    registry.register(SPECS["stream"])
    registry.take_changes()
    assert registry.advance_stream("stream", "p0", 4).changed
    assert not registry.advance_stream("stream", "p0", 4).changed
    assert [json.loads(line.text)["call"] for line in registry.take_changes()] == ["advance_stream"]


def test_a_base_leaves_the_garbage_collector_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The collector is paused while the document is built (its allocations made full collections
    # most of the cost at tens of thousands of leases), and only then.
    from dlrover.shard import registry as registry_module

    seen: list[bool] = []
    build = registry_module.progress_document

    def watched(*args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.append(gc.isenabled())
        return build(*args, **kwargs)

    monkeypatch.setattr(registry_module, "progress_document", watched)
    _clock, live = _logged()
    live.fetch("exact", "0")
    assert gc.isenabled()
    seq, document = live.journal_base_document()
    assert seen == [False]  # paused while the document was built
    assert gc.isenabled()
    assert encode_base(seq, document).seq == seq
    gc.disable()
    try:
        live.journal_base_document()
        assert not gc.isenabled()  # paused by someone else: theirs to resume
    finally:
        gc.enable()


def test_a_base_from_before_done_when_acknowledged_replays_its_lines_as_its_master_decided_them() -> None:
    # An older master re-queued a fully acknowledged shard whose worker left, and leased it again: a
    # replay deciding "done" instead could not apply that later fetch.
    import json

    from dlrover.shard import ShardManagerConfig
    from dlrover.shard.changelog import LoggedCall

    clock = ManualClock(50.0)
    old_master = ShardRegistry(clock, ShardManagerConfig(done_when_acknowledged=False))
    old_master.start_change_log()
    old_master.register(SPECS["exact"])
    old_master.take_changes()
    document = json.loads(old_master.journal_base().text)
    document["config"].pop("done_when_acknowledged")  # as a master of before the setting wrote it
    [shard] = old_master.fetch("exact", "0").shards
    old_master.report_progress("exact", "0", shard.shard_id, shard.size)
    old_master.remove_worker("0", "killed")
    [again] = old_master.fetch("exact", "1").shards
    assert again.shard_id == shard.shard_id
    lines = old_master.take_changes()
    replica = ShardRegistry(ManualClock(9_000.0))
    replica.load_journal(LoggedCall(document["seq"], json.dumps(document)), lines)
    assert [s.shard_id for s in replica.manager("exact").leased_shards("1")] == [shard.shard_id]
    assert replica.config.done_when_acknowledged, "the replica's own setting decides from here on"
