from __future__ import annotations

import pytest

from dlrover.common import ConfigError
from dlrover.rendezvous import (
    InvalidRequestError,
    NodeParams,
    PollState,
    RendezvousConfig,
    RendezvousManager,
    SwitchTopology,
    UnknownNodeError,
    UnknownRoundError,
)


def _snapshot(m: RendezvousManager) -> tuple[object, ...]:
    return (m.waiting, m.tracked, m.current_round, m.round_number, m.closed, m.config)


def _join_all(m: RendezvousManager, nodes: list[str], now: float) -> None:
    for node in nodes:
        assert m.join(node, now).accepted


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_nodes": 0, "max_nodes": 2}, "min_nodes"),
        ({"min_nodes": -1, "max_nodes": 2}, "min_nodes"),
        ({"min_nodes": 3, "max_nodes": 2}, r"min_nodes \(3\) must not exceed max_nodes \(2\)"),
        ({"min_nodes": 3, "max_nodes": 3, "node_unit": 2}, "no multiple of node_unit=2"),
        ({"min_nodes": 1, "max_nodes": 2, "last_call_s": -1.0}, "last_call_s"),
        ({"min_nodes": 1, "max_nodes": 2, "join_timeout_s": 0}, "join_timeout_s"),
        ({"min_nodes": 1, "max_nodes": 2, "planned_wait_s": -1.0}, "planned_wait_s"),
        ({"min_nodes": 1, "max_nodes": 2, "heartbeat_timeout_s": float("nan")}, "heartbeat_timeout_s"),
        ({"min_nodes": 1, "max_nodes": 2, "poll_rate_per_s": 0}, "poll_rate_per_s"),
        ({"min_nodes": 1, "max_nodes": 2, "max_poll_interval_s": float("inf")}, "max_poll_interval_s"),
        (
            {"min_nodes": 1, "max_nodes": 2, "min_poll_interval_s": 2.0, "max_poll_interval_s": 1.0},
            r"min_poll_interval_s \(2.0\) must not exceed max_poll_interval_s \(1.0\)",
        ),
    ],
)
def test_bad_config_is_rejected_with_the_value(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RendezvousConfig(**kwargs)  # type: ignore[arg-type]


def test_round_completes_at_once_at_max_nodes() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=3, last_call_s=100))
    _join_all(m, ["a", "b"], 0.0)
    assert m.poll("a", 0.0).state is PollState.WAITING
    result = m.join("c", 1.0)
    assert result.accepted
    assert result.round == 1
    polls = {n: m.poll(n, 1.0) for n in "abc"}
    assert {p.state for p in polls.values()} == {PollState.ASSIGNED}
    assert [polls[n].rank for n in "abc"] == [0, 1, 2]
    assert all(p.world_size == 3 and p.round == 1 for p in polls.values())


def test_a_round_places_nodes_with_different_local_world_sizes_by_prefix_sums() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=3, max_nodes=3))
    for node, size in (("a", 4), ("b", 1), ("c", 2)):
        assert m.join(node, 0.0, local_world_size=size).accepted
    polls = {n: m.poll(n, 0.0) for n in "abc"}
    assert [(polls[n].rank, polls[n].first_worker_rank, polls[n].worker_world_size) for n in "abc"] == [
        (0, 0, 7),
        (1, 4, 7),
        (2, 5, 7),
    ]
    current = m.current_round
    assert current is not None
    assert current.local_world_sizes == (4, 1, 2)


def test_a_round_with_a_node_that_did_not_say_has_no_worker_layout() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2))
    m.join("a", 0.0, local_world_size=2)
    m.join("b", 0.0)
    result = m.poll("a", 0.0)
    assert result.state is PollState.ASSIGNED
    assert (result.first_worker_rank, result.worker_world_size) == (0, 0)


@pytest.mark.parametrize("size", [-1, 1 << 17, True, 1.5])
def test_a_bad_local_world_size_is_refused_and_changes_nothing(size: object) -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=2))
    before = _snapshot(m)
    with pytest.raises(InvalidRequestError, match="local_world_size"):
        m.join("a", 0.0, local_world_size=size)  # type: ignore[arg-type]
    assert _snapshot(m) == before


