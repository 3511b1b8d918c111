from __future__ import annotations

import re

import grpc
import pytest

from dlrover.common import GrpcServer, ManualClock, RpcError, create_channel, generate_token
from dlrover.rendezvous import NodeParams, PollState, RendezvousClient, RendezvousServicer, WaitingCount

pytestmark = pytest.mark.integration

Served = tuple[RendezvousServicer, GrpcServer]


def _state(servicer: RendezvousServicer) -> tuple[object, ...]:
    with servicer.lock:
        m = servicer.manager
        return (m.waiting, m.tracked, m.current_round, m.round_number, m.closed)


def test_round_forms_over_grpc_and_reports_reasons(client: RendezvousClient, clock: ManualClock) -> None:
    assert client.join("a", params=NodeParams(2, 3)).accepted
    waiting = client.poll("a")
    assert waiting.state is PollState.WAITING
    assert waiting.reason == "1 of min 2 nodes joined; waiting for 1 more"
    assert waiting.retry_after_s == 0.05  # the service paces the polls (RendezvousConfig.poll_rate_per_s)
    assert client.waiting_check().rounds_formed == 0, "the first round is still forming"
    client.join("b")
    assert "last call in 5.0 s" in client.status().reason
    clock.advance(5.0)
    a, b = client.poll("a"), client.poll("b")
    assert (a.state, a.rank, a.world_size, a.round) == (PollState.ASSIGNED, 0, 2, 1)
    assert (b.rank, b.round) == (1, 1)
    assert client.world(1) == ("a", "b")
    assert client.heartbeat("a").known
    client.join("c")
    assert client.num_nodes_waiting("a") == 1
    # The members' checks are paced too: three nodes known ask together at poll_rate_per_s.
    assert client.waiting_check("a") == WaitingCount(1, 0.05, rounds_formed=1)
    status = client.status()
    assert (status.round, status.num_nodes_waiting, status.min_nodes, status.max_nodes) == (1, 1, 2, 3)


def test_the_worker_layout_of_uneven_nodes_goes_over_grpc(client: RendezvousClient) -> None:
    for node, size in (("a", 3), ("b", 1), ("c", 2)):
        client.join(node, local_world_size=size)
    c = client.wait_assigned("c", timeout_s=5.0)
    assert (c.rank, c.first_worker_rank, c.worker_world_size) == (2, 4, 6)
    with pytest.raises(RpcError, match="local_world_size") as info:
        client.join("d", local_world_size=-2)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_wait_assigned_returns_when_the_round_forms(client: RendezvousClient) -> None:
    for node in "abc":
        client.join(node)
    result = client.wait_assigned("c", timeout_s=5.0)
    assert (result.state, result.rank, result.world_size) == (PollState.ASSIGNED, 2, 3)


def test_parameter_disagreement_is_an_answer_not_an_error(
    client: RendezvousClient, servicer_and_server: Served
) -> None:
    before = _state(servicer_and_server[0])
    result = client.join("a", params=NodeParams(2, 8))
    assert not result.accepted
    assert "expects 2..8 nodes but this rendezvous runs 2..3" in result.reason
    assert _state(servicer_and_server[0]) == before


@pytest.mark.parametrize(
    ("call", "code", "match"),
    [
        (lambda c: c.join(""), grpc.StatusCode.INVALID_ARGUMENT, "node_id must be a non-empty string"),
        (lambda c: c.poll("x" * 300), grpc.StatusCode.INVALID_ARGUMENT, "at most 256"),
        (lambda c: c.leave("ghost"), grpc.StatusCode.FAILED_PRECONDITION, "'ghost' cannot leave"),
        (lambda c: c.world(42), grpc.StatusCode.NOT_FOUND, "round 42 is not the current round"),
        (lambda c: c.kv_set(["k"], [b"x" * 2000]), grpc.StatusCode.INVALID_ARGUMENT, "max_value_bytes=1024"),
        (lambda c: c.kv_add("", 1), grpc.StatusCode.INVALID_ARGUMENT, "non-empty string"),
        (lambda c: c.announce_restart("a", 0), grpc.StatusCode.INVALID_ARGUMENT, "nodes_waiting must be at least 1"),
        (lambda c: c.announce_restart("", 1), grpc.StatusCode.INVALID_ARGUMENT, "non-empty string"),
    ],
)
def test_bad_input_gets_a_clear_status_and_changes_nothing(
    client: RendezvousClient, servicer_and_server: Served, call: object, code: grpc.StatusCode, match: str
) -> None:
    client.join("a")
    before = _state(servicer_and_server[0])
    keys_before = client.kv_num_keys()
    with pytest.raises(RpcError, match=match) as info:
        call(client)  # type: ignore[operator]
    assert info.value.code == code
    assert info.value.attempts == 1
    assert _state(servicer_and_server[0]) == before
    assert client.kv_num_keys() == keys_before


