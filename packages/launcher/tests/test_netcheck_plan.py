"""The network check's pure decisions: plans, pair outcomes, verdicts and what each node does."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.launcher.decisions import StepKind
from dlrover.launcher.netcheck_plan import (
    CheckAction,
    CheckOutcome,
    PairOutcome,
    SideResult,
    after_check_report,
    check_nodes,
    check_round,
    check_step,
    combine,
    decide,
    decide_single,
    describe_pairs,
    needs_second_round,
    pairs_of,
    plan_second_phase,
    round_keys_prefix,
    settings_key,
    side_key,
    solo_key,
    store_key,
    with_solos,
)
from dlrover.rendezvous import CheckVerdict, Pair

OK = SideResult(True, 0.01)


def _verdict(
    faulty: Sequence[str] = (), stragglers: Sequence[str] = (), nodes: Sequence[str] = ("0", "1", "2")
) -> CheckVerdict:
    reasons = {n: "failed with every partner (x)" for n in faulty}
    reasons.update({n: "best probe 9 s is more than 2.0 x the median 0.01 s" for n in stragglers})
    best = {n: 0.01 for n in nodes if n not in faulty}
    return CheckVerdict(tuple(faulty), tuple(stragglers), best, reasons, ())


def test_keys_are_namespaced_by_round_phase_pair_and_node() -> None:
    keys = {side_key(r, phase, i, n) for r in (1, 2) for phase in (1, 2) for i in (0, 1) for n in ("0", "1")} | {
        store_key(r, phase, i) for r in (1, 2) for phase in (1, 2) for i in (0, 1)
    }
    assert len(keys) == 2 * 2 * 2 * 2 + 2 * 2 * 2
    assert all(k.startswith("dlrover/launcher/round/") for k in keys)
    assert side_key(7, 1, 0, "3").startswith("dlrover/launcher/round/7/netcheck/1/")


def test_nodes_are_the_round_ranks_and_pairs_run_in_plan_order() -> None:
    assert check_nodes(3) == ["0", "1", "2"]
    with pytest.raises(ValueError, match="world size 0"):
        check_nodes(0)
    plan: list[Pair] = [("0", "1"), ("2", "3"), ("0", "4")]
    assert pairs_of(plan, "0") == [(0, ("0", "1")), (2, ("0", "4"))]
    assert pairs_of(plan, "3") == [(1, ("2", "3"))]
    assert pairs_of(plan, "9") == []


@pytest.mark.parametrize("side", [SideResult(True, 0.25), SideResult(False, 0.0, "timed out"), SideResult(True, 0)])
def test_a_side_survives_the_store(side: SideResult) -> None:
    assert SideResult.decode(side.encode()) == side


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"ok": true}',
        b'{"ok": "yes", "elapsed_s": 1, "error": ""}',
        b'{"ok": true, "elapsed_s": -1, "error": ""}',
        b'{"ok": true, "elapsed_s": NaN, "error": ""}',
        b'{"ok": true, "elapsed_s": "1", "error": ""}',
        b'{"ok": true, "elapsed_s": 1, "error": 5}',
        b'{"ok": true, "elapsed_s": 1, "error": "", "extra": 1}',
    ],
)
def test_a_corrupt_side_counts_as_failed_and_quotes_the_value(raw: bytes) -> None:
    side = SideResult.decode(raw)
    assert not side.ok
    assert "unreadable probe result" in side.error
    assert repr(raw[:10])[2:-1][:5] in side.error


@pytest.mark.parametrize(("ok", "elapsed"), [("yes", 1.0), (True, -1.0), (True, math.nan), (True, math.inf)])
def test_bad_sides_are_refused(ok: object, elapsed: float) -> None:
    with pytest.raises(ValueError, match="SideResult"):
        SideResult(ok, elapsed)


def test_a_pair_passes_only_when_both_sides_pass_and_takes_its_slower_sides_time() -> None:
    both = PairOutcome(1, ("0", "1"), (SideResult(True, 0.2), SideResult(True, 0.5)))
    assert both.ok
    assert both.elapsed_s == 0.5
    assert both.as_probe().pair == ("0", "1")
    one = PairOutcome(1, ("0", "1"), (SideResult(True, 0.2), SideResult(False, 0.0, "boom")))
    assert not one.ok
    assert one.elapsed_s == 0.0
    assert not one.as_probe().ok
    text = describe_pairs([both, one])
    assert "round 1 pair 0-1: ok in 0.5000 s" in text
    assert "node 1: boom" in text
    assert "node 0: ok in 0.2000 s" in text


def test_combine_needs_every_side() -> None:
    plan: list[Pair] = [("0", "1")]
    assert combine(1, plan, {(0, "0"): OK, (0, "1"): OK})[0].ok
    with pytest.raises(KeyError, match="no side for node 1"):
        combine(1, plan, {(0, "0"): OK})


def test_a_second_round_only_when_round_one_found_a_suspect() -> None:
    assert not needs_second_round(_verdict())
    assert needs_second_round(_verdict(faulty=["2"]))
    assert needs_second_round(_verdict(stragglers=["1"]))


@pytest.mark.parametrize(
    ("me", "faulty", "stragglers", "exclude", "action"),
    [
        ("0", [], [], False, CheckAction.TRAIN),
        ("2", ["2"], [], False, CheckAction.EXCLUDE_SELF),
        ("0", ["2"], [], False, CheckAction.NEW_ROUND),
        ("2", [], ["2"], False, CheckAction.TRAIN),
        ("0", [], ["2"], False, CheckAction.TRAIN),
        ("2", [], ["2"], True, CheckAction.EXCLUDE_SELF),
        ("0", [], ["2"], True, CheckAction.NEW_ROUND),
        ("1", ["2"], ["0"], True, CheckAction.NEW_ROUND),
    ],
)
def test_what_each_node_does(
    me: str, faulty: list[str], stragglers: list[str], exclude: bool, action: CheckAction
) -> None:
    pairs = [PairOutcome(1, ("0", "1"), (OK, OK))]
    outcome = decide(me, 4, _verdict(faulty, stragglers), pairs, exclude_stragglers=exclude)
    assert outcome.action is action
    assert "round 4" in outcome.reason
    if action is CheckAction.EXCLUDE_SELF:
        # The evidence carries the verdict and every probe, for the master and for a person.
        assert outcome.reason in outcome.evidence
        assert "round 1 pair 0-1: ok" in outcome.evidence
    if stragglers and not exclude:
        assert "straggler(s) kept" in outcome.reason
        assert "node rank 2" in outcome.reason


def test_a_single_node_trains_when_its_probe_passes_and_leaves_when_it_fails() -> None:
    assert decide_single(3, SideResult(True, 0.1)).action is CheckAction.TRAIN
    failed = decide_single(3, SideResult(False, 0.0, "the probe process exited with code 1"))
    assert failed.action is CheckAction.EXCLUDE_SELF
    assert "exited with code 1" in failed.evidence


def test_the_agents_steps_after_the_check() -> None:
    assert check_step(CheckOutcome(CheckAction.TRAIN, "fine")) is None
    new_round = check_step(CheckOutcome(CheckAction.NEW_ROUND, "node 2 left"))
    assert new_round is not None
    assert new_round.kind is StepKind.RESTART
    assert not new_round.counts_as_restart
    leave = check_step(CheckOutcome(CheckAction.EXCLUDE_SELF, "faulty"))
    assert leave is not None
    assert leave.kind is StepKind.REPORT_FAILURE


@pytest.mark.parametrize("decision", list(ActionKind))
def test_a_node_left_out_exits_whatever_the_master_answers(decision: ActionKind) -> None:
    outcome = CheckOutcome(CheckAction.EXCLUDE_SELF, "node rank 2 is faulty")
    step = after_check_report(outcome, Decision(decision, FailureKind.COMMUNICATION, "2", "because"))
    assert (step.kind, step.exit_code) == (StepKind.EXIT, 1)
    assert decision.value in step.reason
    lost = after_check_report(outcome, None, "unreachable")
    assert (lost.kind, lost.exit_code) == (StepKind.EXIT, 1)
    assert "unreachable" in lost.reason


# -- the whole check against a model of the nodes -------------------------------------------------


Probe = Callable[[int, Sequence[Pair]], list[PairOutcome]]
Solo = Callable[[int, Sequence[str]], dict[str, SideResult]]


def _model(
    health: Mapping[str, float | None], broken_links: Sequence[Pair] = ()
) -> tuple[list[int], Probe, list[tuple[int, tuple[str, ...]]], Solo]:
    """Probes over a model: None is a dead node (every probe with it, and alone, fails), else its
    time; a pair in `broken_links` fails though both of its nodes are healthy."""
    phases: list[int] = []
    solo_calls: list[tuple[int, tuple[str, ...]]] = []
    broken = {frozenset(p) for p in broken_links}

    def probe(phase: int, pairs: Sequence[Pair]) -> list[PairOutcome]:
        phases.append(phase)
        outcomes = []
        for a, b in pairs:
            down = health[a] is None or health[b] is None or frozenset((a, b)) in broken
            sides = tuple(
                SideResult(False, 0.0, "peer lost") if down else SideResult(True, t)
                for t in (health[a] or 0.0, health[b] or 0.0)
            )
            outcomes.append(PairOutcome(phase, (a, b), (sides[0], sides[1])))
        return outcomes

    def solo(phase: int, nodes: Sequence[str]) -> dict[str, SideResult]:
        solo_calls.append((phase, tuple(nodes)))
        return {
            n: SideResult(False, 0.0, "crashed alone") if (t := health[n]) is None else SideResult(True, t)
            for n in nodes
        }

    return phases, probe, solo_calls, solo


def _run(
    health: Mapping[str, float | None], exclude: bool = False, broken_links: Sequence[Pair] = ()
) -> dict[str, CheckOutcome]:
    results = {}
    for me in health:
        _, probe, _, solo = _model(health, broken_links)
        results[me] = check_round(9, len(health), me, probe, exclude_stragglers=exclude, solo=solo)
    return results


@pytest.mark.parametrize(
    ("health", "exclude", "expected"),
    [
        ({"0": 0.01, "1": 0.01}, False, {"0": "train", "1": "train"}),
        ({"0": 0.01, "1": 0.01, "2": None}, False, {"0": "new_round", "1": "new_round", "2": "exclude_self"}),
        ({"0": None, "1": 0.01, "2": 0.01}, False, {"0": "exclude_self", "1": "new_round", "2": "new_round"}),
        (
            {"0": 0.01, "1": None, "2": 0.01, "3": 0.01},
            False,
            {"0": "new_round", "1": "exclude_self", "2": "new_round", "3": "new_round"},
        ),
        # Two nodes: the solo probes tell the bad node from the good one; only the bad one leaves.
        ({"0": 0.01, "1": None}, False, {"0": "new_round", "1": "exclude_self"}),
        ({"0": None, "1": 0.01}, False, {"0": "exclude_self", "1": "new_round"}),
        ({"0": None, "1": None}, False, {"0": "exclude_self", "1": "exclude_self"}),
        ({"0": 0.01, "1": 0.01, "2": 5.0}, False, {"0": "train", "1": "train", "2": "train"}),
        ({"0": 0.01, "1": 0.01, "2": 5.0}, True, {"0": "new_round", "1": "new_round", "2": "exclude_self"}),
    ],
)
def test_whole_checks_against_a_model(health: dict[str, float | None], exclude: bool, expected: dict[str, str]) -> None:
    assert {me: o.action.value for me, o in _run(health, exclude).items()} == expected


def test_a_healthy_round_is_probed_once_and_a_suspect_twice() -> None:
    phases, probe, solos, solo = _model({"0": 0.01, "1": 0.01, "2": 0.01})
    check_round(1, 3, "0", probe, solo=solo)
    assert (phases, solos) == ([1], [])
    phases, probe, solos, solo = _model({"0": 0.01, "1": 0.01, "2": None})
    check_round(1, 3, "0", probe, solo=solo)
    # Node 2 gets a new partner (1); node 0's only new pairing would repeat (0, 2): it is not
    # a suspect, so nobody probes alone.
    assert (phases, solos) == ([1, 2], [])


def test_two_nodes_never_repeat_their_pair_and_a_suspect_pair_probes_alone() -> None:
    phases, probe, solos, solo = _model({"0": 0.01, "1": None})
    check_round(1, 2, "0", probe, solo=solo)
    assert (phases, solos) == ([1], [(2, ("0", "1"))])


def test_a_failed_link_between_two_healthy_nodes_excludes_neither_and_warns() -> None:
    outcomes = _run({"0": 0.01, "1": 0.01}, broken_links=[("0", "1")])
    for outcome in outcomes.values():
        assert outcome.action is CheckAction.TRAIN
        assert outcome.verdict is not None
        assert outcome.verdict.faulty == ()
        assert len(outcome.warnings) == 2
        assert "passed alone" in outcome.reason
        assert "warning" in outcome.reason
    assert outcomes["0"].verdict == outcomes["1"].verdict


def test_without_solo_probes_two_nodes_keep_the_old_verdict() -> None:
    _, probe, _, _ = _model({"0": 0.01, "1": None})
    assert check_round(1, 2, "0", probe).action is CheckAction.EXCLUDE_SELF


def _outcomes(phase: int, pairs: Sequence[tuple[str, str, bool]]) -> list[PairOutcome]:
    bad = SideResult(False, 0.0, "peer lost")
    return [PairOutcome(phase, (a, b), (OK, OK) if ok else (bad, bad)) for a, b, ok in pairs]


@pytest.mark.parametrize(
    ("nodes", "round_one", "faulty", "pairs", "solos"),
    [
        # Two nodes: round two could only repeat the pair; both suspects probe alone.
        (["0", "1"], [("0", "1", False)], ["0", "1"], (), ("0", "1")),
        # Three nodes, node 0 dead: 1 and 2 meet anew; 0 (its only new pairing would repeat) alone.
        (["0", "1", "2"], [("0", "1", False), ("0", "2", False)], ["0", "1", "2"], (("1", "2"),), ("0",)),
        # Four nodes, node 1 dead: it gets a healthy new partner; nobody probes alone.
        (
            ["0", "1", "2", "3"],
            [("0", "1", False), ("2", "3", True)],
            ["0", "1"],
            (("2", "1"), ("3", "0")),
            (),
        ),
    ],
)
def test_the_second_phase_drops_repeated_pairs_and_sends_unpartnered_suspects_alone(
    nodes: list[str],
    round_one: list[tuple[str, str, bool]],
    faulty: list[str],
    pairs: tuple[Pair, ...],
    solos: tuple[str, ...],
) -> None:
    second = plan_second_phase(nodes, _outcomes(1, round_one), _verdict(faulty, nodes=nodes))
    assert (second.pairs, second.solos) == (pairs, solos)
    assert not {frozenset(p) for p in second.pairs} & {frozenset((a, b)) for a, b, _ in round_one}


BAD = SideResult(False, 0.0, "crashed alone")


@pytest.mark.parametrize(
    ("faulty", "solos", "still_faulty", "warned"),
    [
        (["0", "1"], {"0": OK, "1": BAD}, ("1",), ["0"]),
        (["0", "1"], {"0": BAD, "1": BAD}, ("0", "1"), []),
        (["0", "1"], {"0": OK, "1": OK}, (), ["0", "1"]),
        # A node that did well with a partner but fails alone is faulty all the same.
        ([], {"2": BAD}, ("2",), []),
    ],
)
def test_solo_probes_settle_the_blame(
    faulty: list[str], solos: dict[str, SideResult], still_faulty: tuple[str, ...], warned: list[str]
) -> None:
    verdict, warnings = with_solos(_verdict(faulty), solos)
    assert verdict.faulty == still_faulty
    assert [w.split()[2] for w in warnings] == warned
    for node in still_faulty:
        assert "alone failed" in verdict.reasons[node]
    for node in warned:
        assert node not in verdict.reasons
        assert verdict.best_time_s[node] == pytest.approx(0.01)


def test_every_key_of_a_round_lives_under_its_prefix() -> None:
    prefix = round_keys_prefix(7) + "/"
    for key in (side_key(7, 1, 0, "1"), store_key(7, 2, 1), solo_key(7, 2, "0"), settings_key(7)):
        assert key.startswith(prefix)
    assert len({side_key(7, 2, 0, "0"), solo_key(7, 2, "0"), settings_key(7)}) == 3


@given(st.integers(min_value=3, max_value=12), st.data())
def test_one_dead_node_among_three_or_more_is_the_only_one_left_out(n: int, data: st.DataObject) -> None:
    dead = data.draw(st.integers(min_value=0, max_value=n - 1))
    times = data.draw(st.lists(st.floats(0.01, 0.011), min_size=n, max_size=n))
    health: dict[str, float | None] = {str(i): (None if i == dead else times[i]) for i in range(n)}
    outcomes = _run(health)
    assert outcomes[str(dead)].action is CheckAction.EXCLUDE_SELF
    assert all(o.action is CheckAction.NEW_ROUND for me, o in outcomes.items() if me != str(dead))
    # Every node reached the same verdict.
    verdicts = [o.verdict for o in outcomes.values()]
    assert all(v == verdicts[0] for v in verdicts)


@given(st.integers(min_value=2, max_value=10), st.data())
def test_every_dead_node_is_left_out(n: int, data: st.DataObject) -> None:
    dead = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), max_size=n))
    health: dict[str, float | None] = {str(i): (None if i in dead else 0.01) for i in range(n)}
    outcomes = _run(health)
    assert all(outcomes[str(d)].action is CheckAction.EXCLUDE_SELF for d in dead)
    if not dead:
        assert all(o.action is CheckAction.TRAIN for o in outcomes.values())