def test_not_yet_answers_carry_reasons() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=4, max_nodes=8, last_call_s=12.0))
    _join_all(m, ["a", "b", "c"], 0.0)
    assert m.poll("a", 0.0).reason == "3 of min 4 nodes joined; waiting for 1 more"
    m.join("d", 0.0)
    assert m.poll("a", 0.0).reason == "4 nodes joined (min 4, max 8); last call in 12.0 s for more to join"
    assert m.poll("a", 11.0).state is PollState.WAITING
    assert m.poll("a", 12.0).state is PollState.ASSIGNED


def test_last_call_takes_largest_multiple_of_node_unit_and_extras_wait() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=8, node_unit=2, last_call_s=1.0))
    _join_all(m, ["a", "b", "c", "d", "e"], 0.0)
    assert m.poll("a", 1.0).state is PollState.ASSIGNED
    assert m.current_round is not None
    assert m.current_round.members == ("a", "b", "c", "d")
    late = m.poll("e", 1.0)
    assert late.state is PollState.WAITING
    assert late.round == 2
    # e alone would not make a whole unit: the members keep training until a partner joins.
    assert m.num_nodes_waiting(1.0, "a") == 0
    m.join("f", 2.0)
    assert m.num_nodes_waiting(2.0, "a") == 2


def test_a_node_that_cannot_fit_does_not_make_the_members_restart_again_and_again() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2))
    _join_all(m, ["a", "b"], 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    m.join("c", 1.0)  # one node more than the job's maximum
    assert m.status(1.0).reason == "round 1 is in force with 2 nodes; 1 node(s) wait for room in a new round"
    for now in (1.0, 2.0, 3.0):
        # Had the members restarted for c, the new round would hold a and b again (members of the
        # last round come first) and c would still wait: a restart of every worker for nothing.
        assert m.num_nodes_waiting(now, "a") == 0
        assert m.poll("c", now).state is PollState.WAITING
    assert m.round_number == 1
    # Room again (b left): the members learn of c and the next round takes it.
    m.leave("b", 4.0)
    assert m.num_nodes_waiting(4.0, "a") == 1
    m.join("a", 4.0)
    assert m.poll("c", 4.0).state is PollState.ASSIGNED
    current = m.current_round
    assert current is not None
    assert set(current.members) == {"a", "c"}


def test_unit_multiple_below_min_keeps_waiting_with_reason() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=4, max_nodes=8, node_unit=4, last_call_s=0.0))
    _join_all(m, ["a", "b", "c", "d", "e"], 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    m2 = RendezvousManager(RendezvousConfig(min_nodes=4, max_nodes=6, node_unit=4, last_call_s=0.0))
    _join_all(m2, ["a", "b", "c"], 0.0)
    assert "3 of min 4" in m2.poll("a", 0.0).reason


def test_restarted_members_keep_their_ranks() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=3, max_nodes=3))
    _join_all(m, ["c", "a", "b"], 0.0)
    first = {n: m.poll(n, 0.0).rank for n in "abc"}
    assert first == {"c": 0, "a": 1, "b": 2}
    # Node b's processes restart: it joins again; the others see it waiting and follow.
    m.join("b", 1.0)
    assert m.num_nodes_waiting(1.0, "a") == 1
    m.join("a", 2.0)
    m.join("c", 3.0)
    second = {n: m.poll(n, 3.0) for n in "abc"}
    assert {n: p.rank for n, p in second.items()} == first
    assert {p.round for p in second.values()} == {2}


def test_replacement_takes_the_rank_its_predecessor_left() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=3, max_nodes=3, heartbeat_timeout_s=10))
    _join_all(m, ["a", "b", "c"], 0.0)
    assert m.poll("b", 0.0).rank == 1
    for node in "ac":
        m.heartbeat(node, 8.0)
    assert m.expire(12.0) == ["b"]
    assert m.current_round is None
    dissolved = m.poll("a", 12.0)
    assert dissolved.state is PollState.NOT_WAITING
    assert "round 1 dissolved" in dissolved.reason
    assert "'b' sent no heartbeat" in dissolved.reason
    assert m.num_nodes_waiting(12.0, "c") == 1
    _join_all(m, ["replacement", "c", "a"], 13.0)
    ranks = {n: m.poll(n, 13.0).rank for n in ["a", "c", "replacement"]}
    assert ranks == {"a": 0, "replacement": 1, "c": 2}


def test_shrinking_round_moves_high_ranks_into_gaps() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=4, last_call_s=1.0))
    _join_all(m, ["a", "b", "c", "d"], 0.0)
    m.leave("a", 1.0)
    _join_all(m, ["b", "c", "d"], 2.0)
    ranks = {n: m.poll(n, 3.0).rank for n in "bcd"}
    assert ranks == {"b": 1, "c": 2, "d": 0}


