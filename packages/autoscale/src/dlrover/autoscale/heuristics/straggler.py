"""Persistent stragglers: a worker much slower than its peers for a long time is replaced on another machine."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import attrs

from dlrover.autoscale._validate import fraction, positive_int, positive_number
from dlrover.autoscale.heuristics._series import as_series, validate_series, window
from dlrover.autoscale.plan import LaunchRequest, NodeState, ScalePlan
from dlrover.autoscale.resources import Role
from dlrover.common import ConfigError

__all__ = ["StragglerConfig", "WorkerSpeedSeries", "plan_stragglers"]


@attrs.frozen
class StragglerConfig:
    """What a persistent straggler is.

    Args:
        slow_ratio: a worker is slow while its speed is below this fraction of the median worker's.
        persist_s: it must stay slow this long.
        min_peers: the fewest workers with a full window for a median to mean anything.
        max_replacements: the most workers replaced by one plan, so a bad median cannot replace half the job.
    """

    slow_ratio: float = attrs.field(default=0.7, validator=fraction)
    persist_s: float = attrs.field(default=600.0, validator=positive_number)
    min_peers: int = attrs.field(default=3, validator=positive_int)
    max_replacements: int = attrs.field(default=1, validator=positive_int)


@attrs.frozen
class WorkerSpeedSeries:
    """A worker's training speed (steps or samples per second) over time.

    Raises:
        ConfigError: if `node` is not a worker.
        InvalidMetricError: if a sample is NaN or negative.
    """

    node: NodeState
    samples: tuple[tuple[float, float], ...] = attrs.field(converter=as_series)

    def __attrs_post_init__(self) -> None:
        if self.node.role != Role.WORKER:
            raise ConfigError(f"WorkerSpeedSeries needs a worker, got {self.node.role.value} {self.node.node_id}")
        object.__setattr__(self, "samples", validate_series(f"worker {self.node.node_id} speed", self.samples))


def plan_stragglers(now_s: float, series: Sequence[WorkerSpeedSeries], config: StragglerConfig) -> ScalePlan:
    """Replace workers that stayed below `slow_ratio` of the median speed for `persist_s`.

    The median is of each worker's mean speed over the window; a worker is a straggler when every one of its
    samples in the window is below the threshold, so one slow burst is not enough.

    Returns:
        Removal of the slowest stragglers and as many launches of the same size, or an empty plan with the reason.
    """
    windows = {}
    for s in series:
        values = window(s.samples, now_s, config.persist_s)
        if values is not None:
            windows[s.node.node_id] = (s.node, values)
    if len(windows) < config.min_peers:
        return ScalePlan.empty(
            f"only {len(windows)} worker(s) have {config.persist_s:g}s of speed samples; "
            f"min_peers={config.min_peers} are needed to judge stragglers"
        )
    median = statistics.median(statistics.fmean(v) for _n, v in windows.values())
    threshold = config.slow_ratio * median
    slow = sorted(
        ((statistics.fmean(v), node) for node, v in windows.values() if max(v) < threshold),
        key=lambda x: (x[0], x[1].node_id),
    )
    if not slow:
        return ScalePlan.empty(
            f"no worker stayed below {config.slow_ratio:.0%} of the median speed {median:.4g} for {config.persist_s:g}s"
        )
    chosen = slow[: config.max_replacements]
    reason = "; ".join(
        f"worker {node.node_id} ran at {speed:.4g} < {config.slow_ratio:.0%} of median {median:.4g} "
        f"for {config.persist_s:g}s: replacing it"
        for speed, node in chosen
    )
    if len(slow) > len(chosen):
        reason += (
            f"; {len(slow) - len(chosen)} more straggler(s) left for later (max_replacements={config.max_replacements})"
        )
    launches = [LaunchRequest(Role.WORKER, 1, node.resources) for _s, node in chosen]
    return ScalePlan(launch=launches, remove=[node.node_id for _s, node in chosen], reason=reason)
