from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError
from dlrover.rendezvous import (
    CheckVerdict,
    InvalidRequestError,
    NodeCheckConfig,
    Pair,
    ProbeResult,
    judge,
    plan_round_one,
    plan_round_two,
)

Probe = Callable[[Pair], ProbeResult]


def _run(pairs: list[Pair], probe: Probe) -> list[ProbeResult]:
    return [probe(p) for p in pairs]


def _check(nodes: list[str], probe: Probe, factor: float = 2.0) -> tuple[list[Pair], list[Pair], CheckVerdict]:
    one = plan_round_one(nodes)
    first = _run(one, probe)
    two = plan_round_two(nodes, first)
    second = _run(two, probe)
    return one, two, judge(nodes, first + second, NodeCheckConfig(straggler_factor=factor))


def _names(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


def test_round_one_pairs_neighbours_and_the_odd_node_with_the_first() -> None:
    assert plan_round_one(["a", "b", "c", "d"]) == [("a", "b"), ("c", "d")]
    assert plan_round_one(["a", "b", "c"]) == [("a", "b"), ("a", "c")]


def test_round_two_pairs_fastest_with_slowest() -> None:
    nodes = ["a", "b", "c", "d"]
    first = [ProbeResult(("a", "b"), True, 1.0), ProbeResult(("c", "d"), True, 3.0)]
    assert plan_round_two(nodes, first) == [("a", "d"), ("b", "c")]


def test_faulty_node_found_and_reason_names_its_partners() -> None:
    verdict = judge(
        ["a", "b", "c", "d"],
        [
            ProbeResult(("a", "b"), False),
            ProbeResult(("c", "d"), True, 1.0),
            ProbeResult(("c", "b"), True, 1.0),
            ProbeResult(("d", "a"), False),
        ],
    )
    assert verdict.faulty == ("a",)
    assert verdict.reasons["a"] == "failed with every partner (b, d)"
    assert verdict.stragglers == ()


def test_straggler_reason_names_the_median() -> None:
    results = [ProbeResult(("a", "b"), True, 1.0), ProbeResult(("c", "d"), True, 1.0), ProbeResult(("a", "d"), True, 5)]
    verdict = judge(["a", "b", "c", "d", "e"], results, NodeCheckConfig(straggler_factor=1.5))
    assert verdict.stragglers == ()
    assert verdict.unchecked == ("e",)
    assert "no probe result" in verdict.reasons["e"]
    slow = judge(["a", "b", "c"], [ProbeResult(("a", "b"), True, 1.0), ProbeResult(("c", "a"), True, 9.0)])
    assert slow.stragglers == ("c",)
    assert slow.reasons["c"] == "best probe 9.000 s is more than 2.0 x the median 1.000 s"


def test_bad_input_is_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="at least 2 nodes, got 1"):
        plan_round_one(["a"])
    with pytest.raises(InvalidRequestError, match=r"duplicates \['a'\]"):
        plan_round_one(["a", "a", "b"])
    with pytest.raises(InvalidRequestError, match="outside the check"):
        plan_round_two(["a", "b"], [ProbeResult(("a", "z"), True, 1.0)])
    with pytest.raises(InvalidRequestError, match="elapsed_s"):
        judge(["a", "b"], [ProbeResult(("a", "b"), True, float("nan"))])
    with pytest.raises(ConfigError, match="straggler_factor"):
        NodeCheckConfig(straggler_factor=0.5)


@given(
    n=st.integers(2, 40),
    outcomes=st.lists(st.tuples(st.booleans(), st.floats(0.0, 10.0)), min_size=40, max_size=40),
)
def test_every_node_is_paired_in_every_round(n: int, outcomes: list[tuple[bool, float]]) -> None:
    nodes = _names(n)
    one = plan_round_one(nodes)
    first = [ProbeResult(p, *outcomes[i % len(outcomes)]) for i, p in enumerate(one)]
    two = plan_round_two(nodes, first)
    for plan in (one, two):
        assert {node for pair in plan for node in pair} == set(nodes)
        assert all(a != b for a, b in plan)
        assert len(plan) == (n + 1) // 2


@given(n=st.integers(4, 40), data=st.data())
def test_a_single_faulty_node_is_always_identified(n: int, data: st.DataObject) -> None:
    nodes = _names(n)
    faulty = data.draw(st.sampled_from(nodes))
    speed = {node: data.draw(st.floats(1.0, 2.0)) for node in nodes}

    def probe(pair: Pair) -> ProbeResult:
        return ProbeResult(pair, faulty not in pair, max(speed[pair[0]], speed[pair[1]]))

    _, _, verdict = _check(nodes, probe)
    assert verdict.faulty == (faulty,)


@given(n=st.integers(3, 40), data=st.data())
def test_a_single_slow_node_is_always_the_straggler(n: int, data: st.DataObject) -> None:
    nodes = _names(n)
    slow = data.draw(st.sampled_from(nodes))
    speed = {node: data.draw(st.floats(1.0, 1.5)) for node in nodes}
    speed[slow] = data.draw(st.floats(3.1, 100.0))

    def probe(pair: Pair) -> ProbeResult:
        return ProbeResult(pair, True, max(speed[pair[0]], speed[pair[1]]))

    _, _, verdict = _check(nodes, probe)
    assert verdict.stragglers == (slow,)
    assert verdict.faulty == ()