def test_topology_hook_orders_ranks_by_switch() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=4, max_nodes=4), topology=SwitchTopology())
    for node, switch in [("n1", "s2"), ("n2", "s1"), ("n3", "s2"), ("n4", "s1")]:
        m.join(node, 0.0, topology_key=switch)
    assert m.current_round is not None
    assert m.current_round.members == ("n2", "n4", "n1", "n3")


def test_parameter_disagreement_is_rejected_not_adopted() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=4))
    before = _snapshot(m)
    result = m.join("a", 0.0, params=NodeParams(min_nodes=2, max_nodes=3))
    assert not result.accepted
    assert "expects 2..3 nodes but this rendezvous runs 2..4" in result.reason
    assert _snapshot(m) == before
    assert m.join("a", 0.0, params=NodeParams(min_nodes=2, max_nodes=4)).accepted


def test_join_timeout_takes_node_off_the_list() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2, join_timeout_s=5.0, heartbeat_timeout_s=100))
    m.join("a", 0.0)
    assert m.poll("a", 4.9).state is PollState.WAITING
    result = m.poll("a", 5.0)
    assert result.state is PollState.TIMED_OUT
    assert "join_timeout_s is 5.0" in result.reason
    assert m.waiting == ()


def test_closed_rendezvous_refuses_joins_and_tells_waiters() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2))
    m.join("a", 0.0)
    m.close(1.0)
    assert m.poll("a", 1.0).state is PollState.CLOSED
    refused = m.join("b", 1.0)
    assert not refused.accepted
    assert "closed" in refused.reason


def test_bad_input_raises_and_changes_nothing() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2))
    _join_all(m, ["a", "b"], 0.0)
    before = _snapshot(m)
    with pytest.raises(UnknownNodeError, match="'ghost' cannot leave"):
        m.leave("ghost", 0.0)
    with pytest.raises(UnknownRoundError, match="round 7 is not the current round"):
        m.world(7)
    with pytest.raises(InvalidRequestError, match="node_id"):
        m.join("", 0.0)
    with pytest.raises(InvalidRequestError, match="at most 256"):
        m.poll("x" * 300, 0.0)
    assert _snapshot(m) == before
    assert m.world(1).members == ("a", "b")


def test_heartbeat_of_unknown_node_says_join_again() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=1))
    result = m.heartbeat("nobody", 0.0)
    assert not result.known
    assert "join again" in result.reason


def test_reconfigure_applies_to_next_round() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2))
    _join_all(m, ["a", "b"], 0.0)
    reason = m.reconfigure(RendezvousConfig(min_nodes=3, max_nodes=3), 1.0)
    assert "2..2 to 3..3" in reason
    assert m.current_round is not None
    assert m.current_round.world_size == 2
    _join_all(m, ["a", "b", "c"], 2.0)
    assert m.current_round.world_size == 3


def test_expiry_of_waiting_node_is_silent_for_others() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=3, max_nodes=3, heartbeat_timeout_s=5))
    m.join("a", 0.0)
    m.join("b", 3.0)
    assert m.poll("b", 6.0).reason == "1 of min 3 nodes joined; waiting for 2 more"
    assert m.waiting == ("b",)


def test_late_nodes_wait_for_the_members_and_never_break_a_running_round() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=2, last_call_s=1.0))
    _join_all(m, ["a", "b"], 0.0)
    m.join("c", 1.0)
    late = m.poll("c", 10.0)
    assert late.state is PollState.WAITING
    assert late.reason == "round 1 is in force with 2 nodes; 1 node(s) wait for room in a new round"
    assert m.poll("a", 10.0).state is PollState.ASSIGNED
    assert m.num_nodes_waiting(10.0, "a") == 0  # no room for c: the members train on
    # A member restarts (a crash of its own): rendezvous reopens. With c waiting, a's join reaches max_nodes and the
    # round completes at once; a keeps its rank and c takes the free one. b, late now, waits.
    m.join("a", 11.0)
    assert m.current_round is not None
    assert m.current_round.number == 2
    assert m.current_round.members == ("a", "c")
    assert m.poll("b", 11.0).state is PollState.NOT_WAITING
    m.join("b", 12.0)
    assert "round 2 is in force" in m.poll("b", 12.0).reason


