"""Export and restore of the rendezvous: a restarted master keeps rounds, ranks, waiting nodes and drop reasons."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.master.journal import JournalError
from dlrover.master.rendezvous_state import export_rendezvous, restore_rendezvous
from dlrover.rendezvous import PollState, RendezvousConfig, RendezvousManager, UnknownNodeError

CONFIG = RendezvousConfig(min_nodes=2, max_nodes=3, last_call_s=1.0, heartbeat_timeout_s=10.0)


def restored(manager: RendezvousManager, now: float = 1000.0) -> RendezvousManager:
    fresh = RendezvousManager(manager.config)
    restore_rendezvous(fresh, export_rendezvous(manager), now)
    return fresh


SIZES = {"0": 4, "1": 2, "2": 1, "7": 3}  # workers per node: uneven --nproc-per-node


def formed() -> RendezvousManager:
    m = RendezvousManager(CONFIG)
    for node in ("0", "1", "2"):
        m.join(node, 0.0, local_world_size=SIZES[node])
    assert m.round_number == 1
    return m


def test_a_round_survives_with_its_number_ranks_and_worker_layout() -> None:
    m = formed()
    m.join("7", 1.0, local_world_size=SIZES["7"])  # late: waits while the round is in force
    r = restored(m)
    assert r.round_number == 1
    assert r.waiting == ("7",)
    for node in ("0", "1", "2"):
        before, after = m.poll(node, 2.0), r.poll(node, 1001.0)
        assert (after.state, after.round, after.rank, after.world_size) == (
            PollState.ASSIGNED,
            before.round,
            before.rank,
            before.world_size,
        )
        assert (after.first_worker_rank, after.worker_world_size) == (before.first_worker_rank, 7)
    assert export_rendezvous(r) == export_rendezvous(m)


def test_a_document_written_before_worker_layouts_restores_without_one() -> None:
    doc = json.loads(export_rendezvous(formed()))
    del doc["current"]["local_world_sizes"]
    doc["waiting"] = [["7", ""]]
    r = RendezvousManager(CONFIG)
    restore_rendezvous(r, json.dumps(doc), 1000.0)
    assert r.waiting == ("7",)
    result = r.poll("1", 1000.0)
    assert (result.state, result.rank, result.worker_world_size) == (PollState.ASSIGNED, 1, 0)


def test_rounds_only_increase_and_ranks_stay_after_a_restore() -> None:
    r = restored(formed())
    ranks = {n: r.poll(n, 1000.0).rank for n in ("0", "1", "2")}
    for node in ("2", "0", "1"):  # the processes restart and join again, in another order
        r.join(node, 1000.0)
    assert r.round_number == 2
    assert {n: r.poll(n, 1000.0).rank for n in ranks} == ranks


def test_members_get_a_fresh_heartbeat_timeout_from_the_restore() -> None:
    r = restored(formed(), now=1000.0)
    assert r.expire(1009.0) == []  # the old master's times do not count against them
    assert r.expire(1011.0) == ["0"]  # the first to expire dissolves the round ...
    assert r.current_round is None
    assert r.num_nodes_waiting(1011.0, "1") >= 1  # ... and the others are told


def test_a_finished_member_stays_untracked_after_a_restore() -> None:
    m = formed()
    m.finish("1", 1.0)
    r = restored(m, now=1000.0)
    assert r.finished == {"1"}
    assert r.tracked == {"0", "2"}
    for t in (1008.0, 1016.0):  # the others call; the finished node never does
        r.num_nodes_waiting(t, "0")
        r.num_nodes_waiting(t, "2")
    assert r.expire(1020.0) == []
    assert r.current_round is not None
    assert set(r.current_round.members) == {"0", "1", "2"}
    old = json.loads(export_rendezvous(m))
    del old["finished"]  # a document from before the field: every member is tracked
    legacy = RendezvousManager(CONFIG)
    restore_rendezvous(legacy, json.dumps(old), 1000.0)
    assert legacy.finished == frozenset()
    assert legacy.tracked == {"0", "1", "2"}


def test_a_dissolved_round_still_tells_its_members_after_a_restore() -> None:
    m = formed()
    m.leave("1", 1.0)
    r = restored(m)
    assert r.current_round is None
    assert r.num_nodes_waiting(1000.0, "0") >= 1
    reason = r.poll("0", 1000.0).reason
    assert "dissolved" in reason
    assert "'1' left" in reason


def test_a_closed_rendezvous_stays_closed() -> None:
    m = formed()
    m.close(1.0)
    r = restored(m)
    assert r.closed
    assert not r.join("9", 1000.0).accepted


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: "not json",
        lambda d: json.dumps({**d, "format": "other"}),
        lambda d: json.dumps({**d, "version": 99}),
        lambda d: json.dumps({**d, "round_number": -1}),
        lambda d: json.dumps({**d, "current": {**d["current"], "members": ["0", "0"]}}),
        lambda d: json.dumps({**d, "current": {**d["current"], "number": 5}}),
        lambda d: json.dumps({**d, "waiting": [["x"]]}),
        lambda d: json.dumps({**d, "last_ranks": {"": 0}}),
        lambda d: json.dumps({**d, "waiting": [["x", ""], ["x", ""]]}),
        lambda d: json.dumps({**d, "finished": "0"}),
        lambda d: json.dumps({**d, "finished": ["9"]}),  # not a member of the current round
        lambda d: json.dumps({**d, "finished": ["0"], "waiting": [["0", ""]]}),  # finished yet waiting
        lambda d: json.dumps({**d, "current": {**d["current"], "local_world_sizes": [1, 2]}}),  # 3 members
        lambda d: json.dumps({**d, "current": {**d["current"], "local_world_sizes": [1, -2, 3]}}),
        lambda d: json.dumps({**d, "current": {**d["current"], "local_world_sizes": "1,2,3"}}),
        lambda d: json.dumps({**d, "waiting": [["x", "", -1]]}),
        lambda d: json.dumps({**d, "waiting": [["x", "", 1 << 20]]}),
    ],
)
def test_a_corrupt_document_is_refused_and_changes_nothing(mutate: object) -> None:
    doc = json.loads(export_rendezvous(formed()))
    fresh = RendezvousManager(CONFIG)
    before = export_rendezvous(fresh)
    with pytest.raises(JournalError, match="rendezvous state"):
        restore_rendezvous(fresh, mutate(doc), 0.0)  # type: ignore[operator]
    assert export_rendezvous(fresh) == before


def test_restore_needs_a_fresh_manager() -> None:
    with pytest.raises(JournalError, match="fresh"):
        restore_rendezvous(formed(), export_rendezvous(formed()), 0.0)


NODES = st.sampled_from(["a", "b", "c", "d", "e"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("join"), NODES),
        st.tuples(st.just("poll"), NODES),
        st.tuples(st.just("leave"), NODES),
        st.tuples(st.just("finish"), NODES),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 2.0, 11.0])),
        st.tuples(st.just("close"), st.just("")),
    ),
    max_size=30,
)


@given(OPS)
def test_any_history_round_trips(ops: list[tuple[str, object]]) -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=4, node_unit=2, last_call_s=1.0))
    now = 0.0
    for op, arg in ops:
        if op == "wait":
            now += float(arg)  # type: ignore[arg-type]
        elif op == "join":
            m.join(str(arg), now, local_world_size=ord(str(arg)) % 3)  # 0 too: a node that did not say
        elif op == "poll":
            m.poll(str(arg), now)
        elif op == "leave":
            with contextlib.suppress(UnknownNodeError):
                m.leave(str(arg), now)
        elif op == "finish":
            with contextlib.suppress(UnknownNodeError):
                m.finish(str(arg), now)
        elif op == "close":
            m.close(now)
    # Settle what was due at `now` (lazy expiry, a round whose last call passed): a restore keeps
    # no times, so it can only agree with the state as of its own moment.
    m.expire(now)
    r = restored(m, now=now)
    assert export_rendezvous(r) == export_rendezvous(m)
    assert r.round_number == m.round_number
    assert r.current_round == m.current_round or (
        r.current_round is not None
        and m.current_round is not None
        and r.current_round.members == m.current_round.members
    )
    for node in "abcde":
        assert r.num_nodes_waiting(now, node) == m.num_nodes_waiting(now, node)
