"""The goodput gauges, computed when they are scraped."""

from __future__ import annotations

import pytest

from dlrover.master.goodput import GoodputAccountant, GoodputBreakdown
from dlrover.master.metrics import MasterMetrics

pytestmark = pytest.mark.timeout(60)


def test_each_scrape_reads_the_breakdown_once_and_a_new_source_replaces_the_old() -> None:
    metrics = MasterMetrics("t")
    calls: list[str] = []

    def source(name: str, useful: float) -> GoodputBreakdown:
        calls.append(name)
        empty = GoodputAccountant().breakdown()
        return GoodputBreakdown(10.0, useful, dict(empty.buckets), -1)

    metrics.read_goodput_from(lambda: source("first", 4.0))
    text = metrics.render().decode()
    assert calls == ["first"]
    assert 'dlrover_goodput_ratio{job="t"} 0.4' in text
    assert 'dlrover_goodput_seconds{bucket="useful",job="t"} 4.0' in text
    assert 'dlrover_goodput_fraction{bucket="useful",job="t"} 0.4' in text
    metrics.read_goodput_from(lambda: source("second", 5.0))
    assert 'dlrover_goodput_ratio{job="t"} 0.5' in metrics.render().decode()
    assert calls == ["first", "second"]


def test_a_failing_breakdown_leaves_goodput_out_of_the_scrape_and_serves_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = MasterMetrics("t")

    def broken() -> GoodputBreakdown:
        raise ValueError("bad history")

    metrics.read_goodput_from(broken)
    metrics.heartbeat()
    text = metrics.render().decode()
    assert 'dlrover_heartbeats_total{job="t"} 1.0' in text
    assert "dlrover_goodput_ratio{" not in text
    assert "goodput left out of this scrape" in caplog.text


def test_restarts_are_counted_by_what_caused_them_and_every_kind_starts_at_zero() -> None:
    from dlrover.master.journal import JournaledEvent

    metrics = MasterMetrics("t")
    text = metrics.render().decode()
    for kind in ("process", "consequence", "planned", "node"):
        assert f'dlrover_restarts_total{{job="t",kind="{kind}"}} 0.0' in text
    kinds = ["failure", "process_restart", "consequence_restart", "consequence_restart", "planned_restart", "relaunch"]
    metrics.observe_events(
        JournaledEvent(seq, 0.0, kind, "", 0, 0, {"kind": "user_code"}) for seq, kind in enumerate(kinds)
    )
    text = metrics.render().decode()
    assert 'dlrover_restarts_total{job="t",kind="process"} 1.0' in text
    assert 'dlrover_restarts_total{job="t",kind="consequence"} 2.0' in text
    assert 'dlrover_restarts_total{job="t",kind="planned"} 1.0' in text
    assert 'dlrover_restarts_total{job="t",kind="node"} 1.0' in text
    assert 'dlrover_failures_total{job="t",kind="user_code"} 1.0' in text  # a consequence is no failure


def test_a_failure_that_waits_for_its_cause_counts_once_charged_and_not_at_all_when_excused() -> None:
    from dlrover.master.journal import JournaledEvent

    metrics = MasterMetrics("t")
    events = [
        ("failure", {"kind": "communication", "charge": "awaiting_cause"}),
        ("failure_excused", {"kind": "communication"}),
        ("failure", {"kind": "communication", "charge": "awaiting_cause"}),
        ("failure_charged", {"kind": "communication", "action": "restart_processes"}),
    ]
    metrics.observe_events(JournaledEvent(seq, 0.0, kind, "", 0, 0, data) for seq, (kind, data) in enumerate(events))
    assert 'dlrover_failures_total{job="t",kind="communication"} 1.0' in metrics.render().decode()