def test_a_finished_member_keeps_the_round_while_its_peers_train_on() -> None:
    # Two nodes train; one's processes succeed and it goes silent. Past the heartbeat timeout
    # the round must stand: dissolving it would restart the peer instead of letting it finish.
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2, heartbeat_timeout_s=10.0, last_call_s=0.0))
    for node in ("a", "b"):
        m.join(node, 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    with pytest.raises(UnknownNodeError):
        m.finish("c", 1.0)  # not a member: refused, nothing changed
    assert "finished" in m.finish("a", 1.0)
    assert m.finished == {"a"}
    assert m.tracked == {"b"}
    assert m.poll("a", 2.0).state is PollState.ASSIGNED  # a late poll does not track it again
    assert m.heartbeat("a", 2.0).known  # still a member: not told to join again
    assert m.tracked == {"b"}
    for t in (8.0, 16.0, 24.0, 32.0):
        assert m.num_nodes_waiting(t, "b") == 0
        assert m.poll("b", t).state is PollState.ASSIGNED
    assert m.expire(40.0) == []  # b called at 32: not silent long enough either
    assert m.current_round is not None
    assert m.current_round.members == ("a", "b")
    # b going silent too still expires b, and the round dissolves as before.
    assert m.expire(50.0) == ["b"]
    assert m.current_round is None


def test_a_member_that_joined_again_and_then_finished_waits_for_nothing() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=2, heartbeat_timeout_s=10.0, last_call_s=1.0))
    m.join("a", 0.0)
    assert m.poll("a", 1.0).state is PollState.ASSIGNED  # after the last call
    m.join("a", 2.0)  # its processes restarted: it waits, and the round reopens
    assert m.waiting == ("a",)
    assert m.accepting
    m.finish("a", 2.5)
    assert m.waiting == ()
    assert m.tracked == frozenset()
    assert not m.accepting  # a late newcomer cannot form a round over the finished one
    m.join("b", 3.0)
    assert m.poll("b", 10.0).state is PollState.WAITING
    assert m.current_round is not None
    assert m.current_round.members == ("a",)
    m.join("a", 11.0)  # it calls again after all: no longer finished, tracked, and a round forms
    assert m.finished == frozenset()
    assert m.poll("a", 12.5).state is PollState.ASSIGNED
    assert m.tracked == {"a", "b"}


def test_finishing_in_a_round_that_expiry_ends_first_keeps_nothing() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2, heartbeat_timeout_s=10.0, last_call_s=0.0))
    for node in ("a", "b"):
        m.join(node, 0.0)
    assert m.poll("a", 0.0).state is PollState.ASSIGNED
    # b went silent: at 20 s the round dissolves before a's success is recorded.
    assert "ended before" in m.finish("a", 20.0)
    assert m.current_round is None
    assert m.finished == frozenset()


def test_members_asking_whether_nodes_wait_are_paced_like_the_waiting_nodes_polls() -> None:
    config = RendezvousConfig(
        min_nodes=2, max_nodes=100, poll_rate_per_s=20.0, min_poll_interval_s=0.05, max_poll_interval_s=2.0
    )
    m = RendezvousManager(config)
    for i in range(2):
        m.join(f"n{i}", 0.0)
    assert m.poll("n0", 5.0).state is PollState.ASSIGNED
    two = m.waiting_check(5.0, "n0")
    assert (two.num_nodes_waiting, two.retry_after_s) == (0, pytest.approx(2 / 20.0))
    for i in range(2, 30):
        m.join(f"n{i}", 6.0)
    # Thirty nodes known (two members, twenty-eight waiting): each asks every 1.5 s.
    thirty = m.waiting_check(6.0, "n1")
    assert (thirty.num_nodes_waiting, thirty.retry_after_s) == (28, pytest.approx(30 / 20.0))
    assert m.num_nodes_waiting(6.0, "n1") == 28
    for i in range(30, 100):
        m.join(f"n{i}", 6.0)
    assert m.waiting_check(6.0, "n0").retry_after_s == 2.0  # capped at max_poll_interval_s
    lone = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=1))
    assert lone.waiting_check(0.0).retry_after_s == lone.config.min_poll_interval_s


