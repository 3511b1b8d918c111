"""Random interleavings of every shard-manager request, checked against a trivially correct model.

The model knows the shard bounds (they follow from N and the shard size) and tracks each shard's
state, holder, lease deadline, acknowledged position and failures with plain dicts. The manager
under test is driven through its registry, including checkpoints, in-place restores and manager
restarts from a checkpoint. After every step the invariants of DESIGN.md are checked:

- every shard of an unfinished epoch is in exactly one of todo/doing/done/failed, the same as the model;
- no shard is leased to two workers, and every lease is held by a live worker;
- at-least-once: every sample of a finished epoch (outside failed shards) was trained at least once;
- exactly-once: no sample is ever acknowledged twice, and a finished epoch acknowledged every sample
  exactly once, except the unacknowledged remainders listed in the failed set;
- at-most-once: no sample is ever trained twice;
- restore(checkpoint(s)) behaves as s: the restored manager's checkpoint equals the original, and the
  model keeps predicting it afterwards;
- a position read is reused until the position changes (leases alone do not change it, except
  at-most-once): the model keeps its own state as of the read, and a restore of a reused read
  rewinds the model to it, leases taken since included;
- a restart from a checkpoint that keeps the leases changes nothing but the leases' deadlines.
"""

from __future__ import annotations

import copy
import json
from collections import Counter, deque
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.common import ManualClock
from dlrover.shard import (
    DatasetSpec,
    DeliveryMode,
    IndexSource,
    InvalidShardRequestError,
    ShardManager,
    ShardRegistry,
    ShardStateError,
    UnknownShardError,
)
from dlrover.shard.acknowledged import apply_acknowledged
from dlrover.shard.progress import decode_progress

WORKERS = ("w0", "w1", "w2")
LEASE_S = 10.0
# The model's fields a data position describes: what a restore of it rewinds them to.
POSITION_FIELDS = (
    "state", "queue", "holder", "deadline", "acked", "dispatched_at", "dispatches", "failures", "orders", "epoch",
    "cursor",
)  # fmt: skip


