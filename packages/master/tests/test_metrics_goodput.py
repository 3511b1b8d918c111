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