def test_negative_and_inverted_sizes_are_refused(servicer_and_server: Served, token: str) -> None:
    from dlrover.rendezvous.v1 import rendezvous_pb2, rendezvous_pb2_grpc

    before = _state(servicer_and_server[0])
    with create_channel(servicer_and_server[1].address, token) as channel:
        stub = rendezvous_pb2_grpc.RendezvousServiceStub(channel)
        for lo, hi, match in [(-1, 3, "min_nodes must be an integer >= 1, got -1"), (3, 2, r"min_nodes \(3\)")]:
            with pytest.raises(grpc.RpcError) as info:
                stub.Join(rendezvous_pb2.JoinRequest(node_id="a", min_nodes=lo, max_nodes=hi), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert re.search(match, info.value.details())
    assert _state(servicer_and_server[0]) == before


def test_unauthenticated_calls_are_refused(servicer_and_server: Served) -> None:
    before = _state(servicer_and_server[0])
    with RendezvousClient(servicer_and_server[1].address, generate_token()) as intruder:
        with pytest.raises(RpcError) as info:
            intruder.join("a")
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(RpcError):
            intruder.kv_set(["k"], [b"v"])
    assert _state(servicer_and_server[0]) == before


def test_kv_calls_round_trip(client: RendezvousClient) -> None:
    client.kv_set(["a", "b"], [b"1", b"2"])
    assert client.kv_get(["a", "b", "z"]) == [b"1", b"2", None]
    assert client.kv_add("n", 5) == 5
    assert client.kv_compare_set("a", b"1", b"x") == b"x"
    assert client.kv_check(["a", "n"])
    assert not client.kv_check(["a", "z"])
    assert client.kv_delete("a")
    assert client.kv_num_keys() == 2


def test_a_member_that_restarts_for_waiting_nodes_leaves_its_peers_behind_until_they_join(
    client: RendezvousClient, servicer_and_server: Served, clock: ManualClock
) -> None:
    for node in "ab":
        client.join(node)
    clock.advance(5.0)  # the last call ends: round 1 of a and b
    assert client.poll("a").state is PollState.ASSIGNED
    client.join("c")  # a third node waits to join
    assert not client.announce_restart("c", 1)  # not a member of the round in force: nothing recorded
    assert not client.announce_restart("a", 1, round_number=2)  # a round that is not in force: ignored
    assert servicer_and_server[0].manager.left_behind("b") is None
    assert client.announce_restart("a", 1, round_number=1)
    assert client.announce_restart("a", 1)  # again (0: the round in force): the same
    manager = servicer_and_server[0].manager
    with servicer_and_server[0].lock:
        assert manager.left_behind("b") == (
            "round 1: the processes of node 'a' restart (its workers stop for a new round: 1 node(s) wait to join)"
        )
        assert manager.left_behind("a") is None


def test_leave_dissolves_the_round_and_close_stops_joins(client: RendezvousClient) -> None:
    for node in "abc":
        client.join(node)
    assert "round 1 dissolved" in client.leave("b")
    assert client.poll("a").state is PollState.NOT_WAITING
    assert client.num_nodes_waiting("a") == 1
    client.close_rendezvous()
    assert client.status().closed
    assert not client.join("d").accepted


def test_the_status_counts_the_nodes_waiting_for_a_round_not_the_spares(
    client: RendezvousClient, servicer_and_server: Served, clock: ManualClock
) -> None:
    servicer = servicer_and_server[0]
    with servicer.lock:
        servicer.manager.set_spares(["s"], clock.now())
    for node in ("a", "b", "s"):
        assert client.join(node).accepted
    clock.advance(5.0)  # the last call ends: round 1 of a and b; the spare waits outside it
    assert client.poll("a").state is PollState.ASSIGNED
    assert client.poll("s").spare
    assert client.status().num_nodes_waiting == 0
    assert client.num_nodes_waiting("a") == 0
    client.join("c")  # a node that would grow the round
    assert client.status().num_nodes_waiting == 1
    assert client.num_nodes_waiting("a") == 1