def _latest(acknowledged: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
    """One entry per shard, as a sampler keeps them: the furthest position, done if ever done."""
    out: dict[int, tuple[int, bool]] = {}
    for sid, upto, done in acknowledged:
        old = out.get(sid, (0, False))
        out[sid] = (max(old[0], upto), old[1] or done)
    return [(sid, upto, done) for sid, (upto, done) in sorted(out.items())]


def _remaining(document: str, clock: ManualClock, total_shards: int) -> dict[int, Any]:
    """What a data position says of every shard of every epoch: done, failed, or waiting at a position."""
    spec, state = decode_progress(document)
    manager, _ = ShardManager.from_state(spec, state, clock)
    fates: dict[int, Any] = {}
    for sid in range(total_shards):
        if sid in manager._failed:
            fates[sid] = "failed"
        elif manager._is_done(sid):
            fates[sid] = "done"
        else:
            queued = manager._queued.get(sid)
            fates[sid] = 0 if queued is None else queued.consumed
    return fates


def _strip_in_flight(doc: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(doc)
    parsed["state"]["in_flight"] = []
    return parsed


class ShardMachine(RuleBasedStateMachine):
    fetched = Bundle("fetched")

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.registry = ShardRegistry(self.clock)
        self.alive = set(WORKERS)
        # model
        self.state: dict[int, str] = {}  # sid -> todo|doing|done|failed, for every materialized shard
        self.queue: deque[int] = deque()  # re-queued shards, in dispatch order
        self.holder: dict[int, str] = {}
        self.deadline: dict[int, float] = {}
        self.acked: dict[int, int] = {}  # sid -> acknowledged position
        self.dispatched_at: dict[int, int] = {}  # sid -> consumed when the current holder got it
        self.dispatches: Counter[int] = Counter()
        self.failures: Counter[int] = Counter()
        self.orders: dict[int, list[int]] = {}
        self.epoch = -1
        self.cursor = 0
        self.trained: dict[int, Counter[int]] = {}  # epoch -> sample -> times trained
        self.acked_samples: dict[int, Counter[int]] = {}  # epoch -> sample -> times acknowledged
        self.restarts = 0
        self.last_done: dict[str, tuple[int, str]] = {}  # worker -> (shard, request id) of its newest done
        self.request_ids = 0
        # The newest position read and the model as of it, until the position changes (then None).
        self.position: tuple[str, dict[str, Any]] | None = None
        # A position read earlier and every acknowledgement since (a group sampler's state), until
        # something other than leases and acknowledgements happens.
        self.merge_base: tuple[str, list[tuple[int, int, bool]]] | None = None

    # ------------------------------------------------------------------ set-up

    @initialize(
        n=st.integers(1, 24),
        batch=st.integers(1, 3),
        batches=st.integers(1, 2),
        epochs=st.integers(1, 3),
        shuffle=st.booleans(),
        shuffle_samples=st.booleans(),
        delivery=st.sampled_from(DeliveryMode),
        attempts=st.integers(1, 3),
    )
    def register(  # noqa: PLR0917 (hypothesis passes drawn values by keyword)
        self,
        n: int,
        batch: int,
        batches: int,
        epochs: int,
        shuffle: bool,
        shuffle_samples: bool,
        delivery: DeliveryMode,
        attempts: int,
    ) -> None:
        self.spec = DatasetSpec(
            name="ds",
            source=IndexSource(n),
            batch_size=batch,
            batches_per_shard=batches,
            num_epochs=epochs,
            shuffle=shuffle,
            shuffle_samples=shuffle_samples,
            seed=n * 31 + epochs,
            delivery=delivery,
            lease_timeout_s=LEASE_S,
            max_attempts=attempts,
        )
        assert self.registry.register(self.spec).created
        self.n = n
        self.size = batch * batches
        self.per_epoch = -(-n // self.size)

    @property
    def m(self):  # type: ignore[no-untyped-def]
        return self.registry.manager("ds")

    def _bounds(self, sid: int) -> tuple[int, int]:
        k = sid % self.per_epoch
        return k * self.size, min((k + 1) * self.size, self.n)

    def _fresh_left(self) -> int:
        return 0 if self.epoch < 0 else self.per_epoch - self.cursor

    def _available(self) -> int:
        assert self.spec.num_epochs is not None
        return len(self.queue) + self._fresh_left() + (self.spec.num_epochs - 1 - self.epoch) * self.per_epoch

    def _held(self) -> list[tuple[str, int]]:
        return sorted((w, s) for s, w in self.holder.items())

    def _position_changed(self) -> None:
        self.position = None

    def _read_position(self) -> str:
        """The registry's position read; the model as of the read that wrote it."""
        doc = self.registry.checkpoint("ds")
        if self.position is None:
            self.position = (doc, copy.deepcopy({f: getattr(self, f) for f in POSITION_FIELDS}))
        else:
            assert doc == self.position[0], "the position changed where the model says it did not"
        self._check_position(doc, self.position[1])
        return doc

    def _check_position(self, doc: str, model: dict[str, Any]) -> None:
        """The document says what the model as of its read says: a stale reuse would not."""
        state = json.loads(doc)["state"]
        mode = self.spec.delivery
        holders = set(model["holder"])
        assert state["done_total"] == sum(v == "done" for v in model["state"].values())
        failed = {sid for sid, v in model["state"].items() if v == "failed"}
        if mode is DeliveryMode.AT_MOST_ONCE:
            failed |= holders  # written as failed: they may have been partly used
        assert {f["shard_id"] for f in state["failed"]} == failed
        queued = {q["shard_id"]: q["consumed"] for q in state["queue"]}
        assert set(queued) == set(model["queue"]) | (set() if mode is DeliveryMode.AT_MOST_ONCE else holders)
        for sid, consumed in queued.items():
            leased_at_least_once = mode is DeliveryMode.AT_LEAST_ONCE and sid in holders
            assert consumed == (0 if leased_at_least_once else model["acked"][sid]), sid
        assert (state["epoch"], state["cursor"]) == (model["epoch"], model["cursor"])

    # ------------------------------------------------------------------ model transitions

    def _acknowledged(self, sid: int, upto: int, done: bool) -> None:
        if self.merge_base is not None:
            self.merge_base[1].append((sid, upto, done))

    def _release(self, sid: int, *, charge: bool = True) -> None:
        """A lease ended without done (`charge`: it counts as a failed attempt)."""
        self._position_changed()
        self.merge_base = None  # not an acknowledgement: a group restores from its last state instead
        del self.holder[sid]
        del self.deadline[sid]
        lo, hi = self._bounds(sid)
        if self.spec.delivery is DeliveryMode.EXACTLY_ONCE and self.acked[sid] >= hi - lo:
            self.state[sid] = "done"  # every sample acknowledged: nothing is left to dispatch
            return
        if charge:
            self.failures[sid] += 1
        if self.spec.delivery is DeliveryMode.AT_MOST_ONCE or self.failures[sid] >= self.spec.max_attempts:  # type: ignore[operator]
            self.state[sid] = "failed"
            return
        if self.spec.delivery is DeliveryMode.AT_LEAST_ONCE:
            self.acked[sid] = 0
        self.state[sid] = "todo"
        self.queue.append(sid)

    def _train(self, sid: int, upto: int, holder: str) -> None:
        """The holder trained the shard's samples up to position `upto` and acknowledged them."""
        order = self.orders[sid]
        epoch = sid // self.per_epoch
        start = (
            max(self.acked[sid], self.dispatched_at[sid])
            if self.spec.delivery is DeliveryMode.EXACTLY_ONCE
            else self.acked[sid]
        )
        if upto <= start:
            return
        for sample in order[start:upto]:
            self.trained.setdefault(epoch, Counter())[sample] += 1
            if self.spec.delivery is DeliveryMode.EXACTLY_ONCE:
                self.acked_samples.setdefault(epoch, Counter())[sample] += 1
        self.acked[sid] = upto

    # ------------------------------------------------------------------ rules

    @rule(target=fetched, worker=st.sampled_from(WORKERS), count=st.integers(1, 3))
    def fetch(self, worker: str, count: int) -> Any:
        self.alive.add(worker)  # a removed worker may come back as a new incarnation
        expected = min(count, self._available())
        queued_first = list(self.queue)[:expected]
        res = self.m.fetch(worker, count)
        assert len(res.shards) == expected, res.reason
        ids = []
        for i, s in enumerate(res.shards):
            sid = s.shard_id
            ids.append(sid)
            if i < len(queued_first):
                assert sid == queued_first[i], "re-queued shards are served first, in order"
                assert self.queue.popleft() == sid
            else:
                if self._fresh_left() == 0:
                    self._position_changed()
                    self.epoch += 1
                    self.cursor = 0
                    for k in range(self.per_epoch):
                        self.state.setdefault(self.epoch * self.per_epoch + k, "todo")
                assert sid // self.per_epoch == self.epoch
                assert sid not in self.dispatches, f"fresh shard {sid} was dispatched before"
                self.cursor += 1
                self.acked[sid] = 0
                self.orders[sid] = s.sample_order()
            assert self.state[sid] == "todo"
            assert (s.start, s.end) == self._bounds(sid)
            assert s.sample_order() == self.orders[sid], "a shard's sample order never changes"
            assert s.consumed == self.acked[sid]
            self.dispatches[sid] += 1
            assert s.attempt == self.dispatches[sid]
            if self.spec.delivery is DeliveryMode.AT_MOST_ONCE:
                self._position_changed()
            self.state[sid] = "doing"
            self.holder[sid] = worker
            self.deadline[sid] = self.clock.now() + LEASE_S
            self.dispatched_at[sid] = s.consumed
        assert res.finished == (self._available() == 0 and not self.holder)
        return ids[0] if ids else -1

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data())
    def progress(self, data: st.DataObject) -> None:
        worker, sid = data.draw(st.sampled_from(self._held()))
        lo, hi = self._bounds(sid)
        self._progress(worker, sid, data.draw(st.integers(0, hi - lo)))

    def _progress(self, worker: str, sid: int, upto: int, attempt: int | None = None) -> None:
        self.m.report_progress(worker, sid, upto, attempt=attempt)
        self._acknowledged(sid, upto, False)
        self.deadline[sid] = self.clock.now() + LEASE_S
        if upto > self.acked[sid]:
            self._position_changed()
        self._train(sid, upto, worker)

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data(), offset=st.sampled_from([-1, 0, 1]))
    def progress_naming_a_dispatch(self, data: st.DataObject, offset: int) -> None:
        """A report names a dispatch: an earlier one than the lease's is refused and changes nothing;
        the lease's own, or a later one (the worker's, the service's state went back), renews it."""
        worker, sid = data.draw(st.sampled_from(self._held()))
        attempt = self.dispatches[sid] + offset
        lo, hi = self._bounds(sid)
        upto = data.draw(st.integers(0, hi - lo))
        if offset < 0:
            before = self.registry.checkpoint("ds", include_leases=True)
            with pytest.raises(ShardStateError, match=f"not dispatch {attempt}"):
                self.m.report_progress(worker, sid, upto, attempt=attempt)
            assert self.registry.checkpoint("ds", include_leases=True) == before
            return
        self._progress(worker, sid, upto, attempt)

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        worker, sid = data.draw(st.sampled_from(self._held()))
        lo, hi = self._bounds(sid)
        self.request_ids += 1
        request_id = f"done-{self.request_ids}"
        self.m.report_done(worker, sid, request_id=request_id)
        self._acknowledged(sid, hi - lo, True)
        self._position_changed()
        self.last_done[worker] = (sid, request_id)
        self._train(sid, hi - lo, worker)
        del self.holder[sid]
        del self.deadline[sid]
        self.state[sid] = "done"

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data(), with_position=st.booleans())
    def fail(self, data: st.DataObject, with_position: bool) -> None:
        worker, sid = data.draw(st.sampled_from(self._held()))
        lo, hi = self._bounds(sid)
        upto = data.draw(st.integers(0, hi - lo)) if with_position else None
        self.m.report_failure(worker, sid, "injected", consumed=upto)
        if upto is not None:
            self._train(sid, upto, worker)
        self._release(sid)

    @rule(worker=st.sampled_from(WORKERS), charge=st.booleans())
    def worker_dies(self, worker: str, charge: bool) -> None:
        # charge=False: the platform's doing (a lost node, a preemption), never an attempt of its shards.
        self.last_done.pop(worker, None)  # its replies are forgotten with it
        ids = self.m.remove_worker(worker, "killed", charge=charge)
        assert ids == sorted(s for s, w in self.holder.items() if w == worker)
        # A dead worker may have trained some samples it never acknowledged (at-least-once repeats them).
        for sid in ids:
            self._release(sid, charge=charge)
        self.alive.discard(worker)

    @rule(seconds=st.sampled_from([1.0, 5.0, LEASE_S, 2 * LEASE_S]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)
        now = self.clock.now()
        due = {sid for sid, d in self.deadline.items() if d <= now}
        expired = self.m.expire_leases()
        assert set(expired) == due
        for sid in sorted(due, key=lambda s: (self.deadline[s], s)):
            self._release(sid)

    @rule(sid=fetched, worker=st.sampled_from(WORKERS), kind=st.sampled_from(["progress", "done", "fail"]))
    def stale_report(self, sid: int, worker: str, kind: str) -> None:
        if self.holder.get(sid) == worker:
            return
        before = self._read_position()
        before_state = self.registry.checkpoint("ds", include_leases=True)  # never reused
        calls = {
            "progress": lambda: self.m.report_progress(worker, sid, 0),
            "done": lambda: self.m.report_done(worker, sid),
            "fail": lambda: self.m.report_failure(worker, sid, "stale"),
        }
        with pytest.raises((ShardStateError, UnknownShardError)):
            calls[kind]()
        assert self._read_position() == before
        assert self.registry.checkpoint("ds", include_leases=True) == before_state

    @rule()
    def register_again(self) -> None:
        assert not self.registry.register(self.spec).created

    @rule(fresh_registry=st.booleans())
    def checkpoint_and_restore(self, fresh_registry: bool) -> None:
        self.merge_base = None
        self.last_done.clear()  # a user's restore starts a new manager, with no replies
        doc = self._read_position()
        assert self.position is not None
        if fresh_registry:  # the master restarted: a new manager built from the checkpoint
            self.registry = ShardRegistry(self.clock)
            self.restarts += 1
        result = self.registry.restore(doc)
        # Back to the model as of the read: shards leased since are undispatched or re-queued again.
        for field, value in self.position[1].items():
            setattr(self, field, value)
        self._position_changed()  # a new manager
        assert result.returned_to_queue == len(self.holder)
        for sid in sorted(self.holder):
            del self.holder[sid]
            del self.deadline[sid]
            if self.spec.delivery is DeliveryMode.AT_MOST_ONCE:
                self.state[sid] = "failed"
                continue
            if self.spec.delivery is DeliveryMode.AT_LEAST_ONCE:
                self.acked[sid] = 0
            self.state[sid] = "todo"
            self.queue.append(sid)
        assert _strip_in_flight(self._read_position()) == _strip_in_flight(doc)

    @rule()
    def master_restarts_keeping_leases(self) -> None:
        """The master journals its leases and restarts: every holder keeps its shards, with a whole lease period."""
        doc = self.registry.checkpoint("ds", include_leases=True)
        self.registry = ShardRegistry(self.clock)
        self.restarts += 1
        result = self.registry.restore(doc)
        self._position_changed()  # a new registry: its first read is its own
        assert result.returned_to_queue == 0, result.reason
        assert self.registry.checkpoint("ds", include_leases=True) == doc
        for sid in self.holder:
            self.deadline[sid] = self.clock.now() + LEASE_S

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data())
    def acknowledge_a_batch(self, data: st.DataObject) -> None:
        """One request acknowledges several shards of one worker (progress or done each); sent again, it is
        answered and changes nothing."""
        worker = data.draw(st.sampled_from(sorted(set(self.holder.values()))))
        held = sorted(sid for sid, w in self.holder.items() if w == worker)
        picked = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=3, unique=True))
        entries = []
        for sid in picked:
            lo, hi = self._bounds(sid)
            done = data.draw(st.booleans())
            entries.append((sid, hi - lo if done else data.draw(st.integers(0, hi - lo)), done))
        self.request_ids += 1
        request_id = f"ack-{self.request_ids}"
        assert self.registry.acknowledge("ds", worker, entries, request_id).changed
        for sid, upto, done in entries:
            self._acknowledged(sid, upto, done)
            if upto > self.acked[sid] or done:
                self._position_changed()
            self._train(sid, upto, worker)
            if done:
                del self.holder[sid]
                del self.deadline[sid]
                self.state[sid] = "done"
            else:
                self.deadline[sid] = self.clock.now() + LEASE_S
        before = self.registry.checkpoint("ds", include_leases=True)
        assert self.registry.acknowledge("ds", worker, entries, request_id).changed
        assert self.registry.checkpoint("ds", include_leases=True) == before

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data())
    def a_batch_with_one_bad_entry_changes_nothing(self, data: st.DataObject) -> None:
        worker, sid = data.draw(st.sampled_from(self._held()))
        lo, hi = self._bounds(sid)
        bad = data.draw(
            st.sampled_from(
                [(sid, hi - lo + 1, False), (sid + 10_000, 0, True)]
                + [(other, 0, True) for other, w in self.holder.items() if w != worker]
            )
        )
        before = self.registry.checkpoint("ds", include_leases=True)
        with pytest.raises((ShardStateError, UnknownShardError, InvalidShardRequestError)):
            self.registry.acknowledge("ds", worker, [(sid, hi - lo, True), bad], f"bad-{self.request_ids}")
        assert self.registry.checkpoint("ds", include_leases=True) == before

    @rule()
    def read_a_position_to_complete_later(self) -> None:
        self.merge_base = (self._read_position(), [])

    @precondition(lambda self: bool(self.last_done))
    @rule(data=st.data())
    def a_done_is_sent_again(self, data: st.DataObject) -> None:
        """A done whose answer was lost is sent again, also to a master restarted since: answered, not applied."""
        worker = data.draw(st.sampled_from(sorted(self.last_done)))
        sid, request_id = self.last_done[worker]
        before = self.registry.checkpoint("ds", include_leases=True)
        assert self.m.report_done(worker, sid, request_id=request_id).changed
        assert self.registry.checkpoint("ds", include_leases=True) == before

    # ------------------------------------------------------------------ invariants

    def _finished_epochs(self) -> list[int]:
        out = []
        for e in range(self.epoch + 1):
            ids = range(e * self.per_epoch, (e + 1) * self.per_epoch)
            if all(self.state.get(i) in ("done", "failed") for i in ids):
                out.append(e)
        return out

    @invariant()
    def each_shard_is_in_exactly_one_state_and_leased_to_one_live_worker(self) -> None:
        if not hasattr(self, "spec"):
            return
        snap = self.m.snapshot()
        assert not (snap.todo & snap.done)
        assert not (snap.todo & snap.failed)
        assert not (snap.done & snap.failed)
        assert not set(snap.doing) & (snap.todo | snap.done | snap.failed)
        finished = set(self._finished_epochs())
        live = {s: st_ for s, st_ in self.state.items() if s // self.per_epoch not in finished}
        assert snap.todo == {s for s, v in live.items() if v == "todo"}
        assert snap.doing == self.holder
        assert set(snap.done) == {s for s, v in live.items() if v == "done"}
        assert snap.failed == {s for s, v in self.state.items() if v == "failed"}
        assert set(self.holder.values()) <= self.alive
        status = self.m.status()
        assert status.doing == len(self.holder)
        assert status.done == sum(v == "done" for v in self.state.values())
        assert status.failed == sum(v == "failed" for v in self.state.values())

    @invariant()
    def an_earlier_position_completed_with_the_acknowledgements_since_is_the_position_now(self) -> None:
        if self.merge_base is None:
            return
        document, acknowledged = self.merge_base
        assert self.spec.num_epochs is not None
        total = self.spec.num_epochs * self.per_epoch
        merged = _remaining(apply_acknowledged(document, _latest(acknowledged)), self.clock, total)
        if self.spec.delivery is DeliveryMode.AT_MOST_ONCE:
            # Shards leased at the read stay set aside, whatever happened to them since, and so do a shard
            # acknowledged in part after it and those leased before it: the merged position queues none.
            assert all(merged[sid] in ("failed", "done") for sid, _, _ in _latest(acknowledged)), merged
            earlier = _remaining(document, self.clock, total)
            assert all(
                merged[sid] == "done" for sid, _, done in _latest(acknowledged) if done and earlier[sid] != "failed"
            )
            _, merged_state = decode_progress(apply_acknowledged(document, _latest(acknowledged)))
            assert merged_state["queue"] == [], merged_state["queue"]
            return
        assert merged == _remaining(self._read_position(), self.clock, total)

    @invariant()
    def delivery_semantics_hold(self) -> None:
        if not hasattr(self, "spec"):
            return
        mode = self.spec.delivery
        for epoch in range(self.epoch + 1):
            trained = self.trained.get(epoch, Counter())
            if mode is DeliveryMode.AT_MOST_ONCE:
                assert max(trained.values(), default=0) <= 1
            if mode is DeliveryMode.EXACTLY_ONCE:
                assert max(self.acked_samples.get(epoch, Counter()).values(), default=0) <= 1
        for epoch in self._finished_epochs():
            ids = range(epoch * self.per_epoch, (epoch + 1) * self.per_epoch)
            failed_rest: Counter[int] = Counter()
            failed_all: set[int] = set()
            for f in self.m.status().failed_shards:
                if f.shard.epoch == epoch:
                    failed_rest.update(f.shard.remaining_samples())
                    failed_all.update(f.shard.sample_order())
            assert {f.shard.shard_id for f in self.m.status().failed_shards if f.shard.epoch == epoch} == {
                i for i in ids if self.state[i] == "failed"
            }
            if mode is DeliveryMode.AT_LEAST_ONCE:
                trained = self.trained.get(epoch, Counter())
                assert all(trained[s] >= 1 for s in range(self.n) if s not in failed_all)
            if mode is DeliveryMode.EXACTLY_ONCE:
                acked = self.acked_samples.get(epoch, Counter())
                assert all(acked[s] + failed_rest[s] == 1 for s in range(self.n)), (acked, failed_rest)


ShardMachine.TestCase.settings = settings(settings(), stateful_step_count=40)
TestShardMachine = ShardMachine.TestCase
