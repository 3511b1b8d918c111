"""When the network check is skipped: the same nodes, all having passed it together (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dlrover.launcher.netcheck_members import MemberReport, may_skip, member_key, membership_digest
from dlrover.launcher.netcheck_plan import SideResult, round_keys_prefix

AB = membership_digest(["node-a", "node-b"])


def test_the_same_nodes_all_having_passed_together_skip() -> None:
    assert may_skip([MemberReport("node-a", AB), MemberReport("node-b", AB)]) == AB
    assert may_skip([MemberReport("node-b", AB), MemberReport("node-a", AB)]) == AB  # node ranks swapped


def test_anything_else_checks() -> None:
    cases = [
        [MemberReport("node-a", AB), MemberReport("node-b", "")],  # node-b's agent restarted: no pass
        [MemberReport("node-a", AB), MemberReport("node-c", AB)],  # node-c replaced node-b
        [MemberReport("node-a", AB), MemberReport("node-b", AB), MemberReport("node-c", AB)],  # one joined
        [MemberReport("node-a", AB)],  # one left
        [MemberReport("node-a", AB), None],  # a report is missing
        [MemberReport("node-a", AB), MemberReport("node-a", AB)],  # one id twice
        [],
    ]
    for reports in cases:
        assert may_skip(reports) is None, reports


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True), st.randoms())
def test_the_digest_names_a_set_not_an_order(ids: list[str], rnd: object) -> None:
    shuffled = list(ids)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert membership_digest(shuffled) == membership_digest(ids)
    if len(ids) > 1:
        assert membership_digest(ids[1:]) != membership_digest(ids)


def test_reports_round_trip_and_anything_else_decodes_to_none() -> None:
    report = MemberReport("node-a", AB)
    assert MemberReport.decode(report.encode()) == report
    for raw in (
        SideResult.missing(10.0).encode(),  # the marker written for a node that never reported
        b"\xff",
        b"[]",
        b'{"node_id": "", "passed": ""}',
        b'{"node_id": "a", "passed": 3}',
        b'{"node_id": "a", "passed": "", "extra": 1}',
    ):
        assert MemberReport.decode(raw) is None, raw


def test_member_keys_live_with_the_rounds_other_check_keys() -> None:
    assert member_key(7, "1").startswith(round_keys_prefix(7) + "/")
