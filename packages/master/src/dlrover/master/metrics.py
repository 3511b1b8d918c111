"""Prometheus metrics of one master, in its own `CollectorRegistry` (never the global one)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest, start_http_server
from prometheus_client.registry import Collector

from dlrover.common.refusals import REFUSAL_REASONS, Refusal
from dlrover.master.goodput import BUCKETS, GoodputBreakdown
from dlrover.master.journal import JournaledEvent
from dlrover.master.states import NodeState

__all__ = ["MasterMetrics", "MetricsEndpoint"]

_log = logging.getLogger(__name__)

# `dlrover_restarts_total{kind}` by the event that restarted something: a node's processes for a failure of
# its own, for a peer's failure that broke their round (a consequence, charged to nobody), for a planned
# round (a resize, a spare taking a rank), and a node relaunched. A dashboard of failures' restarts sums
# `process` and `node`; every interruption of training is the sum of all four.
_RESTART_KINDS = {
    "process_restart": "process",
    "consequence_restart": "consequence",
    "planned_restart": "planned",
    "relaunch": "node",
}


class MasterMetrics:
    """The master's metrics.

    Args:
        job_name: the `job` label on every metric.
    """

    def __init__(self, job_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._job = job_name
        r = self.registry
        self.nodes = Gauge("dlrover_nodes", "Node incarnations by state.", ["job", "state"], registry=r)
        self.restarts = Counter(
            "dlrover_restarts",
            "Process restarts (for the node's own failure, a peer's, or a planned round) and node relaunches.",
            ["job", "kind"],
            registry=r,
        )
        self.failures = Counter("dlrover_failures", "Node failures by kind.", ["job", "kind"], registry=r)
        self.step = Gauge("dlrover_training_step", "The job's newest training step.", ["job"], registry=r)
        self.steps_per_second = Gauge("dlrover_steps_per_second", "Training steps per second.", ["job"], registry=r)
        self.samples_per_second = Gauge(
            "dlrover_samples_per_second", "Training samples per second.", ["job"], registry=r
        )
        self._goodput: _GoodputCollector | None = None
        self.checkpoint_latency = Histogram(
            "dlrover_checkpoint_latency_seconds",
            "From the first rank reporting a step to every rank holding it.",
            ["job"],
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.heartbeats = Counter("dlrover_heartbeats", "Heartbeats received.", ["job"], registry=r)
        self.refused_calls = Counter(
            "dlrover_refused_calls",
            "Calls the master's server refused, by reason (see dlrover.common.refusals).",
            ["job", "reason"],
            registry=r,
        )
        for state in NodeState:
            self.nodes.labels(job_name, state.value).set(0)
        # Present at 0 from the start, so a dashboard's rate() sees the first one.
        for reason in REFUSAL_REASONS:
            self.refused_calls.labels(job_name, reason)
        for restart_kind in _RESTART_KINDS.values():
            self.restarts.labels(job_name, restart_kind)

    def set_node_counts(self, counts: Mapping[NodeState, int]) -> None:
        """Publish how many incarnations are in each state."""
        for state in NodeState:
            self.nodes.labels(self._job, state.value).set(counts.get(state, 0))

    def observe_events(self, events: Iterable[JournaledEvent]) -> None:
        """Count failures, restarts and relaunches from events."""
        for event in events:
            # A failure counts once charged: when reported, or when it waited for a cause in vain.
            charged = event.kind == "failure_charged" or (
                event.kind == "failure" and event.data.get("charge") != "awaiting_cause"
            )
            if charged:
                self.failures.labels(self._job, str(event.data.get("kind", "unknown"))).inc()
            elif event.kind in _RESTART_KINDS:
                self.restarts.labels(self._job, _RESTART_KINDS[event.kind]).inc()

    def observe_progress(self, step: int, steps_per_second: float) -> None:
        """Publish training progress."""
        self.step.labels(self._job).set(step)
        self.steps_per_second.labels(self._job).set(steps_per_second)

    def set_samples_per_second(self, rate: float) -> None:
        """Publish the job's samples per second (from the samples its workers report)."""
        self.samples_per_second.labels(self._job).set(rate)

    def observe_checkpoint_latency(self, seconds: float) -> None:
        """Record how long a step took to be held by every rank."""
        self.checkpoint_latency.labels(self._job).observe(seconds)

    def heartbeat(self) -> None:
        """Count one heartbeat."""
        self.heartbeats.labels(self._job).inc()

    def refused(self, refusal: Refusal) -> None:
        """Count one refused call (a `RefusalObserver` the master's server reports to)."""
        self.refused_calls.labels(self._job, refusal.reason).inc()

    def read_goodput_from(self, source: Callable[[], GoodputBreakdown]) -> None:
        """Publish goodput so far and the breakdown of the elapsed time (`dlrover_goodput_ratio`,
        `dlrover_elapsed_seconds`, `dlrover_goodput_seconds` and `dlrover_goodput_fraction` by
        bucket) from what `source` answers when the metrics are read. A later call replaces the source."""
        if self._goodput is None:
            self._goodput = _GoodputCollector(self._job, source)
            self.registry.register(self._goodput)
        else:
            self._goodput.source = source

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)


class _GoodputCollector(Collector):
    """The goodput gauges, computed when they are read: the breakdown walks the job's whole
    history (every attempt and failure), so computing it on every tick of the master made a long
    job's ticks grow with its age, while a scrape comes every few seconds at most."""

    def __init__(self, job: str, source: Callable[[], GoodputBreakdown]) -> None:
        self._job = job
        self.source = source

    def describe(self) -> Iterator[Metric]:
        """The families without samples (the registry asks once, at registration)."""
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        """The families with the breakdown now."""
        families = self._families()
        ratio, elapsed, seconds, fraction = families
        try:
            breakdown = self.source()
        except Exception:  # the other metrics are still served; the reason is in the master's log
            _log.exception("goodput left out of this scrape: its breakdown failed")
            return iter(())
        ratio.add_metric([self._job], breakdown.ratio)
        elapsed.add_metric([self._job], breakdown.elapsed_s)
        for bucket, spent in (("useful", breakdown.useful_s), *((b, breakdown.buckets[b]) for b in BUCKETS)):
            seconds.add_metric([self._job, bucket], spent)
            fraction.add_metric([self._job, bucket], spent / breakdown.elapsed_s if breakdown.elapsed_s > 0 else 0.0)
        return iter(families)

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("dlrover_goodput_ratio", "Useful training time over elapsed time.", labels=["job"]),
            GaugeMetricFamily("dlrover_elapsed_seconds", "Seconds since the job started.", labels=["job"]),
            GaugeMetricFamily(
                "dlrover_goodput_seconds",
                "Elapsed seconds by bucket: useful (kept steps) and where the rest went.",
                labels=["job", "bucket"],
            ),
            GaugeMetricFamily(
                "dlrover_goodput_fraction", "Each bucket's share of the elapsed time.", labels=["job", "bucket"]
            ),
        ]


class MetricsEndpoint:
    """An HTTP `/metrics` endpoint for one registry.

    Args:
        registry: what to serve.
        bind_address: interface to listen on.
        port: TCP port, 0 for any free port.
    """

    def __init__(self, registry: CollectorRegistry, bind_address: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, addr=bind_address, registry=registry)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
