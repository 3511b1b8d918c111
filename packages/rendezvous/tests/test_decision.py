from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.rendezvous import (
    NodeInfo,
    RendezvousConfig,
    RoundDecision,
    assign_ranks,
    decide_round,
    largest_world_size,
    select_members,
    worker_ranks,
)


def test_largest_world_size() -> None:
    assert largest_world_size(7, 8, 2) == 6
    assert largest_world_size(9, 8, 3) == 6
    assert largest_world_size(0, 8, 1) == 0


def test_decisions_and_their_reasons() -> None:
    cfg = RendezvousConfig(min_nodes=4, max_nodes=8, node_unit=4, last_call_s=10.0)
    assert decide_round(cfg, 0, None, 0.0) == RoundDecision(False, 0, "no nodes waiting (min 4, max 8)")
    assert decide_round(cfg, 3, 0.0, 0.0).reason == "3 of min 4 nodes joined; waiting for 1 more"
    assert decide_round(cfg, 5, 0.0, 2.5).reason == "5 nodes joined (min 4, max 8); last call in 7.5 s for more to join"
    assert decide_round(cfg, 5, 0.0, 10.0) == RoundDecision(
        True, 4, "5 nodes joined (min 4, max 8) and last call passed; round takes 4"
    )
    assert decide_round(cfg, 9, 0.0, 0.0) == RoundDecision(True, 8, "9 nodes joined, max 8 reached; round takes 8")


def test_a_planned_round_forms_once_its_nodes_joined_and_waits_for_them_until_its_deadline() -> None:
    cfg = RendezvousConfig(min_nodes=1, max_nodes=8, last_call_s=2.0)
    # Every planned node joined: no last call.
    assert decide_round(cfg, 3, 0.0, 0.0, awaited=0, planned_until=30.0) == RoundDecision(
        True, 3, "3 nodes joined, every node of the planned round among them; round takes 3"
    )
    # One is missing: the last call does not close it before the deadline...
    waiting = decide_round(cfg, 2, 0.0, 5.0, awaited=1, planned_until=30.0)
    assert not waiting.complete
    assert waiting.reason == (
        "2 nodes joined (min 1, max 8); waiting up to 25.0 s for 1 more node(s) of the planned round"
    )
    # ...and does after it.
    assert decide_round(cfg, 2, 0.0, 30.0, awaited=1, planned_until=30.0) == decide_round(cfg, 2, 0.0, 30.0)
    # Fewer than min_nodes or max_nodes: planning changes nothing.
    strict = RendezvousConfig(min_nodes=3, max_nodes=4)
    assert not decide_round(strict, 2, 0.0, 0.0, awaited=0, planned_until=30.0).complete
    assert decide_round(strict, 4, 0.0, 0.0, awaited=2, planned_until=30.0).complete


def test_members_of_the_last_round_are_selected_first() -> None:
    selected, rest = select_members(["new1", "old2", "new2", "old0"], {"old0": 0, "old2": 2}, 3)
    assert selected == ["old0", "old2", "new1"]
    assert rest == ["new2"]


@given(
    size=st.integers(1, 12),
    previous=st.dictionaries(st.sampled_from([f"n{i}" for i in range(16)]), st.integers(0, 15)),
    data=st.data(),
)
def test_stable_ranks_are_contiguous_and_keep_what_fits(
    size: int, previous: dict[str, int], data: st.DataObject
) -> None:
    # Previous ranks are unique, as they come from one round.
    seen: set[int] = set()
    prev: dict[str, int] = {}
    for node, rank in previous.items():
        if rank not in seen:
            seen.add(rank)
            prev[node] = rank
    members = data.draw(
        st.lists(st.sampled_from([f"n{i}" for i in range(16)]), min_size=size, max_size=size, unique=True)
    )
    ranks = assign_ranks([NodeInfo(n, previous_rank=prev.get(n)) for n in members])
    assert sorted(ranks) == sorted(members)
    for rank, node in enumerate(ranks):
        if node in prev and prev[node] < size:
            assert prev[node] == rank


def test_worker_ranks_follow_the_nodes_ranked_before_as_under_torchrun() -> None:
    # Node ranks 0, 1, 2 run 4, 2 and 8 workers: RANK starts at 0, 4 and 6; WORLD_SIZE is 14.
    layout = worker_ranks([4, 2, 8])
    assert layout is not None
    assert (layout.first, layout.world_size) == ((0, 4, 6), 14)
    even = worker_ranks([2, 2])
    assert even is not None
    assert (even.first, even.world_size) == ((0, 2), 4)


def test_worker_ranks_are_unknown_when_a_node_did_not_say_and_negative_sizes_are_refused() -> None:
    assert worker_ranks([2, 0, 2]) is None
    assert worker_ranks([]) is None
    with pytest.raises(ValueError, match="node rank 1 is negative: -1"):
        worker_ranks([2, -1])


@given(st.lists(st.integers(1, 16), min_size=1, max_size=50))
def test_worker_ranks_are_unique_and_contiguous_from_zero(sizes: list[int]) -> None:
    layout = worker_ranks(sizes)
    assert layout is not None
    ranks = [layout.first[node] + local for node, size in enumerate(sizes) for local in range(size)]
    assert ranks == list(range(layout.world_size))
    assert layout.world_size == sum(sizes)