def test_waiting_nodes_are_told_when_to_poll_next_so_together_they_poll_at_the_configured_rate() -> None:
    config = RendezvousConfig(
        min_nodes=100, max_nodes=100, poll_rate_per_s=20.0, min_poll_interval_s=0.05, max_poll_interval_s=2.0
    )
    m = RendezvousManager(config)
    m.join("n0", 0.0)
    assert m.poll("n0", 0.0).retry_after_s == 0.05  # one waiting: as soon as the floor allows
    for i in range(1, 10):
        m.join(f"n{i}", 0.0)
    assert m.poll("n0", 0.0).retry_after_s == pytest.approx(10 / 20.0)  # ten at 20 polls a second
    for i in range(10, 60):
        m.join(f"n{i}", 0.0)
    assert m.poll("n0", 0.0).retry_after_s == 2.0  # capped
    lone = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2, heartbeat_timeout_s=1000.0))
    lone.join("x", 0.0)
    assert lone.poll("x", 10.0).retry_after_s == pytest.approx(0.5)  # a long wait: a twentieth of it
    assert lone.poll("x", 400.0).retry_after_s == 5.0  # max_poll_interval_s
    # Polls keep a waiting node alive: never more than a third of the heartbeat timeout apart.
    short = RendezvousManager(
        RendezvousConfig(min_nodes=100, max_nodes=100, heartbeat_timeout_s=0.3, poll_rate_per_s=1.0)
    )
    for i in range(60):
        short.join(f"n{i}", 0.0)
    assert short.poll("n0", 0.0).retry_after_s == pytest.approx(0.1)
    # An assigned node polls no more: its answer asks for nothing.
    small = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=1))
    small.join("a", 0.0)
    assigned = small.poll("a", 0.0)
    assert assigned.state is PollState.ASSIGNED
    assert assigned.retry_after_s == 0.0


def test_a_planned_round_waits_for_a_slow_node_past_the_last_call_and_forms_when_it_joins() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=3, last_call_s=2.0, planned_wait_s=30.0))
    _join_all(m, ["a", "b", "c"], 0.0)
    assert m.current_round is not None
    assert m.current_round.number == 1
    # A resize lets c go: the master plans a and b's round, then c leaves (the round dissolves).
    assert m.expect_round(["a", "b"], 1.0) == "next round planned for a, b; it waits up to 30 s for each of them"
    m.leave("c", 1.0)
    assert m.planned == {"a", "b"}
    assert m.join("a", 2.0).accepted
    # Far past the last call, the round still waits for b rather than form without it.
    poll = m.poll("a", 20.0)
    assert poll.state is PollState.WAITING
    assert "waiting up to 11.0 s for 1 more node(s) of the planned round" in m.status(20.0).reason
    assert m.join("b", 20.5).accepted
    assert m.current_round is not None
    assert m.current_round.members == ("a", "b")
    assert m.current_round.reason == "2 nodes joined, every node of the planned round among them; round takes 2"
    assert m.planned == frozenset()


def test_a_planned_round_closes_by_the_last_call_once_it_waited_its_time() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=3, last_call_s=2.0, planned_wait_s=10.0))
    m.expect_round(["a", "b"], 0.0)
    assert m.join("a", 1.0).accepted
    assert m.poll("a", 9.9).state is PollState.WAITING
    assert m.poll("a", 10.0).state is PollState.ASSIGNED
    assert m.current_round is not None
    assert m.current_round.members == ("a",)
    assert m.planned == frozenset()


def test_a_planned_node_that_expires_is_no_longer_waited_for() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=3, heartbeat_timeout_s=5.0, planned_wait_s=60.0))
    _join_all(m, ["a", "b", "c"], 0.0)
    assert m.current_round is not None
    m.expect_round(["a", "b", "c"], 0.0)
    assert m.join("a", 1.0).accepted
    assert m.join("b", 1.0).accepted
    assert m.poll("a", 2.0).state is PollState.WAITING
    # c is silent (its machine is gone): it expires, and a and b's round forms without it.
    assert m.poll("a", 5.0).state is PollState.WAITING
    assert m.poll("a", 5.5).state is PollState.ASSIGNED
    assert m.current_round is not None
    assert m.current_round.members == ("a", "b")


def test_a_node_that_expired_before_the_plan_is_not_waited_for() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=3, heartbeat_timeout_s=5.0, planned_wait_s=60.0))
    _join_all(m, ["a", "b", "c"], 0.0)
    m.heartbeat("a", 5.0)
    m.heartbeat("b", 5.0)
    # c has been silent past the timeout: planning expires it first, and the plan leaves it out.
    m.expect_round(["a", "b", "c"], 6.0)
    assert m.planned == {"a", "b"}
    assert m.expect_round(["c"], 6.0) == "no round planned: c expired and did not call since"
    assert m.planned == frozenset()
    m.expect_round(["a", "b", "c"], 6.0)
    assert m.join("a", 6.0).accepted
    assert m.join("b", 6.0).accepted
    current = m.current_round
    assert current is not None
    assert current.members == ("a", "b")


def test_a_planned_node_the_master_takes_out_is_no_longer_waited_for() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=3, last_call_s=0.5, planned_wait_s=60.0))
    _join_all(m, ["a", "b", "c"], 0.0)
    assert m.current_round is not None
    m.expect_round(["a", "b"], 0.0)
    m.leave("c", 0.0)  # the round dissolves: a and b are no longer tracked until they join
    assert m.join("a", 1.0).accepted
    assert m.poll("a", 2.0).state is PollState.WAITING
    # b's agent failed instead of joining: the master takes it out, though the rendezvous holds it nowhere.
    assert m.leave("b", 3.0) == "node 'b' left; the planned round no longer waits for it"
    assert m.current_round is not None
    assert m.current_round.members == ("a",)
    with pytest.raises(UnknownNodeError):
        m.leave("b", 3.0)


def test_a_planned_spare_is_waited_for_until_it_is_given_a_rank() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=4, last_call_s=1.0))
    m.set_spares(["s"], 0.0)
    _join_all(m, ["a", "s"], 0.0)
    m.expect_round(["a", "s"], 0.0)
    assert m.poll("a", 5.0).state is PollState.WAITING  # s still waits as a spare
    m.set_spares([], 5.0)
    assert m.current_round is not None
    assert set(m.current_round.members) == {"a", "s"}


def test_expect_round_refuses_a_bad_node_id_and_changes_nothing() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=1, max_nodes=2))
    m.expect_round(["a"], 0.0)
    with pytest.raises(InvalidRequestError):
        m.expect_round(["b", ""], 0.0)
    assert m.planned == {"a"}
    assert m.expect_round([], 0.0) == "no round planned"
    assert m.planned == frozenset()


def test_a_member_is_left_behind_once_a_peer_leaves_restarts_or_joins_again_until_it_joins_itself() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=3, max_nodes=3))
    _join_all(m, ["a", "b", "c"], 0.0)
    assert m.round_number == 1
    assert [m.left_behind(n) for n in "abc"] == [None, None, None]
    # b's processes are being restarted: a's and c's workers lose their peer; b's own failure is its own.
    m.processes_restarting("b", "its worker failed")
    assert m.left_behind("a") == "round 1: the processes of node 'b' restart (its worker failed)"
    assert m.left_behind("b") is None
    m.processes_restarting("z", "not a member")  # ignored
    m.join("a", 1.0)  # a's workers restarted: they are no longer in the old round
    assert m.left_behind("a") is None
    assert m.left_behind("c") is not None
    # The next round forms: nobody is left behind.
    m.join("b", 1.0)
    m.join("c", 1.0)
    m.poll("a", 1.0)
    assert m.round_number == 2
    assert [m.left_behind(n) for n in "abc"] == [None, None, None]
    # A member that merely joins again (after a collective error a peer may have caused) excuses nobody.
    m.join("c", 2.0)
    assert m.left_behind("a") is None
    # A member that leaves dissolves the round: the others are told why until they join again.
    m.join("a", 2.0)
    m.join("b", 2.0)
    assert m.round_number == 3
    m.leave("c", 3.0)
    assert m.left_behind("a") == "round 3 dissolved: node 'c' left"
    assert m.left_behind("c") is None
    m.join("a", 4.0)
    assert m.left_behind("a") is None


def test_a_member_dropped_for_its_own_silence_is_not_left_behind_but_its_peers_are() -> None:
    m = RendezvousManager(RendezvousConfig(min_nodes=2, max_nodes=2, heartbeat_timeout_s=10.0))
    _join_all(m, ["a", "b"], 0.0)
    m.heartbeat("a", 8.0)
    m.heartbeat("a", 12.0)  # b has been silent for 12 s: it expires, and its round dissolves
    assert m.left_behind("b") is None
    assert m.left_behind("a") == "round 1 dissolved: node 'b' sent no heartbeat for 12.0 s (limit 10.0 s)"
    with pytest.raises(InvalidRequestError):
        m.left_behind("")
    with pytest.raises(InvalidRequestError):
        m.processes_restarting("", "why")
